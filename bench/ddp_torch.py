#!/usr/bin/python3
"""Real PyTorch DDP with backend "brigade" against "gloo" and against no
communication at all, in the same run.

Each rank (a spawned process) builds one Gloo process group and one brigade
group (brigade's unique id goes through c10d's store), then trains three
copies of the same model from the same weights on the same batches: one
under DDP over brigade, one under DDP over Gloo, and one under DDP over Gloo
with a communication hook that runs no collective ("none": the hook divides
the bucket by the number of ranks, as DDP does before its allreduce, and
returns it in a completed future), so that its step is the DDP step with the
communication removed and nothing else: the same buckets, the same reducer,
the same hook call per bucket. The exposed communication of a backend is
its step time minus that of "none".

A run is --rounds rounds; in each, the backends take turns on that round's
batches: step by step (--order step, the default: brigade, gloo, none, the
order rotated each step, so that all three see the same machine load) or
each running all its warm-up and timed steps in turn (--order block).
Per round and backend it takes the median step time of the slowest rank
(the max over ranks of each step), and as the exposed communication the
median over the steps of the step minus the no-communication step on the
same batch (next to it in time with --order step, so a change of machine
load between steps cancels); it prints each round and the median and
spread (min to max) over rounds of the step, of the exposed communication
and of the ratio brigade / gloo of exposed communication. It also reports
how far the brigade and Gloo copies drifted apart (bitwise equal at 2
ranks, where every sum has two terms), and the largest relative difference
of the first step's averaged gradients. At more ranks the two libraries add
in different orders: the gradients then differ in the last bits (about
1e-7 relative), and training with large gradients (ResNets on random data,
BatchNorm over 2 images) can amplify that into visible parameter
differences within a few steps, as any change of summation order would.

Models: ResNet-18 and ResNet-50 (torchvision's when it is installed, else
the same layer shapes defined here), or a small CNN. CPU only; needs
Debian's python3-torch (run with /usr/bin/python3) and the brigade package
(pip install ., or PYTHONPATH=python BRIGADE_LIBRARY=build/libbrigade.so).

    /usr/bin/python3 bench/ddp_torch.py -m resnet18 -n 2 -r 3 -i 6 -w 2
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="resnet18", choices=["resnet18", "resnet50", "cnn"])
    ap.add_argument("-n", "--ranks", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=3,
                    help="rounds; in each, the backends take turns")
    ap.add_argument("--order", choices=["step", "block"], default="step",
                    help="step: in each round the backends take turns step by step (so they "
                         "see the same machine load); block: each runs all its steps in turn")
    ap.add_argument("-i", "--iters", type=int, default=10, help="timed steps per backend and round")
    ap.add_argument("-w", "--warmup", type=int, default=2,
                    help="untimed steps per backend and round, before the timed ones")
    ap.add_argument("-b", "--batch", type=int, default=8, help="images per rank per step")
    ap.add_argument("--image", type=int, default=32, help="image side (pixels)")
    ap.add_argument("--bucket-cap", type=float, default=25.0, help="MiB (DDP's bucket_cap_mb)")
    ap.add_argument("--grad-as-view", action="store_true",
                    help="DDP's gradient_as_bucket_view=True for both backends (no copy of "
                         "the gradients into and out of the buckets)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads per rank; 0: cores / ranks, at least 1")
    return ap.parse_args(argv)


# ------------------------------------------------------- models (shapes as torchvision's)
class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin, c, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.down = None
        if stride != 1 or cin != c:
            self.down = nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False),
                                      nn.BatchNorm2d(c))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, c, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, c, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.c3 = nn.Conv2d(c, c * 4, 1, bias=False)
        self.b3 = nn.BatchNorm2d(c * 4)
        self.down = None
        if stride != 1 or cin != c * 4:
            self.down = nn.Sequential(nn.Conv2d(cin, c * 4, 1, stride, bias=False),
                                      nn.BatchNorm2d(c * 4))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet(block, layers, classes=1000):
    mods = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (c, n) in enumerate(zip((64, 128, 256, 512), layers)):
        for k in range(n):
            mods.append(block(cin, c, 2 if (k == 0 and i > 0) else 1))
            cin = c * block.expansion
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*mods)


def make_model(name):
    try:
        import torchvision.models as tvm

        if name in ("resnet18", "resnet50"):
            return getattr(tvm, name)(), "torchvision"
    except ImportError:
        pass
    if name == "resnet18":
        return resnet(Basic, (2, 2, 2, 2)), "shapes of torchvision's"
    if name == "resnet50":
        return resnet(Bottleneck, (3, 4, 6, 3)), "shapes of torchvision's"
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                         nn.Flatten(), nn.Linear(512, 10)), "small CNN"


# ------------------------------------------------------------------------- a rank
BACKENDS = ("brigade", "gloo", "none")


def no_comm_hook(nranks, bucket):
    """DDP's step with the communication removed: what DDP does to a bucket
    before its allreduce (divide by the number of ranks), then no collective."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer().div_(nranks))
    return fut


