"""brigade.torch: the torch.distributed backend "brigade" and the DDP hook.

DDP on a small CNN for 20 steps with backend "brigade" against "gloo" on the
same data and the same initial weights, at 2 and 3 ranks. At 2 ranks the
parameters must be bitwise equal: each gradient element is the sum of two
numbers, and floating-point addition is commutative, so the order in which
the two libraries add cannot matter. At 3 ranks brigade's ring adds
(a + b) + c in an order that depends on the chunk, Gloo in its own, and the
results may differ in the last bit of a gradient each step; after 20 SGD
steps the parameters must agree to 1e-5 relative (plus 1e-6 absolute),
far below what a wrong reduction would give (a single missing rank's
gradient changes them by ~1e-2).
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import ranks  # noqa: E402
import brigade  # noqa: E402
from brigade import _capi  # noqa: E402

HAVE_P2P = all(_capi.has(n) for n in _capi.OPTIONAL)

STEPS = 20


def small_cnn():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def train(model, pg, rank, steps=STEPS, hook_state=None, hook=None):
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg,
                                                    bucket_cap_mb=0.05)
    if hook is not None:
        ddp.register_comm_hook(hook_state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(steps):
        x = torch.randn(8, 3, 16, 16, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def compare(a, b, n, what):
    worst = 0.0
    for i, (p, q) in enumerate(zip(a, b)):
        if n == 2:
            assert torch.equal(p, q), f"{what}: parameter {i} differs (max " \
                f"{(p - q).abs().max().item():.3g}); expected bitwise equality at 2 ranks"
        else:
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), \
                f"{what}: parameter {i} differs by {(p - q).abs().max().item():.3g}"
            worst = max(worst, (p - q).abs().max().item())
    return worst


def same_on_every_rank(params, pg):
    flat = torch.cat([p.reshape(-1) for p in params])
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(out, flat, group=pg)
    for r, o in enumerate(out):
        assert torch.equal(o, flat), f"rank {r}'s replica differs from this rank's"


def body_ddp(rank, n):
    import brigade.torch  # noqa: F401  (registers "brigade")

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    bpg = dist.new_group(backend="brigade")
    torch.manual_seed(0)
    init = small_cnn().state_dict()
    ref, ours = small_cnn(), small_cnn()
    ref.load_state_dict(init)
    ours.load_state_dict(init)
    p_gloo = train(ref, None, rank)
    p_brg = train(ours, bpg, rank)
    same_on_every_rank(p_brg, bpg)
    compare(p_gloo, p_brg, n, "DDP brigade vs gloo")
    dist.destroy_process_group()


def body_hook(rank, n, via_env):
    import brigade
    import brigade.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    # As under mp.spawn: c10d's store holds MASTER_PORT, BRIGADE_PORT moves
    # brigade's rendezvous aside; the other way, brigade.torch.communicator(),
    # takes no port at all.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n))
    comm = brigade.Communicator.from_env() if via_env else brigade.torch.communicator()
    torch.manual_seed(0)
    init = small_cnn().state_dict()
    ref, ours = small_cnn(), small_cnn()
    ref.load_state_dict(init)
    ours.load_state_dict(init)
    p_gloo = train(ref, None, rank, steps=10)
    p_hook = train(ours, None, rank, steps=10, hook_state=comm,
                   hook=brigade.torch.allreduce_hook)
    compare(p_gloo, p_hook, n, "DDP gloo + brigade hook vs gloo")
    if via_env:
        comm.close()
    dist.destroy_process_group()


def body_backend_calls(rank, n):
    """init_process_group("brigade") and each torch.distributed call."""
    import brigade.torch

    dist.init_process_group("brigade", rank=rank, world_size=n)
    assert dist.get_backend() == "brigade"
    comm = brigade.torch.communicator()
    assert (comm.rank, comm.size) == (rank, n)
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.uint8, torch.int8):
        base = torch.arange(1, 12, dtype=torch.int64)
        t = (base + rank).to(dt)
        dist.all_reduce(t)
        want = sum(base + r for r in range(n)).to(dt)
        assert torch.equal(t, want), (dt, t, want)
        t = (base + rank).to(dt)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert torch.equal(t, (base + n - 1).to(dt))
        outs = [torch.zeros(11, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, (base + rank).to(dt))
        for r in range(n):
            assert torch.equal(outs[r], (base + r).to(dt))
        ins = [(base + rank * 100 + k).to(torch.float64).to(dt) for k in range(n)]
        out = torch.zeros(11, dtype=dt)
        dist.reduce_scatter(out, ins)
        want = sum((base + r * 100 + rank).to(torch.float64) for r in range(n)).to(dt)
        assert torch.equal(out, want), (dt, out, want)
        for root in range(n):
            t = (base + rank).to(dt)
            dist.broadcast(t, src=root)
            assert torch.equal(t, (base + root).to(dt))
            t = (base + rank).to(dt)
            dist.reduce(t, dst=root)
            if rank == root:
                assert torch.equal(t, sum(base + r for r in range(n)).to(dt))
    flat_in = torch.full((5,), float(rank))
    flat_out = torch.empty(5 * n)
    dist.all_gather_into_tensor(flat_out, flat_in) if hasattr(dist, "all_gather_into_tensor") \
        else dist._all_gather_base(flat_out, flat_in)
    assert torch.equal(flat_out, torch.arange(n).repeat_interleave(5).float())
    work = dist.all_reduce(torch.ones(3), async_op=True)
    work.wait()
    dist.barrier()
    dist.barrier()
    dist.destroy_process_group()


INT_DTYPES = (torch.uint8, torch.int8, torch.int32, torch.int64)


def body_gloo_ops(rank, n):
    """What Gloo has beyond the basics, each against Gloo on the same ranks
    and against a reference computed here: gather, scatter, their object
    forms, all_reduce_coalesced, BAND/BOR/BXOR on every integer dtype, and
    non-contiguous tensors for every call that takes a tensor."""
    import brigade.torch  # noqa: F401

    dist.init_process_group("brigade", rank=rank, world_size=n)
    gloo = dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(7)
    # Every rank draws every rank's inputs from one seed: the reference is local.
    vals = [torch.randint(-2**31, 2**31, (37,), generator=gen, dtype=torch.int64)
            for _ in range(n)]

    def both(fn):
        """fn(group) on brigade's group and on Gloo's; both results."""
        return fn(None), fn(gloo)

    # Bitwise ops: every integer dtype, allreduce and reduce.
    for dt in INT_DTYPES:
        for name, f in (("BAND", lambda a, b: a & b), ("BOR", lambda a, b: a | b),
                        ("BXOR", lambda a, b: a ^ b)):
            op = getattr(dist.ReduceOp, name)
            want = vals[0].to(dt)
            for r in range(1, n):
                want = f(want, vals[r].to(dt))

            def ar(g, op=op, dt=dt):
                t = vals[rank].to(dt).clone()  # .to() of the same dtype is no copy
                dist.all_reduce(t, op=op, group=g)
                return t
            got, ref = both(ar)
            assert torch.equal(got, want) and torch.equal(ref, want), (dt, name, got, want)
            root = (INT_DTYPES.index(dt) + 1) % n
            t = vals[rank].to(dt).clone()
            dist.reduce(t, dst=root, op=op)
            if rank == root:
                assert torch.equal(t, want), (dt, name, "reduce")
    for name in ("BAND", "BXOR"):
        try:
            dist.all_reduce(torch.ones(3), op=getattr(dist.ReduceOp, name))
        except brigade.Error as e:
            assert name.lower() in str(e) and "float32" in str(e), str(e)
        else:
            raise AssertionError(f"{name} on float32 was accepted")
    if hasattr(dist, "_make_nccl_premul_sum"):
        try:
            dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0))
        except (NotImplementedError, RuntimeError, ValueError) as e:
            assert "PREMUL_SUM" in str(e) and "object at" not in str(e), str(e)

    # gather and scatter: odd sizes, every root, a float and an integer dtype.
    for dt in (torch.float64, torch.int32):
        for root in range(n):
            mine = (vals[rank][:13] % 1000).to(dt)

            def ga(g, root=root, mine=mine):
                outs = [torch.full((13,), -1, dtype=dt) for _ in range(n)] \
                    if rank == root else None
                dist.gather(mine, outs, dst=root, group=g)
                return outs
            got, ref = both(ga)
            if rank == root:
                for r in range(n):
                    want = (vals[r][:13] % 1000).to(dt)
                    assert torch.equal(got[r], want) and torch.equal(ref[r], want), (root, r)

            def sc(g, root=root):
                ins = [(vals[r][:11] % 1000 + 7 * root).to(dt) for r in range(n)] \
                    if rank == root else None
                out = torch.full((11,), -1, dtype=dt)
                dist.scatter(out, ins, src=root, group=g)
                return out
            got, ref = both(sc)
            want = (vals[rank][:11] % 1000 + 7 * root).to(dt)
            assert torch.equal(got, want) and torch.equal(ref, want), (root, got, want)
    objs = [{"rank": r, "pad": "x" * (r * 5 + 1)} for r in range(n)]
    box = [None] * n if rank == 1 % n else None
    dist.gather_object(objs[rank], box, dst=1 % n)
    if rank == 1 % n:
        assert box == objs, box
    got = [None]
    dist.scatter_object_list(got, objs if rank == 0 else None, src=0)
    assert got[0] == objs[rank], got

    # all_reduce_coalesced (one dtype, as Gloo's).
    if hasattr(dist, "all_reduce_coalesced"):
        def arc(g):
            ts = [vals[rank][:k].double() for k in (1, 5, 17)]
            dist.all_reduce_coalesced(ts, group=g)
            return ts
        got, ref = both(arc)
        for k, a, b in zip((1, 5, 17), got, ref):
            want = sum(vals[r][:k].double() for r in range(n))
            assert torch.equal(a, want) and torch.equal(b, want), k

    # Non-contiguous tensors: columns of a matrix, written back in place,
    # the rest of the matrix untouched.
    def column(fill):
        m = torch.full((9, 3), -5.0)
        m[:, 1] = fill
        return m, m[:, 1]

    def rest_kept(m):
        return torch.equal(m[:, 0], torch.full((9,), -5.0)) and \
            torch.equal(m[:, 2], torch.full((9,), -5.0))
    x = torch.arange(9, dtype=torch.float32)
    m, c = column(x + rank)
    dist.all_reduce(c)
    assert torch.equal(m[:, 1], x * n + sum(range(n))) and rest_kept(m)
    m, c = column(x + rank)
    dist.broadcast(c, src=n - 1)
    assert torch.equal(m[:, 1], x + n - 1) and rest_kept(m)
    m, c = column(x + rank)
    dist.reduce(c, dst=0)
    if rank == 0:
        assert torch.equal(m[:, 1], x * n + sum(range(n))) and rest_kept(m)
    outs = [column(0)[1] for _ in range(n)]
    dist.all_gather(outs, column(x + rank)[1])
    for r in range(n):
        assert torch.equal(outs[r], x + r)
    m, c = column(0)
    dist.reduce_scatter(c, [column(x + 10 * k)[1] for k in range(n)])
    assert torch.equal(m[:, 1], (x + 10 * rank) * n) and rest_kept(m)
    big = torch.zeros(9 * n, 2)
    flat = big[:, 0]
    dist.all_gather_into_tensor(flat, column(x + rank)[1]) \
        if hasattr(dist, "all_gather_into_tensor") else dist._all_gather_base(flat, c)
    assert torch.equal(flat, torch.cat([x + r for r in range(n)])) and \
        torch.equal(big[:, 1], torch.zeros(9 * n))
    a2a_in = torch.zeros(3 * n, 2)
    a2a_in[:, 1] = torch.arange(3 * n, dtype=torch.float32) + 100 * rank
    a2a_out = torch.zeros(3 * n, 2)
    dist.all_to_all_single(a2a_out[:, 1], a2a_in[:, 1])
    assert torch.equal(a2a_out[:, 1], torch.cat(
        [torch.arange(3 * rank, 3 * rank + 3, dtype=torch.float32) + 100 * r for r in range(n)]))
    m, c = column(x + rank)
    if rank == 0:
        dist.send(c, 1)
    elif rank == 1:
        dist.recv(c, 0)
        assert torch.equal(m[:, 1], x) and rest_kept(m)
    m, c = column(0)
    dist.scatter(c, [column(x + 3 * r)[1] for r in range(n)] if rank == 0 else None, src=0)
    assert torch.equal(m[:, 1], x + 3 * rank) and rest_kept(m)
    outs = [column(0)[1] for _ in range(n)] if rank == 0 else None
    dist.gather(column(x * rank)[1], outs, dst=0)
    if rank == 0:
        for r in range(n):
            assert torch.equal(outs[r], x * r)
    dist.barrier()
    dist.destroy_process_group()


def body_timeout(rank, n):
    """init_process_group(timeout=2 s) is the communicator's timeout: rank
    0's allreduce fails after about 2 s, not after the peer's 5 s delay or
    BRIGADE_TIMEOUT_MS (60 s here), and raises through torch's call."""
    import time
    from datetime import timedelta

    import brigade.torch

    dist.init_process_group("brigade", rank=rank, world_size=n, timeout=timedelta(seconds=2))
    t0 = time.monotonic()
    if rank == 1:
        time.sleep(5)
    try:
        dist.all_reduce(torch.ones(5))
    except brigade.Error as e:
        took = time.monotonic() - t0
        assert rank == 0 and 1.9 < took < 4.9 and "ERR_TIMEOUT" in str(e), (rank, took, str(e))
    else:
        assert rank == 1, "rank 0's allreduce with a late peer did not fail"
    dist.destroy_process_group()


