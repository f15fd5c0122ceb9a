#!/usr/bin/env python3
"""Hostile values from Python: every integer that crosses into C is checked
against the C parameter's range (ctypes would wrap it: 2**32 + 1 becomes 1),
and inputs brigade cannot reduce faithfully (a masked array, an object
array) are refused with a sentence that says why.

One rank, no launcher, one interpreter; each case is a call and the
exception it must raise (class, status, words of its message). Nothing may
be reported as "Exception ignored" (sys.unraisablehook) along the way.

    py_inputs.py

In a sanitizer build it re-runs itself with the sanitizer's runtime
preloaded (BRIGADE_PRELOAD, set by meson), as py_lifetimes.py's children do.
"""
import os
import sys

pre = os.environ.pop("BRIGADE_PRELOAD", "")
if pre:
    env = dict(os.environ, LD_PRELOAD=pre)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE",
          "SLURM_NTASKS", "SLURM_PROCID"):
    os.environ.pop(k, None)  # one rank of its own

try:
    import numpy as np
except ImportError:
    print(f"skip: NumPy is not installed for {sys.executable}")
    sys.exit(77)

import brigade

unraisable = []
sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value} "
                                                 f"in {u.object!r}")
failed = []


def expect(name, call, exc, *words, status=None):
    try:
        got = call()
    except exc as e:
        msg = str(e)
        bad = [w for w in words if w not in msg]
        if status is not None and getattr(e, "status", None) != status:
            bad.append(f"status {status.name}")
        if bad:
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__} {msg!r} does not say {bad}")
        else:
            print(f"ok   {name}: {type(e).__name__}: {msg}")
        return
    except Exception as e:  # the wrong kind of exception
        failed.append(name)
        print(f"FAIL {name}: {type(e).__name__} {e!r}, expected {exc.__name__}")
        return
    failed.append(name)
    print(f"FAIL {name}: no {exc.__name__}; returned {got!r}")


BAD = brigade.Status.ERR_INVALID_ARGUMENT
Arg = brigade.ArgumentError if hasattr(brigade, "ArgumentError") else brigade.Error
c = brigade.Communicator.from_env()
x = np.ones(4, np.float32)
uid = brigade.get_unique_id()

# Integers into C ints and size_ts.
expect("comm nranks 2**32+1", lambda: brigade.Communicator(2**32 + 1, uid, 0), Arg,
       "nranks 4294967297", "out of range", status=BAD)
expect("comm rank 2**32", lambda: brigade.Communicator(1, uid, 2**32), Arg, "rank 4294967296",
       status=BAD)
expect("comm timeout 2**40", lambda: brigade.Communicator(1, uid, 0, timeout_ms=2**40), Arg,
       "timeout_ms 1099511627776", status=BAD)
expect("comm nranks float", lambda: brigade.Communicator(2.5, uid, 0), TypeError,
       "nranks must be an integer", "float")
expect("split color 2**32+5", lambda: c.split(2**32 + 5), Arg, "color 4294967301",
       "out of range", status=BAD)
expect("split key -2**31-1", lambda: c.split(0, -2**31 - 1), Arg, "key -2147483649", status=BAD)
expect("broadcast root 2**32", lambda: c.broadcast(x, root=2**32), Arg, "root 4294967296",
       status=BAD)
expect("reduce root -2**40", lambda: c.reduce(x, root=-2**40), Arg, "root", status=BAD)
expect("send peer 2**32", lambda: c.send(x, 2**32), ValueError, "peer 4294967296",
       "not a rank")
expect("gather root 2**32", lambda: c.gather(x, root=2**32), ValueError, "root 4294967296")
expect("device_setup 2**32", lambda: c.device_setup(2**32), Arg, "device 4294967296",
       status=BAD)
g = np.zeros(8, np.float32)
expect("reducer bucket_cap_bytes -1", lambda: brigade.Reducer(c, [None], [g],
                                                              bucket_cap_bytes=-1),
       Arg, "bucket_cap_bytes -1", "out of range", status=BAD)
