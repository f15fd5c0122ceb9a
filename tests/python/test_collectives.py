"""brigade's collectives from Python, on real processes: every dtype brigade
shares with NumPy (bfloat16 as raw uint16 with dtype="bfloat16"), every op,
odd sizes, in place and out of place, at 2 and 3 ranks; every element is
checked against a reference computed here with NumPy from the same inputs.
"""
import array

import numpy as np
import pytest

import brigade
import ranks

NP_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
            "float64", "bfloat16"]
OPS = ["sum", "prod", "min", "max", "avg"]
SIZES = [1, 13, 4099, 70001]


def bf16_encode(x):
    """float32 values -> raw bfloat16, rounded to nearest even (no NaNs here)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_decode(u):
    return (np.asarray(u, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def values(rank, count, op):
    """Rank `rank`'s input as small positive integers (exact in every dtype):
    1..4 for products (4^3 fits int8), 1..11 otherwise."""
    i = np.arange(count, dtype=np.int64)
    top = 4 if op == "prod" else 11
    return (i * 7 + rank * 3 + (i // 5)) % top + 1


def make(dt, v):
    if dt == "bfloat16":
        return bf16_encode(v.astype(np.float32))
    return v.astype(dt)


def expect(dt, n, count, op):
    """The reduction over ranks, computed in int64/float64 from the exact inputs."""
    vs = [values(r, count, op) for r in range(n)]
    if op == "sum":
        e = sum(vs)
    elif op == "prod":
        e = np.prod(vs, axis=0)
    elif op == "min":
        e = np.min(vs, axis=0)
    elif op == "max":
        e = np.max(vs, axis=0)
    else:
        s = sum(vs)
        e = (s // n) if dt not in ("float16", "float32", "float64", "bfloat16") else s / n
    if dt == "bfloat16":
        return e.astype(np.float64)
    return e.astype(dt)


def decoded(dt, a):
    return bf16_decode(a).astype(np.float64) if dt == "bfloat16" else a


def check(what, dt, got, want, op, n):
    got = decoded(dt, got)
    if dt == "bfloat16" and want.dtype == np.uint16:
        want = bf16_decode(want)
    if op == "avg" and dt in ("float16", "bfloat16", "float32", "float64"):
        # sum then one division: for float32/64 numpy's s / n rounds once as the library
        # does; float16/bfloat16 hold the exact sum and round the quotient once.
        if dt == "bfloat16":
            want = bf16_decode(bf16_encode(want.astype(np.float32))).astype(np.float64)
            tol = 2.0 ** -8 * np.abs(want)
        elif dt == "float16":
            tol = 2.0 ** -11 * np.abs(want.astype(np.float64))
        else:
            tol = 0
        bad = np.nonzero(np.abs(got.astype(np.float64) - want.astype(np.float64)) > tol)[0]
    else:
        bad = np.nonzero(got != want)[0]
    if len(bad):
        i = bad[0]
        raise AssertionError(f"{what} {dt} {op} n={n}: {len(bad)} of {len(got)} elements wrong; "
                             f"first at {i}: got {got[i]!r}, expected {want[i]!r}")


# ---------------------------------------------------------------- rank bodies
def body_allreduce(comm):
    n, r = comm.size, comm.rank
    for dt in NP_TYPES:
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for op in OPS:
            for count in SIZES:
                want = expect(dt, n, count, op)
                x = make(dt, values(r, count, op))
                out = np.full_like(x, 0x5A)
                comm.allreduce(x, out=out, op=op, **kw)
                check("allreduce out of place", dt, out, want, op, n)
                check("allreduce input untouched", dt, x, make(dt, values(r, count, op)),
                      "none", n)
                comm.allreduce(x, op=op, **kw)
                check("allreduce in place", dt, x, want, op, n)
                req = comm.iallreduce(make(dt, values(r, count, op)), out=out, op=op, **kw)
                req.wait()
                assert req.test()
                check("iallreduce", dt, out, want, op, n)


def body_reduce_scatter_all_gather(comm):
    n, r = comm.size, comm.rank
    for dt in NP_TYPES:
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for op in ("sum", "max"):
            for count in SIZES[:3]:
                want = expect(dt, n, count * n, op)[r * count:(r + 1) * count]
                x = make(dt, values(r, count * n, op))
                out = comm.reduce_scatter(x, op=op, **kw) if not kw else \
                    comm.reduce_scatter(x, out=np.empty(count, np.uint16), op=op, **kw)
                check("reduce_scatter out of place", dt, out, want, op, n)
                block = x[r * count:(r + 1) * count]  # NCCL's in place: my block of the input
                comm.reduce_scatter(x, out=block, op=op, **kw)
                check("reduce_scatter in place", dt, block, want, op, n)
        for count in SIZES[:3]:
            mine = make(dt, values(r, count, "sum"))
            want = np.concatenate([make(dt, values(k, count, "sum")) for k in range(n)])
            out = np.empty(count * n, dtype=mine.dtype)
            comm.all_gather(mine, out=out, **kw)
            check("all_gather out of place", dt, out, decoded(dt, want), "none", n)
            buf = np.zeros(count * n, dtype=mine.dtype)
            buf[r * count:(r + 1) * count] = mine
            comm.all_gather(buf[r * count:(r + 1) * count], out=buf, **kw)
            check("all_gather in place", dt, buf, decoded(dt, want), "none", n)


def body_broadcast_reduce_barrier(comm):
    n, r = comm.size, comm.rank
    for dt in NP_TYPES:
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for root in range(n):
            for count in SIZES[:3]:
                src = make(dt, values(root, count, "sum"))
                x = make(dt, values(r, count, "sum"))
                out = np.zeros_like(x)
                comm.broadcast(x, root=root, out=out, **kw)
                check("broadcast out of place", dt, out, decoded(dt, src), "none", n)
                comm.broadcast(x, root=root, **kw)
                check("broadcast in place", dt, x, decoded(dt, src), "none", n)
                for op in ("sum", "min"):
                    x = make(dt, values(r, count, op))
                    before = np.full_like(x, 3)
                    out = before.copy()
                    comm.reduce(x, root=root, out=out, op=op, **kw)
                    if r == root:
                        check("reduce at the root", dt, out, expect(dt, n, count, op), op, n)
                    else:
                        check("reduce elsewhere leaves out", dt, out, decoded(dt, before),
                              "none", n)
    for _ in range(5):
        comm.barrier()


def body_other_buffers(comm):
    """Buffer-protocol objects that are not NumPy arrays."""
    n, r = comm.size, comm.rank
    a = array.array("d", [r + 0.5, -r, 3.0])
    comm.allreduce(a)
    assert list(a) == [sum(k + 0.5 for k in range(n)), -sum(range(n)), 3.0 * n]
    b = bytearray([r + 1] * 7)
    comm.allreduce(b, op="max")
    assert b == bytearray([n] * 7)
    m = memoryview(array.array("i", [r] * 5))
    out = array.array("i", [0] * 5)
    comm.allreduce(m, out=out)
    assert list(out) == [sum(range(n))] * 5
    ro = bytes([r + 1] * 3)
    dst = bytearray(3)
    comm.allreduce(ro, out=dst)  # a read-only input is fine out of place
    assert dst == bytearray([sum(range(1, n + 1))] * 3)
    assert comm.bytes_sent > 0

    class Plain:
        """Only __array_interface__, over memory of its own (no NumPy array)."""

        def __init__(self, values):
            import ctypes

            self.mem = (ctypes.c_int64 * len(values))(*values)
            self.__array_interface__ = {"shape": (len(values),), "typestr": "<i8",
                                        "data": (ctypes.addressof(self.mem), False),
                                        "version": 3}

    p = Plain([r, 10 * r, -r])
    comm.allreduce(p)
    assert list(p.mem) == [sum(range(n)), 10 * sum(range(n)), -sum(range(n))]


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce(n):
    ranks.run(n, body_allreduce, timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_scatter_all_gather(n):
    ranks.run(n, body_reduce_scatter_all_gather, timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_broadcast_reduce_barrier(n):
    ranks.run(n, body_broadcast_reduce_barrier, timeout=120)


def test_other_buffers():
    ranks.run(2, body_other_buffers)


def body_gather_scatter_bitwise(comm):
    """gather/scatter (blocking and not) from every root, and the bitwise
    ops on every integer dtype, each element against a local reference."""
    n, r = comm.size, comm.rank
    rng = np.random.default_rng(5)
    blocks = [rng.integers(-1000, 1000, 13).astype(np.float64) for _ in range(n)]
    for root in range(n):
        for nb in (False, True):
            call = comm.igather if nb else comm.gather
            res = call(blocks[r], root=root)
            res = res.wait() if nb else res
            if r == root:
                assert np.array_equal(res, np.concatenate(blocks)), (root, res)
            else:
                assert res is None
            src = np.concatenate(blocks) + root if r == root else None
            out = np.full(13, -1.0)
            res = (comm.iscatter(src, root=root, out=out).wait() if nb
                   else comm.scatter(src, root=root, out=out))
            assert res is out and np.array_equal(out, blocks[r] + root), (root, out)
    for dt in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64):
        info = np.iinfo(dt)
        vals = [rng.integers(info.min, info.max, 29, dtype=dt, endpoint=True) for _ in range(n)]
        for op, f in (("band", np.bitwise_and), ("bor", np.bitwise_or),
                      ("bxor", np.bitwise_xor)):
            got = comm.allreduce(vals[r].copy(), op=op)
            want = vals[0]
            for v in vals[1:]:
                want = f(want, v)
            assert np.array_equal(got, want), (dt, op)
    with pytest.raises(brigade.Error, match="op bor takes integer dtypes only, not float64"):
        comm.allreduce(np.ones(3), op="bor")


@pytest.mark.parametrize("n", [1, 3])
def test_gather_scatter_bitwise(n):
    ranks.run(n, body_gather_scatter_bitwise, timeout=120)


def body_env(comm, n):
    assert comm.size == n
    x = np.full(10, comm.rank, dtype=np.int32)
    comm.allreduce(x)
    assert (x == sum(range(n))).all()


def test_from_env():
    """Communicator.from_env under torchrun-style variables."""
    ranks.run(2, body_env, 2, init="env")


def test_alone_without_launcher(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    ranks.run(1, _alone, init=None)


def _alone(rank, n):
    import os

    for v in list(os.environ):
        if v.startswith(("OMPI_", "PMI_", "SLURM_")) or v in ("RANK", "WORLD_SIZE",
                                                              "MASTER_ADDR", "MASTER_PORT"):
            del os.environ[v]
    with brigade.Communicator.from_env() as comm:
        assert (comm.rank, comm.size) == (0, 1)
        x = np.arange(5.0)
        comm.allreduce(x)
        assert (x == np.arange(5.0)).all()


def body_nonblocking(comm):
    """Every i-form, several in flight at once, finished in reverse order."""
    n, r = comm.size, comm.rank
    for dt in NP_TYPES:
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for count in (1, 4099):
            rs_in = make(dt, values(r, count * n, "sum"))
            rs_out = np.full(count, 0x5A, dtype=rs_in.dtype)
            ag_in = make(dt, values(r, count, "sum"))
            ag_out = np.zeros(count * n, dtype=ag_in.dtype)
            root = count % n
            bc = make(dt, values(r, count, "sum"))
            rd = make(dt, values(r, count, "min"))
            rd_before = rd.copy()
            reqs = [comm.ireduce_scatter(rs_in, out=rs_out, **kw),
                    comm.iall_gather(ag_in, out=ag_out, **kw),
                    comm.ibroadcast(bc, root=root, **kw),
                    comm.ireduce(rd, root=root, op="min", **kw),
                    comm.ibarrier()]
            results = [q.wait() for q in reversed(reqs)]
            assert results[-1] is rs_out and results[0] is None
            assert all(q.test() for q in reqs)
            check("ireduce_scatter", dt, rs_out,
                  expect(dt, n, count * n, "sum")[r * count:(r + 1) * count], "sum", n)
            want = np.concatenate([make(dt, values(k, count, "sum")) for k in range(n)])
            check("iall_gather", dt, ag_out, decoded(dt, want), "none", n)
            check("ibroadcast", dt, bc, decoded(dt, make(dt, values(root, count, "sum"))),
                  "none", n)
            if r == root:
                check("ireduce at the root", dt, rd, expect(dt, n, count, "min"), "min", n)
            else:
                check("ireduce elsewhere", dt, rd, decoded(dt, rd_before), "none", n)
    assert comm.async_error == brigade.Status.SUCCESS


@pytest.mark.parametrize("n", [2, 3])
def test_nonblocking(n):
    ranks.run(n, body_nonblocking, timeout=120)


def body_split(comm):
    """split(color, key): ranks of one color form a communicator ranked by key;
    color None takes part and gets None; the new one outlives its parent."""
    n, r = comm.size, comm.rank
    color = None if (n > 2 and r == 1) else r % 2
    sub = comm.split(color, key=-r)  # reversed order within each color
    if color is None:
        assert sub is None
        comm.close()
        return
    members = [k for k in range(n) if k % 2 == color and not (n > 2 and k == 1)]
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(r), (sub.rank, members)
    comm.close()  # the new communicator does not need its parent
    x = np.full(7, r + 1, dtype=np.int64) * (np.arange(7) + 1)
    sub.allreduce(x)
    assert np.array_equal(x, sum(k + 1 for k in members) * (np.arange(7) + 1))
    g = sub.all_gather(np.array([r], dtype=np.int32))
    assert list(g) == sorted(members, reverse=True)
    sub.close()


@pytest.mark.parametrize("n", [2, 4])
def test_split(n):
    ranks.run(n, body_split, timeout=60)


def test_split_bad_color():
    with brigade.Communicator(1, brigade.get_unique_id(), 0) as comm:
        with pytest.raises(brigade.Error) as e:
            comm.split(-5)
        assert e.value.status == brigade.Status.ERR_INVALID_ARGUMENT
        assert "color" in e.value.message, e.value.message
        one = comm.split(3)
        assert (one.rank, one.size) == (0, 1)
        one.close()


def test_library_version():
    v = brigade.library_version()
    assert v == brigade._capi.VERSION and brigade.version() == "%d.%d.%d" % v