def test_timeout():
    env = dict(port_env(), BRIGADE_TIMEOUT_MS="60000")
    ranks.run(2, body_timeout, init=None, env=env, timeout=60)


def test_gloo_ops():
    ranks.run(3, body_gloo_ops, init=None, env=port_env(), timeout=120)


class _OnDevice(torch.Tensor):
    """A CPU tensor that says it is a CUDA tensor (torch here has no CUDA):
    what steers the backend's gather and scatter to brigade's blocking
    forms, which take GPU buffers."""

    @property
    def is_cuda(self):
        return True


class _DeviceComm:
    """The communicator of a brigade process group, seen through: the
    blocking gather and scatter run on the emulated CUDA module (every
    tensor copied into its "device" memory, the results copied back), as
    a CUDA tensor's memory would be; the non-blocking forms run as they
    are. Each call is recorded with whether an _OnDevice tensor was in it."""

    def __init__(self, comm, emu):
        self.comm, self.emu, self.calls = comm, emu, []

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def _device(self, name, args, kw):
        from test_gpu_buffers import DevArray

        tensors = [a for a in list(args) + list(kw.values()) if isinstance(a, torch.Tensor)]
        self.calls.append((name, any(isinstance(a, _OnDevice) for a in tensors)))
        devs = {}

        def dev(a):
            if not isinstance(a, torch.Tensor):
                return a
            devs[id(a)] = (a, DevArray(self.emu, a.as_subclass(torch.Tensor).numpy()))
            return devs[id(a)][1]

        try:
            getattr(self.comm, name)(*[dev(a) for a in args],
                                     **{k: dev(v) for k, v in kw.items()})
            for a, d in devs.values():
                a.as_subclass(torch.Tensor).copy_(torch.from_numpy(d.host()))
        finally:
            for _, d in devs.values():
                d.free()

    def gather(self, *args, **kw):
        self._device("gather", args, kw)

    def scatter(self, *args, **kw):
        self._device("scatter", args, kw)

    def igather(self, *args, **kw):
        self.calls.append(("igather", any(isinstance(a, _OnDevice) for a in args)))
        return self.comm.igather(*args, **kw)

    def iscatter(self, *args, **kw):
        self.calls.append(("iscatter", any(isinstance(a, _OnDevice) for a in
                                           list(args) + list(kw.values()))))
        return self.comm.iscatter(*args, **kw)


