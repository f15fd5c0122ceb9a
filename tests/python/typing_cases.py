"""Checked by mypy --strict (run_mypy.py), never run: what a type checker
must refuse in a program using brigade. Each refused line carries an
ignore comment for the error it must raise; --strict warns about an
ignore that is not needed, so a call that type-checks fails the run."""
from typing import Any

import numpy as np

import brigade


def uses(comm: brigade.Communicator) -> None:
    x = np.zeros(4, np.float32)
    comm.allreduce(x, op="avg")
    comm.allreduce(x, op=brigade.Op.MAX, dtype="bfloat16")
    comm.allreduce(x, op="mean")  # type: ignore[call-overload]
    comm.allreduce(x, dtype="int16")  # type: ignore[call-overload]
    comm.reduce(x, root="0")  # type: ignore[call-overload]
    r: brigade.Request = comm.iallreduce(x)
    r.wait()


def outputs(comm: brigade.Communicator) -> None:
    """The output's type is the input's (or out='s): NumPy stays NumPy."""
    x = np.zeros(8, np.float32)
    y: "np.ndarray[Any, np.dtype[np.float32]]" = comm.allreduce(x)
    z: bytearray = comm.allreduce(x, out=bytearray(32))
    w: bytearray = comm.allreduce(x)  # type: ignore[assignment]
    g: "np.ndarray[Any, np.dtype[np.float32]]" = comm.all_gather(x)
    b: bytearray = comm.broadcast(bytearray(8), 0)
    del y, z, w, g, b
