"""Point-to-point and all-to-all from Python (brg_send, brg_recv, brg_isend,
brg_irecv, brg_all_to_all), on real processes, every element checked
against values computed here from the sender's rank, the receiver's rank
and the index. Skipped where the loaded libbrigade.so has no such calls;
the wrappers then raise NotImplementedError naming the call (checked here
in any case).
"""
import numpy as np
import pytest

import brigade
import ranks
from brigade import _capi
from test_collectives import NP_TYPES, make

HAVE_P2P = all(_capi.has(n) for n in _capi.OPTIONAL)
need_p2p = pytest.mark.skipif(not HAVE_P2P, reason="this libbrigade.so has no point-to-point "
                              "calls (brg_send, brg_recv, brg_all_to_all, brg_isend, brg_irecv)")


def block(src, dst, count, dt):
    """What rank src sends rank dst: small integers, exact in every dtype."""
    i = np.arange(count, dtype=np.int64)
    return make(dt, (i * 5 + src * 3 + dst * 7) % 11 + 1)


def body_send_recv(comm):
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for dt in NP_TYPES:
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for count in (1, 4099, 70001):
            mine = block(r, r, count, dt)  # to itself: copied
            back = np.zeros_like(mine)
            q = comm.irecv(back, r, **kw)
            comm.send(mine, r, **kw)
            q.wait()
            assert np.array_equal(back, mine), (dt, count, "to itself")
            # blocking, around the ring: even ranks send first, odd receive first
            out = block(r, right, count, dt)
            got = np.zeros_like(out)
            if r % 2 == 0:
                comm.send(out, right, **kw)
                comm.recv(got, left, **kw)
            else:
                comm.recv(got, left, **kw)
                comm.send(out, right, **kw)
            assert np.array_equal(got, block(left, r, count, dt)), (dt, count, "send/recv")
            # non-blocking, both directions at once
            to_l, to_r = block(r, left, count, dt), block(r, right, count, dt)
            from_l, from_r = np.zeros_like(to_l), np.zeros_like(to_r)
            reqs = [comm.irecv(from_l, left, **kw), comm.irecv(from_r, right, **kw),
                    comm.isend(to_l, left, **kw), comm.isend(to_r, right, **kw)]
            for q in reversed(reqs):
                q.wait()
            assert np.array_equal(from_l, block(left, r, count, dt)), (dt, count, "irecv left")
            assert np.array_equal(from_r, block(right, r, count, dt)), (dt, count, "irecv right")
    with pytest.raises(ValueError, match="peer"):
        comm.send(np.ones(3), n)


def body_all_to_all(comm):
    n, r = comm.size, comm.rank
    for dt in NP_TYPES:
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for count in (1, 13, 4099):
            send = np.concatenate([block(r, j, count, dt) for j in range(n)])
            want = np.concatenate([block(j, r, count, dt) for j in range(n)])
            out = np.full_like(send, 0x5A)
            comm.all_to_all(send, out=out, **kw)
            assert np.array_equal(out, want), (dt, count)
            assert np.array_equal(send, np.concatenate([block(r, j, count, dt)
                                                        for j in range(n)])), "input changed"
            inplace = send.copy()
            assert comm.all_to_all(inplace, out=inplace, **kw) is inplace
            assert np.array_equal(inplace, want), (dt, count, "in place")
    with pytest.raises(ValueError, match="blocks"):
        comm.all_to_all(np.ones(n * 3 + 1), out=np.ones(n * 3 + 1))


@need_p2p
@pytest.mark.parametrize("n", [2, 3])
def test_send_recv(n):
    ranks.run(n, body_send_recv, timeout=60)


@need_p2p
@pytest.mark.parametrize("n", [2, 3])
def test_all_to_all(n):
    ranks.run(n, body_all_to_all, timeout=60)


def test_missing_call_names_it(monkeypatch):
    """Against a library without the calls, each wrapper raises naming its C call."""
    monkeypatch.setattr(_capi, "has", lambda name: False)
    with brigade.Communicator(1, brigade.get_unique_id(), 0) as comm:
        x = np.ones(4)
        for call, cname in ((lambda: comm.send(x, 0), "brg_send"),
                            (lambda: comm.recv(x, 0), "brg_recv"),
                            (lambda: comm.isend(x, 0), "brg_isend"),
                            (lambda: comm.irecv(x, 0), "brg_irecv"),
                            (lambda: comm.all_to_all(x, out=np.ones(4)), "brg_all_to_all")):
            with pytest.raises(NotImplementedError, match=cname):
                call()