def body_device_rooted(rank, n):
    """The backend's gather and scatter on CUDA tensors: a rank whose own
    tensor is on the device calls the blocking form (on the emulated
    module's memory) and its Work is complete when the call returns; a
    rank with CPU tensors calls the non-blocking form; ranks of both kinds
    meet in one call. Every root, two dtypes, every element checked."""
    from types import SimpleNamespace

    import brigade.torch
    from emu import Emu

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), n, rank == 0)
    pg = brigade.torch.ProcessGroupBrigade(store, rank, n)
    emu = Emu(os.environ["BRIGADE_CUDA_MODULE"])
    emu.set_device(rank % emu.devices)
    spy = pg.comm = _DeviceComm(pg.comm, emu)
    # The memory _DeviceComm hands brigade is GPU memory to it: the
    # non-blocking form refuses it (on this rank alone, before any exchange).
    from test_gpu_buffers import DevArray
    d = DevArray(emu, np.zeros(4, np.float32))
    with pytest.raises(brigade.Error, match="GPU memory"):
        spy.comm.igather(d, root=(rank + 1) % n)
    d.free()
    for on_device in ((True,) * n, tuple(r % 2 == 0 for r in range(n))):
        dev = on_device[rank]

        def mine(t):
            return t.as_subclass(_OnDevice) if dev else t
        for dt in (torch.float32, torch.int64):
            for root in range(n):
                opts = SimpleNamespace(rootRank=root)
                t = mine(torch.arange(1001, dtype=dt) * (rank + 1) + root)
                outs = [torch.full((1001,), -1, dtype=dt) for _ in range(n)]
                del spy.calls[:]
                w = pg.gather([outs] if rank == root else [], [t], opts)
                assert not dev or w.is_completed(), "a device gather's Work is not complete"
                w.wait()
                assert spy.calls == [("gather", True) if dev else ("igather", False)], spy.calls
                if rank == root:
                    for r in range(n):
                        want = torch.arange(1001, dtype=dt) * (r + 1) + root
                        assert torch.equal(outs[r], want), (on_device, dt, root, r)
                # scatter into a non-contiguous output (a column)
                ins = [torch.arange(777, dtype=dt) * 3 + r + root for r in range(n)]
                col = mine(torch.full((777, 2), -1, dtype=dt))[:, 1]
                del spy.calls[:]
                w = pg.scatter([col], [ins] if rank == root else [], opts)
                assert not dev or w.is_completed(), "a device scatter's Work is not complete"
                w.wait()
                assert spy.calls == [("scatter", True) if dev else ("iscatter", False)], spy.calls
                assert torch.equal(col.as_subclass(torch.Tensor), ins[rank]), (dt, root)
    pg.comm = spy.comm
    pg.comm.close()


