"""brigade.Reducer (brigade_reducer.h) from Python, on real processes.

Parameters of several sizes and dtypes (so there are several buckets); each
rank's gradients are known functions of the rank, so the averaged (or
summed) gradient of every element is known exactly.
"""
import numpy as np
import pytest

import brigade
import ranks

SHAPES = [(3,), (1000,), (70001,), (5,), (300000,), (17,)]
DTYPES = [np.float32, np.float32, np.float64, np.float32, np.float32, np.float64]


def grad_of(i, rank, step, count, dt):
    k = np.arange(count, dtype=np.int64)
    return (((k * 3 + i + rank * 5 + step) % 16) - 8).astype(dt)  # small integers: exact


def body_reducer(comm, grad_as_view, average):
    n, r = comm.size, comm.rank
    params = [np.full(s, float(r + 10 * i), dtype=d) for i, (s, d) in enumerate(zip(SHAPES,
                                                                                   DTYPES))]
    grads = None if grad_as_view else [np.zeros(s, dtype=d) for s, d in zip(SHAPES, DTYPES)]
    names = [f"layer{i}.weight" for i in range(len(SHAPES))]
    red = brigade.Reducer(comm, params, grads, names, average=average, grad_as_view=grad_as_view,
                          bucket_cap_bytes=1 << 20, first_bucket_cap_bytes=64 << 10)
    with red:
        assert red.num_buckets >= 2
        seen = []
        for b in range(red.num_buckets):
            dt, count, idx = red.bucket_layout(b)
            assert count == sum(SHAPES[i][0] for i in idx)
            seen += idx
        assert sorted(seen) == list(range(len(SHAPES)))
        red.broadcast_params(0)
        for i, p in enumerate(params):
            assert (p == 10 * i).all(), f"param {i} did not come from rank 0"
        for step in range(3):
            red.prepare()
            for i in reversed(range(len(SHAPES))):
                g = red.grad(i) if grad_as_view else grads[i]
                g[:] = grad_of(i, r, step, SHAPES[i][0], DTYPES[i])
                red.mark_ready(i)
            red.finalize()
            for i in range(len(SHAPES)):
                total = sum(grad_of(i, k, step, SHAPES[i][0], np.float64) for k in range(n))
                want = total / n if average else total
                got = red.grad(i) if grad_as_view else grads[i]
                assert got.dtype == DTYPES[i]
                want = want.astype(DTYPES[i])
                bad = np.nonzero(got != want)[0]
                assert not len(bad), (f"step {step} param {i}: {len(bad)} wrong, first at "
                                      f"{bad[0]}: {got[bad[0]]} vs {want[bad[0]]}")


def body_reducer_errors(comm):
    g = [np.zeros(10, np.float32), np.zeros(20, np.float32)]
    red = brigade.Reducer(comm, [None, None], g, ["a.weight", "b.bias"])
    try:
        e = None
        try:
            red.mark_ready(0)  # before prepare
        except brigade.Error as ex:
            e = ex
        assert e is not None and e.message, "mark_ready before prepare did not raise"
        red.prepare()
        red.mark_ready(1)
        try:
            red.mark_ready(1)
        except brigade.Error as ex:
            assert "b.bias" in ex.message, ex.message
        else:
            raise AssertionError("a parameter marked twice did not raise")
    finally:
        comm.abort()  # this step cannot finish: free the other ranks at once
        red.close()
    try:
        brigade.Reducer(comm, [None], [np.zeros(4, np.int16)])
    except TypeError as ex:
        assert "int16" in str(ex)
    else:
        raise AssertionError("an int16 gradient was accepted")


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("grad_as_view", [False, True])
def test_reducer(n, grad_as_view):
    ranks.run(n, body_reducer, grad_as_view, True, timeout=120)


def test_reducer_sum():
    ranks.run(2, body_reducer, False, False)


def test_reducer_errors():
    ranks.run(2, body_reducer_errors, env={"BRIGADE_TIMEOUT_MS": "5000"})
