"""Bad input from Python: a clear exception on every rank, nothing hung.

Input the package can judge alone (a type brigade lacks, a non-contiguous
array, a read-only output, sizes that do not fit) is refused on each rank
before any C call, and the communicator stays usable; input only the ranks
together can judge (counts that differ across ranks) is brigade's
BRG_ERR_MISMATCH on every rank; a rank killed mid-loop makes the others
raise within BRIGADE_TIMEOUT_MS.
"""
import os
import signal
import time

import numpy as np
import pytest

import brigade
import ranks


def expect_raise(exc, fn, *words):
    try:
        fn()
    except exc as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"{exc.__name__} message {msg!r} does not say {w!r}"
        return e
    raise AssertionError(f"no {exc.__name__} raised")


def body_local(comm):
    n, r = comm.size, comm.rank
    x = np.ones(8, dtype=np.float32)
    expect_raise(TypeError, lambda: comm.allreduce(np.ones(4, dtype=np.int16)), "int16",
                 "brigade's types are")
    expect_raise(TypeError, lambda: comm.allreduce(np.ones(4, dtype=np.complex64)), "complex64")
    expect_raise(TypeError, lambda: comm.allreduce(np.ones(4, dtype=bool)), "bool")
    expect_raise(TypeError, lambda: comm.allreduce(x, out=np.ones(8, dtype=np.float64)),
                 "float32", "float64", "must match")
    expect_raise(ValueError, lambda: comm.allreduce(np.ones((4, 4), np.float32)[:, 0]),
                 "not contiguous")
    expect_raise(ValueError, lambda: comm.allreduce(x, out=np.ones(7, np.float32)), "8", "7")
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    expect_raise(ValueError, lambda: comm.allreduce(x, out=ro), "read-only")
    expect_raise(ValueError, lambda: comm.allreduce(ro), "read-only")
    expect_raise(ValueError, lambda: comm.reduce_scatter(np.ones(3 * n + 1, np.float32)),
                 "multiple")
    expect_raise(ValueError, lambda: comm.all_gather(x, out=np.ones(8 * n + 1, np.float32)),
                 "must have")
    expect_raise(TypeError, lambda: comm.allreduce(x, op="mean"), "mean", "avg")
    expect_raise(TypeError, lambda: comm.allreduce(object()), "no buffer protocol")
    expect_raise(TypeError, lambda: comm.allreduce(x, dtype="int16"), "unknown dtype")
    expect_raise(ValueError, lambda: comm.allreduce(np.ones(3, np.uint8), dtype="float32"),
                 "whole number")
    # Refused by the C library, with its sentence and status:
    e = expect_raise(brigade.Error, lambda: comm.broadcast(x, root=n), "root", str(n))
    assert e.status == brigade.Status.ERR_INVALID_ARGUMENT
    assert "root" in e.message and e.call == "brg_broadcast"
    # None of it broke the communicator:
    comm.allreduce(x)
    assert (x == n).all()


def body_mismatch(comm):
    x = np.ones(100 + comm.rank, dtype=np.float32)
    t0 = time.monotonic()
    e = expect_raise(brigade.Error, lambda: comm.allreduce(x), "count")
    assert e.status == brigade.Status.ERR_MISMATCH, e
    assert time.monotonic() - t0 < 15, "the mismatch took too long to be reported"
    # After an error the communicator keeps returning it.
    e2 = expect_raise(brigade.Error, lambda: comm.barrier())
    assert e2.status == brigade.Status.ERR_MISMATCH, e2


def body_killed(comm):
    x = np.ones(1 << 16, dtype=np.float32)
    t0 = time.monotonic()
    for step in range(1000000):
        if comm.rank == 1 and step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.allreduce(x, op="avg")
        except brigade.Error as e:
            assert e.status in (brigade.Status.ERR_REMOTE, brigade.Status.ERR_TIMEOUT), e
            assert time.monotonic() - t0 < 15
            assert e.message, "no sentence with the error"
            assert comm.async_error != brigade.Status.SUCCESS
            return
    raise AssertionError("the loop ended without an error")


def body_closed(comm):
    comm.close()
    expect_raise(brigade.Error, lambda: comm.barrier(), "closed")
    comm.close()  # idempotent


def body_iallreduce_error(comm):
    x = np.ones(50 + comm.rank, dtype=np.float64)
    assert comm.async_error == brigade.Status.SUCCESS
    req = comm.iallreduce(x)
    e = expect_raise(brigade.Error, req.wait)
    assert e.status == brigade.Status.ERR_MISMATCH, e
    # the queued collective's failure shows as the communicator's async error
    assert comm.async_error == brigade.Status.ERR_MISMATCH, comm.async_error


@pytest.mark.parametrize("n", [2, 3])
def test_local_bad_input(n):
    ranks.run(n, body_local)


@pytest.mark.parametrize("n", [2, 3])
def test_mismatched_counts(n):
    ranks.run(n, body_mismatch, env={"BRIGADE_TIMEOUT_MS": "10000"})


def test_iallreduce_mismatch():
    ranks.run(2, body_iallreduce_error, env={"BRIGADE_TIMEOUT_MS": "10000"})


@pytest.mark.parametrize("n", [2, 3])
def test_rank_killed(n):
    ranks.run(n, body_killed, env={"BRIGADE_TIMEOUT_MS": "5000"}, may_die=(1,), timeout=60)


def test_closed():
    ranks.run(1, body_closed)


def test_bad_unique_id():
    expect_raise(ValueError, lambda: brigade.Communicator(2, b"short", 0), "128")
    uid = bytes(128)  # all zeros: not an id brigade made
    e = expect_raise(brigade.Error, lambda: brigade.Communicator(2, uid, 0))
    assert e.status == brigade.Status.ERR_INVALID_ARGUMENT and e.message