def test_device_rooted():
    emu = os.environ.get("BRIGADE_EMU_MODULE", "")
    if not os.path.exists(emu):
        pytest.skip("BRIGADE_EMU_MODULE is not set (meson test sets it)")
    env = dict(port_env(), BRIGADE_CUDA_MODULE=emu, BRIGADE_TRANSPORTS="cuda_ipc,shm")
    ranks.run(3, body_device_rooted, init=None, env=env, timeout=120)


def body_tensors(comm):
    """brigade.Communicator on CPU tensors directly (data_ptr)."""
    n, r = comm.size, comm.rank
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
        t = torch.arange(1, 101).to(dt) + r  # exact in bfloat16 (< 256)
        comm.allreduce(t)
        assert torch.equal(t, (torch.arange(1, 101) * n + sum(range(n))).to(dt)), dt
        g = comm.all_gather(torch.full((7,), r, dtype=dt))
        assert torch.equal(g, torch.arange(n).repeat_interleave(7).to(dt)), dt
    try:
        comm.allreduce(torch.ones(4, 4)[:, 0])
    except ValueError as e:
        assert "non-contiguous" in str(e)
    else:
        raise AssertionError("a non-contiguous tensor was accepted")
    try:
        comm.allreduce(torch.ones(3, dtype=torch.int16))
    except TypeError as e:
        assert "int16" in str(e)
    else:
        raise AssertionError("an int16 tensor was accepted")


def test_tensors():
    ranks.run(2, body_tensors)


def port_env():
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ranks.free_port()),
            "BRIGADE_PORT": str(ranks.free_port())}


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_brigade_vs_gloo(n):
    ranks.run(n, body_ddp, init=None, env=port_env(), timeout=240)


@pytest.mark.parametrize("via_env", [True, False])
def test_allreduce_hook(via_env):
    ranks.run(2, body_hook, via_env, init=None, env=port_env(), timeout=180)


@pytest.mark.parametrize("n", [2, 3])
def test_backend_calls(n):
    ranks.run(n, body_backend_calls, init=None, env=port_env(), timeout=180)


def body_async_work(rank, n):
    """Work objects of async_op=True calls return before the collective has
    run: rank 0 issues each call while the last rank is still asleep."""
    import time

    import brigade.torch  # noqa: F401

    dist.init_process_group("brigade", rank=rank, world_size=n)
    t = torch.full((1000,), float(rank + 1))
    outs = [torch.empty(1000) for _ in range(n)]
    rs_out = torch.empty(1000)
    calls = [("all_reduce", lambda: dist.all_reduce(t, async_op=True)),
             ("broadcast", lambda: dist.broadcast(t, src=n - 1, async_op=True)),
             ("reduce", lambda: dist.reduce(t, dst=0, async_op=True)),
             ("all_gather", lambda: dist.all_gather(outs, t, async_op=True)),
             ("reduce_scatter", lambda: dist.reduce_scatter(
                 rs_out, [torch.full((1000,), float(rank + k)) for k in range(n)],
                 async_op=True)),
             ("barrier", lambda: dist.barrier(async_op=True))]
    for name, call in calls:
        dist.barrier()
        t.fill_(float(rank + 1))
        if rank == n - 1:
            time.sleep(1.5)
        t0 = time.monotonic()
        work = call()
        took = time.monotonic() - t0
        done = work.is_completed()
        work.wait()
        if rank == 0:
            assert took < 1.0 and not done, f"{name}: the call took {took:.2f} s, " \
                f"completed {done}; it should return before the last rank arrives"
    assert torch.equal(rs_out, torch.full((1000,), float(sum(range(n)) + n * rank)))
    for r in range(n):  # t is rank + 1 again before each call
        assert torch.equal(outs[r], torch.full((1000,), float(r + 1))), (r, outs[r][:3])
    dist.destroy_process_group()


