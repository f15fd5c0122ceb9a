#!/usr/bin/env python3
"""Python object lifetimes that must never crash the interpreter (and the
reducer's sentences for bad indices).

Each case runs in a child interpreter of its own (one rank, no launcher), so
that a crash is a failed case with its signal rather than the end of the
run. A case passes when its child exits 0; it prints what it checked.

In a sanitizer build the children preload the sanitizer's runtime
(BRIGADE_PRELOAD, set by meson to libasan's path), so that a use-after-free
is reported rather than survived.

    py_lifetimes.py [CASE...]
"""
import os
import subprocess
import sys
import textwrap

CASES = {
    # p2p requests outstanding at close: wait, test and garbage collection.
    "irecv_wait_after_close": """
        r = c.irecv(np.zeros(4, np.float32), 0)
        c.close()
        expect_error(r.wait, "ERR_ABORTED", "destroyed")
        assert r.test()  # finished: raised once, then done
    """,
    "irecv_test_after_close": """
        r = c.irecv(np.zeros(4, np.float32), 0)
        c.close()
        expect_error(r.test, "ERR_ABORTED", "destroyed")
    """,
    "irecv_gc_after_close": """
        r = c.irecv(np.zeros(4, np.float32), 0)
        c.close()
        del r
        gc.collect()
    """,
    "irecv_abort": """
        r = c.irecv(np.zeros(4, np.float32), 0)
        c.abort()
        expect_error(r.test, "ERR_ABORTED", "aborted")
        c.close()
    """,
    "request_keeps_comm": """
        r = c.irecv(np.zeros(4, np.float32), 0)
        del c
        gc.collect()
        c2 = brigade.Communicator.from_env()
        c2.send(np.ones(4, np.float32), 0)  # another communicator: not r's message
        expect_error(r.test, None, None, done=False)
        c2.close()
        del r  # dropped in flight: kept, without blocking, until the end
        gc.collect()
    """,
    # A Reducer whose communicator was closed: every call raises.
    "reducer_after_comm_close": """
        g = np.zeros(8, np.float32)
        red = brigade.Reducer(c, [None], [g])
        c.close()
        for call in (red.prepare, lambda: red.mark_ready(0), red.finalize,
                     lambda: red.broadcast_params(0), lambda: red.num_buckets):
            expect_error(call, "ERR_INVALID_USAGE", "closed")
        red.close()
    """,
    "reducer_step_after_comm_close": """
        g = np.ones(8, np.float32)
        red = brigade.Reducer(c, [None], [g])
        red.prepare()
        c.close()
        expect_error(lambda: red.mark_ready(0), "ERR_INVALID_USAGE", "closed")
        expect_error(red.finalize, "ERR_INVALID_USAGE", "closed")
    """,
    # Gradient views keep the reducer's memory alive.
    "grad_view_after_reducer_close": """
        red = brigade.Reducer(c, [np.zeros(1 << 20, np.float32)], None, grad_as_view=True)
        v = red.grad(0)
        part = v[10:20]
        red.close()
        expect_error(red.prepare, "ERR_INVALID_USAGE", "closed")
        v[:] = 3
        part += 1
        assert float(v.sum()) == 3 * (1 << 20) + 10, v.sum()
        del v
        gc.collect()
        part[:] = 5
        assert float(part.sum()) == 50
    """,
    "grad_view_after_comm_close": """
        red = brigade.Reducer(c, [np.zeros(1 << 19, np.float64)], None, grad_as_view=True)
        v = red.grad(0)
        c.close()
        del red
        gc.collect()
        v[:] = 7
        assert float(v.sum()) == 7 * (1 << 19)
    """,
    "grad_view_of_user_grads": """
        red = brigade.Reducer(c, [None], [np.zeros(16, np.int32)])
        v = red.grad(0)
        red.close()
        gc.collect()
        v[:] = 2
        assert int(v.sum()) == 32
    """,
    # Bad indices get a sentence that names them as given.
    "reducer_bad_index": """
        red = brigade.Reducer(c, [None], [np.zeros(8, np.float32)])
        expect_error(lambda: red.grad(7), "ERR_INVALID_ARGUMENT", "parameter 7 out of range")
        red.prepare()
        expect_error(lambda: red.mark_ready(-1), "ERR_INVALID_ARGUMENT", "parameter -1 out")
        red.close()
    """,
    # Everything in a cycle, collected at once in whatever order.
    "cycle_collected": """
        class Holder: pass
        h = Holder()
        h.c = c
        h.red = brigade.Reducer(c, [np.zeros(4, np.float32)], None, grad_as_view=True)
        h.v = h.red.grad(0)
        h.r = c.irecv(np.zeros(4, np.float32), 0)
        h.self = h
        del h, c
        gc.collect()
    """,
}

PRELUDE = """
import gc, sys
import numpy as np
import brigade

def expect_error(call, status, needle, done=None):
    try:
        got = call()
    except brigade.Error as e:
        assert status is not None, f"unexpected error {e}"
        assert e.status.name == status, f"status {e.status.name}, expected {status}: {e}"
        assert needle in str(e), f"{needle!r} not in {str(e)!r}"
        print("ok:", e)
        return
    if done is not None:
        assert got == done, f"returned {got!r}, expected {done!r}"
        print("ok: returned", got)
        return
    raise AssertionError(f"no error: returned {got!r}")

c = brigade.Communicator.from_env()
"""


def main() -> int:
    try:
        import numpy  # noqa: F401
    except ImportError:
        print(f"skip: NumPy is not installed for {sys.executable}")
        return 77
    names = sys.argv[1:] or list(CASES)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE",
              "SLURM_NTASKS", "SLURM_PROCID"):
        env.pop(k, None)
    pre = env.pop("BRIGADE_PRELOAD", "")
    if pre:
        env["LD_PRELOAD"] = pre
        # CPython's own allocations are not ours to report.
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    failed = []
    for name in names:
        code = PRELUDE + textwrap.dedent(CASES[name]) + "\nprint('done')\n"
        try:
            p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                               text=True, timeout=60)
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = "timeout", str(e.stdout or "") + str(e.stderr or "")
        ok = rc == 0 and "done" in out and "ERROR: AddressSanitizer" not in out
        print(f"{'ok  ' if ok else 'FAIL'} {name} (rc {rc})")
        if not ok:
            failed.append(name)
            print(textwrap.indent(out.strip()[-3000:], "    "))
    print(f"{len(names) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
