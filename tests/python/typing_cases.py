"""Checked by mypy --strict (run_mypy.py), never run: what a type checker
must refuse in a program using brigade. Each refused line carries an
ignore comment for the error it must raise; --strict warns about an
ignore that is not needed, so a call that type-checks fails the run."""
import numpy as np

import brigade


def uses(comm: brigade.Communicator) -> None:
    x = np.zeros(4, np.float32)
    comm.allreduce(x, op="avg")
    comm.allreduce(x, op=brigade.Op.MAX, dtype="bfloat16")
    comm.allreduce(x, op="mean")  # type: ignore[arg-type]
    comm.allreduce(x, dtype="int16")  # type: ignore[arg-type]
    comm.reduce(x, root="0")  # type: ignore[arg-type]
    r: brigade.Request = comm.iallreduce(x)
    r.wait()