def test_async_work():
    ranks.run(2, body_async_work, init=None, env=port_env(), timeout=120)


def body_new_group(rank, n):
    """new_group on a "brigade" default group: members [0, 2] run on their own
    communicator, rank 1 is not a member; the world group still works."""
    import brigade.torch  # noqa: F401

    dist.init_process_group("brigade", rank=rank, world_size=n)
    g = dist.new_group([0, 2])
    if rank == 1:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
    else:
        t = torch.arange(5, dtype=torch.float64) + rank
        dist.all_reduce(t, group=g)
        assert torch.equal(t, torch.arange(5, dtype=torch.float64) * 2 + 2)
        assert dist.get_world_size(g) == 2 and dist.get_rank(g) == rank // 2
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=2, group=g)  # src is a global rank
        assert torch.equal(b, torch.full((3,), 2.0))
    t = torch.ones(4)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(n)))
    dist.destroy_process_group()


def test_new_group():
    ranks.run(3, body_new_group, init=None, env=port_env(), timeout=120)


def body_p2p(rank, n):
    """send/recv, isend/irecv, recv from any source and all_to_all (single
    with equal and unequal splits, and on lists) through the backend, every
    element checked."""
    import brigade.torch  # noqa: F401

    dist.init_process_group("brigade", rank=rank, world_size=n)
    right, left = (rank + 1) % n, (rank - 1) % n

    def val(src, dst, k, dt=torch.float32):
        return (torch.arange(k, dtype=torch.int64) * 3 + src * 10 + dst).to(dt)

    if not HAVE_P2P:
        for call in (lambda: dist.send(torch.ones(1), right),
                     lambda: dist.all_to_all_single(torch.ones(n), torch.ones(n))):
            try:
                call()
            except NotImplementedError as e:
                assert "brg_send" in str(e) or "brg_all_to_all" in str(e) \
                    or "brg_isend" in str(e), str(e)
            else:
                raise AssertionError("a point-to-point call ran without brg_send")
        dist.destroy_process_group()
        return
    for dt in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
        got = torch.zeros(33, dtype=dt)
        if rank % 2 == 0:
            dist.send(val(rank, right, 33, dt), right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(val(rank, right, 33, dt), right)
        assert torch.equal(got, val(left, rank, 33, dt)), dt
        a, b = torch.zeros(7, dtype=dt), torch.zeros(7, dtype=dt)
        ws = [dist.irecv(a, left), dist.irecv(b, right), dist.isend(val(rank, left, 7, dt), left),
              dist.isend(val(rank, right, 7, dt), right)]
        for w in ws:
            w.wait()
        assert torch.equal(a, val(left, rank, 7, dt)) and torch.equal(b, val(right, rank, 7, dt))
        # all_to_all_single, equal splits: brg_all_to_all
        inp = torch.cat([val(rank, j, 5, dt) for j in range(n)])
        out = torch.zeros(5 * n, dtype=dt)
        dist.all_to_all_single(out, inp)
        assert torch.equal(out, torch.cat([val(j, rank, 5, dt) for j in range(n)])), dt
        # unequal splits: rank s sends s + j + 1 elements to rank j
        ins = [rank + j + 1 for j in range(n)]
        outs = [j + rank + 1 for j in range(n)]
        inp = torch.cat([val(rank, j, ins[j], dt) for j in range(n)])
        out = torch.zeros(sum(outs), dtype=dt)
        dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins)
        assert torch.equal(out, torch.cat([val(j, rank, outs[j], dt) for j in range(n)])), dt
        # lists
        outl = [torch.zeros(j + 2, dtype=dt) for j in range(n)]
        dist.all_to_all(outl, [val(rank, j, rank + 2, dt) for j in range(n)])
        for j in range(n):
            assert torch.equal(outl[j], val(j, rank, j + 2, dt)), (dt, j)
    # Tags, matched per (source, tag) as Gloo matches them: rank r sends
    # tag 7, then tag 8, to the next rank, which receives tag 8 first; the
    # same size, so that a swap shows only in the values. Non-blocking
    # with the receives posted first, then blocking with both messages sent
    # before any receive.
    for blocking in (False, True):
        a, b = torch.zeros(11, dtype=torch.int64), torch.zeros(11, dtype=torch.int64)
        if blocking:
            dist.send(val(rank, right, 11, torch.int64) + 7000, right, tag=7)
            dist.send(val(rank, right, 11, torch.int64) + 8000, right, tag=8)
            dist.recv(b, left, tag=8)
            dist.recv(a, left, tag=7)
        else:
            ws = [dist.irecv(b, left, tag=8), dist.irecv(a, left, tag=7)]
            dist.barrier()
            ws += [dist.isend(val(rank, right, 11, torch.int64) + 7000, right, tag=7),
                   dist.isend(val(rank, right, 11, torch.int64) + 8000, right, tag=8)]
            for w in ws:
                w.wait()
        assert torch.equal(a, val(left, rank, 11, torch.int64) + 7000), (blocking, a)
        assert torch.equal(b, val(left, rank, 11, torch.int64) + 8000), (blocking, b)
        dist.barrier()
    # From any source with a tag: every other rank sends tag 4, then tag 3,
    # to rank 0, which takes tag 3 from any source first.
    if rank == 0:
        for _ in range(n - 1):
            got = torch.zeros(9, dtype=torch.int64)
            src = dist.recv(got, tag=3)
            assert torch.equal(got, val(src, 0, 9, torch.int64) + 300), (src, got)
        for j in range(1, n):
            got = torch.zeros(9, dtype=torch.int64)
            dist.recv(got, j, tag=4)
            assert torch.equal(got, val(j, 0, 9, torch.int64) + 400), (j, got)
    else:
        dist.send(val(rank, 0, 9, torch.int64) + 400, 0, tag=4)
        dist.send(val(rank, 0, 9, torch.int64) + 300, 0, tag=3)
    dist.barrier()
    # recv from any source (src=None): rank 0 takes one message from every
    # other rank, blocking and through irecv, in whatever order they come;
    # dist.recv returns the sender, which the values must match.
    for k in range(2):
        if rank == 0:
            seen = []
            for _ in range(n - 1):
                got = torch.zeros(9, dtype=torch.int64)
                if k == 0:
                    src = dist.recv(got)
                else:
                    w = dist.irecv(got)
                    w.wait()
                    src = w._source_rank()
                assert torch.equal(got, val(src, 100 + k, 9, torch.int64)), (k, src, got)
                seen.append(src)
            assert sorted(seen) == list(range(1, n)), seen
        else:
            dist.send(val(rank, 100 + k, 9, torch.int64), 0)
        dist.barrier()  # no rank's next message meets this round's receives
    dist.destroy_process_group()