def rank_main(rank, args, port, results):
    import brigade.torch  # noqa: F401  (registers "brigade")

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.ranks)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    bpg = dist.new_group(backend="brigade")
    torch.manual_seed(0)
    ref, how = make_model(args.model)
    models = {"gloo": ref}
    for k in ("brigade", "none"):
        models[k], _ = make_model(args.model)
        models[k].load_state_dict(ref.state_dict())
    nparams = sum(p.numel() for p in ref.parameters())
    ddp = {k: nn.parallel.DistributedDataParallel(models[k], process_group=bpg if k == "brigade" else None,
                                                  bucket_cap_mb=args.bucket_cap,
                                                  broadcast_buffers=False,
                                                  gradient_as_bucket_view=args.grad_as_view)
           for k in BACKENDS}
    ddp["none"].register_comm_hook(args.ranks, no_comm_hook)
    opt = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in ddp.items()}
    gen = torch.Generator().manual_seed(1000 + rank)
    classes = 10 if args.model == "cnn" else 1000
    first_grads = {}
    med = {k: [] for k in BACKENDS}  # per round: median step of the slowest rank
    paired = {"brigade": [], "gloo": []}  # per round: median of step - no-comm step
    for rnd in range(args.rounds):
        # this round's batches, the same for every backend
        batches = [(torch.randn(args.batch, 3, args.image, args.image, generator=gen),
                    torch.randint(0, classes, (args.batch,), generator=gen))
                   for _ in range(args.warmup + args.iters)]
        times = {k: [] for k in BACKENDS}

        def one_step(k, step, x, y):
            dist.barrier()
            t0 = time.perf_counter()
            opt[k].zero_grad()
            nn.functional.cross_entropy(ddp[k](x), y).backward()
            opt[k].step()
            if step >= args.warmup:
                times[k].append(time.perf_counter() - t0)
            if rnd == 0 and step == 0:  # averaged gradients before any drift
                first_grads[k] = [p.grad.clone() for p in models[k].parameters()]

        if args.order == "block":
            for k in BACKENDS:
                for step, (x, y) in enumerate(batches):
                    one_step(k, step, x, y)
        else:  # step by step, the order rotated so that each backend takes each place
            for step, (x, y) in enumerate(batches):
                for j in range(len(BACKENDS)):
                    one_step(BACKENDS[(step + j) % len(BACKENDS)], step, x, y)
        slowest = {}
        for k in BACKENDS:
            t = torch.tensor(times[k], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            slowest[k] = t.tolist()
            med[k].append(statistics.median(slowest[k]))
        # exposed communication: each step against the no-comm step on the
        # same batch (taken next to it with --order step), then the median
        for k in ("brigade", "gloo"):
            paired[k].append(statistics.median(a - b for a, b in zip(slowest[k], slowest["none"])))
    grad_rel = max(((a - b).abs().max() / (a.abs().max() + 1e-30)).item()
                   for a, b in zip(first_grads["gloo"], first_grads["brigade"]))
    pairs = list(zip(models["gloo"].parameters(), models["brigade"].parameters()))
    diff = max((a - b).abs().max().item() for a, b in pairs)
    biggest = max(p.abs().max().item() for p in ref.parameters())
    equal = all(torch.equal(a, b) for a, b in pairs)
    if rank == 0:
        results.put({"model": args.model, "how": how, "params": nparams, "threads": threads,
                     "ms": {k: [v * 1e3 for v in med[k]] for k in BACKENDS},
                     "exposed": {k: [v * 1e3 for v in paired[k]] for k in paired},
                     "equal": equal, "maxdiff": diff, "biggest": biggest,
                     "grad_rel": grad_rel})
    dist.barrier()
    if rank == 0:
        results.close()
        results.join_thread()
    # Skip the interpreter's teardown: torch 1.13 can deadlock there (the
    # main thread, holding the GIL, joins a Gloo worker that waits for the
    # GIL to free a tensor).
    sys.stdout.flush()
    os._exit(0)


def spread(v):
    return f"{statistics.median(v):8.2f} [{min(v):7.2f} .. {max(v):7.2f}]"


def main(argv=None):
    args = parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(rank_main, args=(args, port, results), nprocs=args.ranks,
                       start_method="spawn")
    r = results.get(timeout=5)
    ms = r["ms"]
    exposed = r["exposed"]
    ratio = [b / g if g > 0 else float("inf") for b, g in zip(exposed["brigade"], exposed["gloo"])]
    print(f"# DDP {r['model']} ({r['how']}, {r['params'] / 1e6:.2f} M parameters), "
          f"N = {args.ranks}, batch {args.batch} x {args.image}x{args.image}, "
          f"{r['threads']} torch thread(s) per rank, bucket cap {args.bucket_cap:g} MiB, "
          f"{args.rounds} rounds of {args.iters} steps after {args.warmup} per backend, "
          f"taking turns by {args.order}"
          + (", gradient_as_bucket_view" if args.grad_as_view else ""))
    print("# step (ms, median of the slowest rank) per round: brigade / gloo / none; "
          "exposed: median over steps of step - none on the same batch")
    for i in range(args.rounds):
        print(f"   round {i + 1}: {ms['brigade'][i]:8.2f} / {ms['gloo'][i]:8.2f} / {ms['none'][i]:8.2f}"
              f"   exposed {exposed['brigade'][i]:7.2f} / {exposed['gloo'][i]:7.2f}"
              f"   brigade/gloo {ratio[i]:.3f}")
    print("# median [min .. max] over rounds (ms)")
    print(f"   step, brigade             {spread(ms['brigade'])}")
    print(f"   step, gloo                {spread(ms['gloo'])}")
    print(f"   step, none (no comm)      {spread(ms['none'])}")
    print(f"   exposed comm, brigade     {spread(exposed['brigade'])}")
    print(f"   exposed comm, gloo        {spread(exposed['gloo'])}")
    print(f"   exposed brigade / gloo    {statistics.median(ratio):8.3f} "
          f"[{min(ratio):7.3f} .. {max(ratio):7.3f}]   (per round)")
    mg = statistics.median(exposed["gloo"])
    print(f"   ratio of the medians      {statistics.median(exposed['brigade']) / mg if mg > 0 else float('inf'):8.3f}")
    print(f"# first step's gradients, brigade against gloo: max relative difference {r['grad_rel']:.3g}")
    print("# parameters after the run: "
          + ("bitwise equal" if r["equal"] else f"max |difference| {r['maxdiff']:.3g} "
             f"(largest |parameter| {r['biggest']:.3g})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