expect("reducer bucket_cap_bytes 1<<70", lambda: brigade.Reducer(c, [None], [g],
                                                                 bucket_cap_bytes=1 << 70),
       Arg, "bucket_cap_bytes 1180591620717411303424", status=BAD)
expect("reducer first_bucket_cap_bytes -5",
       lambda: brigade.Reducer(c, [None], [g], first_bucket_cap_bytes=-5), Arg,
       "first_bucket_cap_bytes -5", status=BAD)
red = brigade.Reducer(c, [None], [g])
red.prepare()
expect("mark_ready -1", lambda: red.mark_ready(-1), brigade.Error, "parameter -1 out of range",
       "1 registered", status=BAD)
expect("mark_ready 2**64", lambda: red.mark_ready(2**64), brigade.Error,
       "parameter 18446744073709551616 out of range", status=BAD)
expect("grad 7", lambda: red.grad(7), brigade.Error, "parameter 7 out of range", status=BAD)
expect("grad_address -1", lambda: red.grad_address(-1), brigade.Error, "parameter -1",
       status=BAD)
expect("bucket_layout -1", lambda: red.bucket_layout(-1), brigade.Error, "bucket -1",
       status=BAD)
expect("broadcast_params root 2**32", lambda: red.broadcast_params(2**32), brigade.Error,
       "root 4294967296", status=BAD)
try:  # the step still works: nothing above marked a parameter ready
    red.mark_ready(0)
    red.finalize()
except brigade.Error as e:
    failed.append("reducer step")
    print(f"FAIL reducer step after the bad indices: {e}")
red.close()

# Inputs brigade cannot reduce as the caller means them.
m = np.ma.masked_array(np.ones(4, np.float32), mask=[0, 1, 0, 0])
expect("masked array", lambda: c.allreduce(m), TypeError, "masked array", "filled")
expect("masked array as output", lambda: c.allreduce(x, out=m), TypeError, "masked array")
expect("object array", lambda: c.allreduce(np.array([1, None], dtype=object)), TypeError,
       "Python objects", "dtype object")
expect("object array with dtype=", lambda: c.allreduce(np.array([1, 2], dtype=object),
                                                       dtype="int64"),
       TypeError, "Python objects")
expect("list", lambda: c.allreduce([1.0, 2.0]), TypeError, "list", "no buffer protocol")
expect("non-contiguous memoryview", lambda: c.allreduce(memoryview(bytearray(16))[::2]),
       ValueError, "not C-contiguous")


class Iface:
    """An array interface whose data are a Python buffer (the NumPy protocol's
    other form), `offset` bytes in."""

    def __init__(self, data, n, offset=0, typestr="<f4"):
        self.data = data
        self.__array_interface__ = {"shape": (n,), "typestr": typestr, "data": data,
                                    "offset": offset, "version": 3}


expect("interface over too short a buffer", lambda: c.allreduce(Iface(bytearray(16), 4, 4)),
       ValueError, "16 bytes from offset 4", "holds 16")
expect("interface over read-only bytes", lambda: c.allreduce(Iface(bytes(16), 4)), ValueError,
       "read-only")
expect("interface over a non-buffer", lambda: c.allreduce(Iface(object(), 4)), TypeError,
       "neither (address, read-only) nor an object with the buffer protocol")
expect("interface with a bad typestr", lambda: c.allreduce(Iface(bytearray(16), 4,
                                                                 typestr="<f")),
       TypeError, "typestr '<f'")
# and one that works: the output is bytes 8..24 of a bytearray
src = np.arange(4, dtype=np.float32) + 1
raw = bytearray(32)
c.allreduce(src, out=Iface(raw, 4, 8))
got = np.frombuffer(raw, np.float32)
if list(got) != [0, 0, 1, 2, 3, 4, 0, 0]:
    failed.append("interface over a buffer")
    print(f"FAIL interface over a buffer: {list(got)}")
else:
    print("ok   interface over a buffer: written at its offset")

c.close()
for u in unraisable:
    print(f"FAIL unraisable exception: {u}")
n = len(failed) + len(unraisable)
print(f"{'all passed' if not n else f'{n} failed'}")
sys.exit(1 if n else 0)