# Three ranks: rank 0 talks to two peers, which two ranks would not show.
@pytest.mark.parametrize("n", [3])
def test_p2p(n):
    ranks.run(n, body_p2p, init=None, env=port_env(), timeout=120)


# ------------------------------------------------- failures reach the caller
def _expect_error(call, status, what, t0=None, within=None):
    """call() must raise brigade's error with `status` (one, or a tuple of
    which one) in its message, as Gloo's Work raises; returns the message."""
    import time

    import brigade

    t0 = time.monotonic() if t0 is None else t0
    try:
        call()
    except brigade.Error as e:
        msg = str(e)
        took = time.monotonic() - t0
        assert any(x in msg for x in ((status,) if isinstance(status, str) else status)), \
            f"{what}: raised {msg!r}, expected {status}"
        assert within is None or within[0] <= took <= within[1], \
            f"{what}: raised after {took:.2f} s, expected {within[0]}-{within[1]} s"
        return msg
    raise AssertionError(f"{what}: returned without raising (expected {status})")


def _run_op(fn, async_op):
    """fn(async_op) -> a Work (async) or None; waits for the Work."""
    w = fn(async_op)
    if async_op:
        assert w is not None
        w.wait()


def _mismatch_calls(rank, n):
    """Each call with a count that differs by rank, and the ranks on which
    brigade's own calls raise the mismatch: every rank of a collective it
    checks as one call, but a broadcast's root (its data leaves, whatever
    the others expect) and those of a reduce's other ranks that finish
    their part first; the receivers of a message whose size differs."""
    every, nonroot = set(range(n)), set(range(1, n))

    def ones(k, dt=torch.float32):
        return torch.ones(k, dtype=dt)

    return [
        ("all_reduce", every, lambda g, a: dist.all_reduce(ones(16 + rank), group=g, async_op=a)),
        ("broadcast", nonroot,
         lambda g, a: dist.broadcast(ones(16 + rank), src=0, group=g, async_op=a)),
        ("reduce", {0}, lambda g, a: dist.reduce(ones(16 + rank), dst=0, group=g, async_op=a)),
        ("all_gather", every, lambda g, a: dist.all_gather(
            [ones(4 + rank) for _ in range(n)], ones(4 + rank), group=g, async_op=a)),
        ("reduce_scatter", every, lambda g, a: dist.reduce_scatter(
            ones(4 + rank), [ones(4 + rank) for _ in range(n)], group=g, async_op=a)),
        ("all_to_all_single", every, lambda g, a: dist.all_to_all_single(
            ones(n * (2 + rank)), ones(n * (2 + rank)), group=g, async_op=a)),
        # Rank r sends 4 + r elements to each and expects as many from each:
        # every receive from another rank differs.
        ("all_to_all", every, lambda g, a: dist.all_to_all(
            [ones(4 + rank) for _ in range(n)], [ones(4 + rank) for _ in range(n)], group=g,
            async_op=a)),
        ("gather", every, lambda g, a: dist.gather(
            ones(4 + rank), [ones(4) for _ in range(n)] if rank == 0 else None, dst=0, group=g,
            async_op=a)),
        ("scatter", every, lambda g, a: dist.scatter(
            ones(4 + rank), [ones(4) for _ in range(n)] if rank == 0 else None, src=0, group=g,
            async_op=a)),
        ("send/recv", nonroot, lambda g, a: (
            [dist.isend(ones(4), j, group=g) for j in range(1, n)][-1] if rank == 0 and a
            else [dist.send(ones(4), j, group=g) for j in range(1, n)] and None if rank == 0
            else dist.irecv(ones(5), 0, group=g) if a else dist.recv(ones(5), 0, group=g))),
    ]


# The rank that waits for the late one times out; at 3 ranks the other may
# hear of it from that rank first (ERR_REMOTE naming its timeout).
TIMED_OUT = ("ERR_TIMEOUT: timeout", "failed: timeout")


