#!/usr/bin/python3
"""brigade's reducer side by side with PyTorch DistributedDataParallel.

Runs bench/reducer_overlap (brigade) and then a PyTorch model with the same
parameter shapes under DDP (CPU, Gloo), whose backward spends the same time
per layer (a custom autograd function that sleeps or spins, then returns the
layer's gradients), with the same bucket cap and the same gradient-as-view
setting. Both sides report the median step time of the slowest rank, their
own compute-only step and the comm-only time of one allreduce of all
gradients.

Needs Debian's python3-torch (run it with /usr/bin/python3) and a built
reducer_overlap (meson compile -C build; pass --bench if it is elsewhere).

    /usr/bin/python3 bench/ddp_compare.py --bench build/bench/reducer_overlap --model resnet50
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bench/reducer_overlap", help="the reducer_overlap binary")
    ap.add_argument("-m", "--model", default="resnet50", help="resnet50, gpt2, or a sizes file")
    ap.add_argument("-n", "--ranks", type=int, default=2)
    ap.add_argument("-c", "--compute", choices=["sleep", "spin"], default="sleep")
    ap.add_argument("-t", "--compute-ms", default="auto",
                    help="backward compute per step; auto: brigade's measured comm-only time")
    ap.add_argument("-l", "--layer-time", choices=["uniform", "params"], default=None,
                    help="default: uniform for resnet50, params otherwise (as reducer_overlap)")
    ap.add_argument("-b", "--bucket-cap", type=float, default=25.0, help="MiB (DDP's bucket_cap_mb)")
    ap.add_argument("-v", "--view", type=int, choices=[0, 1], default=1,
                    help="gradients as bucket views (DDP's gradient_as_bucket_view)")
    ap.add_argument("-i", "--iters", type=int, default=10)
    ap.add_argument("-w", "--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    return ap.parse_args()


def load_layers(args):
    """[(layer name, [shape, ...])] in forward order, from reducer_overlap --dump-model."""
    out = subprocess.run([args.bench, "-m", args.model, "--dump-model"], check=True,
                         capture_output=True, text=True).stdout
    layers = []
    for line in out.splitlines():
        line = line.split("#", 1)[0].split()
        if line:
            layers.append((line[0], [tuple(int(d) for d in s.split("x")) for s in line[1:]]))
    return layers


def run_brigade(args, layer_time):
    cmd = [args.bench, "-n", str(args.ranks), "-m", args.model, "-c", args.compute,
           "-t", str(args.compute_ms), "-l", layer_time, "-b", str(args.bucket_cap),
           "-v", str(args.view), "-g", "-i", str(args.iters), "-w", str(args.warmup), "--json"]
    print("# " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    sys.stdout.write("".join("#   " + l + "\n" for l in out.splitlines() if not l.startswith("{")))
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


# ---- the PyTorch side ---------------------------------------------------------


def ddp_worker(rank, nranks, port, layers, layer_s, spin, bucket_cap, view, iters, warmup, queue):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=nranks)

    def compute(seconds):
        if seconds <= 0:
            return
        if spin:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(seconds)

    class Layer(torch.autograd.Function):
        """Forward passes the activation through; backward spends the layer's
        time, then hands autograd the layer's gradients."""

        @staticmethod
        def forward(ctx, x, index, *params):
            ctx.index = index
            return x.clone()

        @staticmethod
        def backward(ctx, gx):
            compute(layer_s[ctx.index])
            return (gx, None) + grads[ctx.index]

    class Synthetic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer_params = torch.nn.ModuleList()
            for _, shapes in layers:
                m = torch.nn.Module()
                m.p = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])
                self.layer_params.append(m)

        def forward(self, x):
            for i, m in enumerate(self.layer_params):
                x = Layer.apply(x, i, *m.p)
            return x

    model = Synthetic()
    # The gradients each layer returns: allocated and touched once.
    grads = [tuple(torch.full(s, 1e-3) for s in shapes) for _, shapes in layers]
    x = torch.ones(1, requires_grad=True)

    def timed(step_fn):
        t = []
        for i in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            step_fn()
            if i >= warmup:
                t.append(time.perf_counter() - t0)
        t = torch.tensor(t, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return statistics.median(t.tolist())

    def plain_step():
        model(x).sum().backward()

    compute_only = timed(plain_step)
    model.zero_grad(set_to_none=True)

    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    comm_only = timed(lambda: dist.all_reduce(flat))

    ddp = DDP(model, bucket_cap_mb=bucket_cap, gradient_as_bucket_view=bool(view), broadcast_buffers=False)

    def ddp_step():
        ddp(x).sum().backward()

    ddp_ms = timed(ddp_step)
    if rank == 0:
        queue.put({"compute_only_ms": compute_only * 1e3, "comm_only_ms": comm_only * 1e3,
                   "ddp_ms": ddp_ms * 1e3})
    dist.destroy_process_group()


def run_ddp(args, layers, layer_s):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=ddp_worker,
                         args=(r, args.ranks, port, layers, layer_s, args.compute == "spin",
                               args.bucket_cap, args.view, args.iters, args.warmup, queue))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    # A rank that dies leaves the others blocked in Gloo: stop them too.
    failed = None
    while any(p.is_alive() for p in procs):
        for r, p in enumerate(procs):
            p.join(timeout=0.2)
            if p.exitcode not in (None, 0) and failed is None:
                failed = (r, p.exitcode)
                for q in procs:
                    if q.is_alive():
                        q.terminate()
    for p in procs:
        p.join()
    if failed is None:
        failed = next(((r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0), None)
    if failed is not None:
        r, code = failed
        why = f"signal {-code}" if code < 0 else f"exit status {code}"
        sys.exit(f"ddp_compare: PyTorch rank {r} failed ({why})")
    return queue.get()


def main():
    args = parse_args()
    layers = load_layers(args)
    layer_time = args.layer_time or ("uniform" if args.model == "resnet50" else "params")
    nparams = sum(1 for _, shapes in layers for _ in shapes)
    print(f"# ddp_compare: model {args.model}, {nparams} tensors in {len(layers)} layers, "
          f"{args.ranks} ranks, {args.compute} compute ({layer_time} over layers), "
          f"bucket cap {args.bucket_cap:g} MiB, gradient views {'on' if args.view else 'off'}", flush=True)

    brg = run_brigade(args, layer_time)
    total_s = brg["compute_ms"] * 1e-3
    counts = []
    for _, shapes in layers:
        c = 0
        for s in shapes:
            n = 1
            for d in s:
                n *= d
            c += n
        counts.append(c)
    if layer_time == "uniform":
        layer_s = [total_s / len(layers)] * len(layers)
    else:
        layer_s = [total_s * c / sum(counts) for c in counts]

    import torch
    print(f"# PyTorch {torch.__version__} DDP, Gloo, same layer times ({brg['compute_ms']:.1f} ms per step), "
          f"median of {args.iters} steps after {args.warmup} warmup", flush=True)
    ddp = run_ddp(args, layers, layer_s)

    rows = [("brigade reducer", brg["compute_only_ms"], brg["comm_only_ms"], brg["reducer_ms"]),
            ("PyTorch DDP (gloo)", ddp["compute_only_ms"], ddp["comm_only_ms"], ddp["ddp_ms"])]
    print("#")
    print(f"#  {'':22} {'compute only':>13} {'comm only':>10} {'step':>9} {'exposed comm':>13}   (ms)")
    for name, comp, comm, stp in rows:
        print(f"   {name:22} {comp:13.2f} {comm:10.2f} {stp:9.2f} {max(stp - comp, 0):13.2f}")
    ratio = brg["reducer_ms"] / ddp["ddp_ms"]
    print(f"#\n# brigade step / DDP step: {ratio:.3f}")
    if args.json:
        print(json.dumps({"model": args.model, "ranks": args.ranks, "brigade": brg, "ddp": ddp,
                          "ratio": ratio}))


if __name__ == "__main__":
    main()