def body_failures(rank, n, async_op):
    """Every failure of a brigade call reaches torch's caller, sync and
    async (work.wait() and the Work's future), as with Gloo: a rank that
    never calls (the group's timeout, 2 s), counts that differ by rank (for
    every call), and every later call on a group that broke (a failed
    collective) raises naming the first error, at once; a failed send or
    receive leaves the group usable."""
    import time
    from datetime import timedelta

    import brigade.torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    to = timedelta(seconds=2)
    late = n - 1

    def broken_after(g, first, what):
        t0 = time.monotonic()
        msg = _expect_error(lambda: dist.all_reduce(torch.ones(3), group=g), "broken",
                            f"{what}: a later call", t0, (0, 1.9))
        assert first in msg, f"{what}: the later call's error {msg!r} does not name the " \
            f"first {first!r}"
        _expect_error(lambda: dist.barrier(group=g, async_op=True), "broken",
                      f"{what}: a later barrier", t0, (0, 1.9))

    # A rank that never calls: all_reduce and barrier, on groups of their
    # own (a group that broke stays broken); async, the two run at once.
    g1 = dist.new_group(backend="brigade", timeout=to)
    g2 = dist.new_group(backend="brigade", timeout=to)
    if rank != late:
        t = torch.full((16,), float(rank + 1))
        t0 = time.monotonic()
        if async_op:
            w1 = dist.all_reduce(t, group=g1, async_op=True)
            w2 = dist.barrier(group=g2, async_op=True)
            assert not w1.is_completed()
            m1 = _expect_error(w1.wait, TIMED_OUT, "all_reduce's wait()", t0, (1.8, 15))
            _expect_error(w2.wait, TIMED_OUT, "barrier's wait()", t0, (1.8, 15))
            assert w1.is_completed() and not w1.is_success()
            assert "timeout" in str(w1.exception())
            fut = w1.get_future()
            assert fut.done()
            _expect_error(fut.wait, TIMED_OUT, "all_reduce's future")
            _expect_error(w1.result, TIMED_OUT, "all_reduce's result()")
        else:
            m1 = _expect_error(lambda: dist.all_reduce(t, group=g1), TIMED_OUT,
                               "all_reduce", t0, (1.8, 15))
            _expect_error(lambda: dist.barrier(group=g2), TIMED_OUT, "barrier",
                          time.monotonic(), (1.8, 15))
        assert torch.equal(t, torch.full((16,), float(rank + 1)))
        broken_after(g1, m1.split(": ", 2)[2][:60], "absent rank")
    dist.barrier()  # the late rank waits here for the others' failures

    # Counts that differ by rank: a group per call.
    # Their mismatch is found from the call headers, not by a timeout, so
    # their groups wait long: a rank slowed by a loaded machine is not
    # mistaken for an absent one.
    for name, where, call in _mismatch_calls(rank, n):
        g = dist.new_group(backend="brigade", timeout=timedelta(seconds=20))
        t0 = time.monotonic()
        if rank in where:
            msg = _expect_error(lambda: _run_op(lambda a: call(g, a), async_op),
                                "ERR_MISMATCH", name)
            if name != "send/recv":
                broken_after(g, msg.split("ERR_MISMATCH: ", 1)[1][:60], name)
        else:
            try:  # a sender may finish before its receiver sees the mismatch
                _run_op(lambda a: call(g, a), async_op)
            except brigade.Error as e:
                assert "ERR_MISMATCH" in str(e) or "ERR_REMOTE" in str(e), (name, str(e))
        if name == "send/recv":
            # A failed send or receive leaves the group usable, as brigade's
            # point-to-point leaves its communicator: the next message matches.
            if rank == 0:
                for j in range(1, n):
                    dist.send(torch.arange(6.0) + j, j, group=g)
            else:
                got = torch.zeros(6)
                dist.recv(got, 0, group=g)
                assert torch.equal(got, torch.arange(6.0) + rank), got
        dist.barrier()
    dist.destroy_process_group()


# Sync at 2 ranks and async at 3: each group is a new communicator, so the
# four combinations would cost twice the time for no new path.
@pytest.mark.parametrize("n,async_op", [(2, False), (3, True)], ids=["sync-2", "async-3"])
def test_failures_raise(n, async_op):
    ranks.run(n, body_failures, async_op, init=None, env=port_env(), timeout=90)


def body_dtypes(rank, n):
    """int16, bool and complex through every call, against references
    computed here: int16 reduces as int16 arithmetic (wrapping), bool as
    NCCL's backend reduces it (SUM and MAX or, PRODUCT and MIN and), complex
    as pairs of reals (SUM, AVG; others refused); PREMUL_SUM through torch's
    own API (torch 2.x), refused naming the reason on torch 1.13. Then
    batch_isend_irecv, which torch 2.x runs through the group's backend."""
    import brigade.torch  # noqa: F401

    dist.init_process_group("brigade", rank=rank, world_size=n)
    gen = torch.Generator().manual_seed(11)
    K = 13
    R = dist.ReduceOp
    vals = {
        torch.int16: [torch.randint(-2**15, 2**15, (K,), generator=gen, dtype=torch.int64)
                      .to(torch.int16) for _ in range(n)],
        torch.bool: [torch.randint(0, 2, (K,), generator=gen).bool() for _ in range(n)],
        torch.complex64: [torch.randn(K, generator=gen, dtype=torch.complex64)
                          for _ in range(n)],
        torch.complex128: [torch.randn(K, generator=gen, dtype=torch.complex128)
                           for _ in range(n)],
    }

    def fold(dt, f):
        acc = vals[dt][0]
        for r in range(1, n):
            acc = f(acc, vals[dt][r])
        return acc

    wrap = lambda x: x.to(torch.int64).remainder(2**16).to(torch.int32).to(torch.int16)  # noqa: E731
    refs = {
        (torch.int16, "SUM"): fold(torch.int16, lambda a, b: wrap(a.long() + b.long())),
        (torch.int16, "MAX"): fold(torch.int16, torch.maximum),
        (torch.int16, "MIN"): fold(torch.int16, torch.minimum),
        (torch.int16, "BXOR"): fold(torch.int16, torch.bitwise_xor),
        (torch.bool, "SUM"): fold(torch.bool, torch.logical_or),
        (torch.bool, "MAX"): fold(torch.bool, torch.logical_or),
        (torch.bool, "PRODUCT"): fold(torch.bool, torch.logical_and),
        (torch.bool, "MIN"): fold(torch.bool, torch.logical_and),
        (torch.bool, "BXOR"): fold(torch.bool, torch.logical_xor),
        (torch.complex64, "SUM"): fold(torch.complex64, torch.add),
        (torch.complex128, "SUM"): fold(torch.complex128, torch.add),
        (torch.complex128, "AVG"): fold(torch.complex128, torch.add) / n,
    }

    def same(got, want, what):
        if got.is_complex():
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (what, got, want)
        else:
            assert torch.equal(got, want), (what, got, want)

    for (dt, name), want in refs.items():
        op = getattr(R, name)
        t = vals[dt][rank].clone()
        dist.all_reduce(t, op=op)
        same(t, want, f"all_reduce {dt} {name}")
        t = vals[dt][rank].clone()
        dist.reduce(t, dst=n - 1, op=op)
        if rank == n - 1:
            same(t, want, f"reduce {dt} {name}")
        if name != "AVG":
            # reduce_scatter: block j of rank r's input is vals[r] rolled by j
            out = torch.zeros(K, dtype=dt)
            dist.reduce_scatter(out, [vals[dt][rank].roll(j) for j in range(n)], op=op)
            same(out, want.roll(rank), f"reduce_scatter {dt} {name}")
    for dt in (torch.complex64, torch.bool):
        for name in (("MAX", "PRODUCT", "BAND") if dt.is_complex else ("AVG",)):
            t = vals[dt][rank].clone()
            try:
                dist.all_reduce(t, op=getattr(R, name))
            except (ValueError, RuntimeError) as e:  # torch refuses some itself
                assert "complex" in str(e).lower() or "bool" in str(e).lower(), (dt, name, str(e))
            else:
                raise AssertionError(f"all_reduce {name} on {dt} did not raise")
    for dt, vs in vals.items():
        # Calls that move data: every rank's values, every element.
        for root in range(n):
            t = vs[rank].clone()
            dist.broadcast(t, src=root)
            same(t, vs[root], f"broadcast {dt} from {root}")
        outs = [torch.zeros(K, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, vs[rank])
        for r in range(n):
            same(outs[r], vs[r], f"all_gather {dt} block {r}")
        g = [torch.zeros(K, dtype=dt) for _ in range(n)] if rank == 0 else None
        dist.gather(vs[rank], g, dst=0)
        if rank == 0:
            for r in range(n):
                same(g[r], vs[r], f"gather {dt} block {r}")
        out = torch.zeros(K, dtype=dt)
        dist.scatter(out, [vs[j] for j in range(n)] if rank == n - 1 else None, src=n - 1)
        same(out, vs[rank], f"scatter {dt}")
        out = torch.zeros(K * n, dtype=dt)
        dist.all_to_all_single(out, torch.cat([vs[rank]] * n))
        same(out, torch.cat([vs[j] for j in range(n)]), f"all_to_all_single {dt}")
        right, left = (rank + 1) % n, (rank - 1) % n
        got = torch.zeros(K, dtype=dt)
        ws = [dist.irecv(got, left), dist.isend(vs[rank], right)]
        for w in ws:
            w.wait()
        same(got, vs[left], f"isend/irecv {dt}")
    # PREMUL_SUM: each rank's values times the factor, then summed.
    if hasattr(dist, "_make_nccl_premul_sum"):
        x = torch.arange(K, dtype=torch.float64) * (rank + 1)
        want = torch.arange(K, dtype=torch.float64) * sum(r + 1 for r in range(n)) * 2.5
        op = dist._make_nccl_premul_sum(2.5)
        if getattr(op, "factor", None) is None:
            try:
                dist.all_reduce(x, op=op)
            except NotImplementedError as e:
                assert "PREMUL_SUM" in str(e) and "factor" in str(e), str(e)
            else:
                raise AssertionError("PREMUL_SUM ran without its factor")
        else:
            dist.all_reduce(x, op=op)
            assert torch.allclose(x, want), (x, want)
            inp = torch.cat([torch.arange(K, dtype=torch.float64) * (rank + 1)] * n)
            out = torch.zeros(K, dtype=torch.float64)
            dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(2.5))
            assert torch.allclose(out, want), (out, want)
            assert torch.equal(inp[:K], torch.arange(K, dtype=torch.float64) * (rank + 1)), \
                "PREMUL_SUM scaled the caller's input"
    # batch_isend_irecv: to the right and from the left, with tags.
    right, left = (rank + 1) % n, (rank - 1) % n
    a, b = torch.zeros(K), torch.zeros(K)
    ops = [dist.P2POp(dist.irecv, b, left, tag=2), dist.P2POp(dist.irecv, a, left, tag=1),
           dist.P2POp(dist.isend, torch.full((K,), rank + 0.25), right, tag=1),
           dist.P2POp(dist.isend, torch.full((K,), rank + 0.5), right, tag=2)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(a, torch.full((K,), left + 0.25)), a
    assert torch.equal(b, torch.full((K,), left + 0.5)), b
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("n", [3])
def test_dtypes(n):
    ranks.run(n, body_dtypes, init=None, env=port_env(), timeout=120)
