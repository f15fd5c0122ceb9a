"""brigade: ring-allreduce collectives for Python.

A thin wrapper over brigade's C library (``libbrigade.so``, shipped inside
this package by ``pip install .``). It is written with :mod:`ctypes` rather
than as a C extension: importing it needs no compiler and no Python headers,
one ``.so`` serves every Python version, and the wheel holds exactly the
library that C programs link. The enum values and struct layouts declared in
``brigade._capi`` are checked against ``brigade.h`` by the test suite
(``tests/python/test_abi.py``), so they cannot drift from the header.

Quick use (under ``brigade-run -n 2``, ``torchrun``, ``mpirun`` or ``srun``)::

    import numpy as np, brigade
    with brigade.Communicator.from_env() as comm:
        x = np.full(1000, comm.rank, dtype=np.float32)
        comm.allreduce(x)                 # in place: the sum over ranks
        req = comm.iallreduce(x, op="avg")
        ...                               # compute meanwhile
        req.wait()

Buffers are anything with the buffer protocol, ``__array_interface__``
(NumPy), or CPU torch tensors; they must be C-contiguous. Every failure is a
:class:`brigade.Error` carrying the C status and the library's sentence
(``brg_comm_last_error``). ``brigade.torch`` adds a ``torch.distributed``
backend and a DDP communication hook.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional, Sequence, Union

from . import _capi
from ._buffers import DTypeLike, View, as_view, dtype_of, dtype_size
from ._capi import DType, Op, Status

__all__ = ["Communicator", "DType", "Error", "Op", "Reducer", "Request", "Status", "UniqueId",
           "get_unique_id", "version", "library_path"]

__version__ = "%d.%d.%d" % _capi.VERSION

OpLike = Union[Op, str]


def version() -> str:
    """The version of this package (that of the C library it carries)."""
    return __version__


def library_path() -> str:
    """The path of the libbrigade.so this package loaded."""
    return _capi.library_path()


class Error(RuntimeError):
    """A brigade call failed.

    Attributes:
        status: the :class:`Status` the C call returned.
        message: the library's sentence for it (what failed: which peer,
            which step, which system call), from ``brg_comm_last_error``.
    """

    def __init__(self, status: int, message: str, call: str = ""):
        try:
            self.status: Union[Status, int] = Status(status)
        except ValueError:
            self.status = status
        self.message = message
        self.call = call
        name = self.status.name if isinstance(self.status, Status) else str(status)
        super().__init__(f"{call + ': ' if call else ''}{name}: {message}")


def _status_string(s: int) -> str:
    r = _capi.lib.brg_status_string(s)
    return r.decode() if r else f"status {s}"


def _check(s: int, call: str, comm_handle: Optional[int] = None) -> None:
    if s == Status.SUCCESS:
        return
    msg = _capi.lib.brg_comm_last_error(comm_handle)
    text = msg.decode(errors="replace") if msg else ""
    raise Error(s, text or _status_string(s), call)


def _op_of(op: OpLike) -> Op:
    if isinstance(op, Op):
        return op
    if isinstance(op, str) and op.upper() in Op.__members__:
        return Op[op.upper()]
    raise TypeError(f"brigade: unknown op {op!r}; brigade has sum, prod, min, max, avg")


class UniqueId(bytes):
    """The id rank 0 makes with :func:`get_unique_id` and hands to the others
    (any way: a file, a store, a pipe, pickling); 128 bytes."""

    def __new__(cls, data: bytes) -> "UniqueId":
        if len(data) != _capi.UNIQUE_ID_BYTES:
            raise ValueError(f"brigade: a unique id is {_capi.UNIQUE_ID_BYTES} bytes, "
                             f"not {len(data)}")
        return super().__new__(cls, data)


def get_unique_id() -> UniqueId:
    """A new unique id; this process serves the rendezvous until every rank has
    arrived (``brg_get_unique_id``)."""
    uid = _capi.UniqueIdStruct()
    _check(_capi.lib.brg_get_unique_id(ctypes.byref(uid)), "brg_get_unique_id")
    return UniqueId(bytes(ctypes.string_at(ctypes.addressof(uid), _capi.UNIQUE_ID_BYTES)))


class Request:
    """An asynchronous collective in flight (from :meth:`Communicator.iallreduce`).

    The buffers it was given must stay alive and untouched until
    :meth:`wait` returns or :meth:`test` returns True; the request keeps
    references to them.
    """

    def __init__(self, comm: "Communicator", keep: Sequence[View]):
        self._req = _capi.RequestStruct()
        self._comm = comm
        self._keep = list(keep)
        self._done = False
        self._status = Status.SUCCESS

    def _finish(self, s: int) -> None:
        self._done = True
        self._status = s
        for v in self._keep:
            v.release()
        self._keep = []
        _check(s, "brg_wait", self._comm._handle_or_none())

    def test(self) -> bool:
        """True when the collective has finished (raising :class:`Error` if it failed)."""
        if self._done:
            return True
        done = ctypes.c_int(0)
        s = _capi.lib.brg_test(ctypes.byref(self._req), ctypes.byref(done))
        if not done.value:
            return False
        self._finish(s)
        return True

    def wait(self) -> None:
        """Blocks until the collective has finished; raises :class:`Error` if it failed."""
        if self._done:
            return
        self._finish(_capi.lib.brg_wait(ctypes.byref(self._req)))

    def __del__(self) -> None:
        # The library writes into self._req until the collective is over.
        if not getattr(self, "_done", True):
            try:
                _capi.lib.brg_wait(ctypes.byref(self._req))
            except Exception:
                pass


class Communicator:
    """A group of ranks that run collectives together (``brg_comm``).

    Build it with :meth:`from_env` (under brigade-run, torchrun, mpirun,
    srun; a single rank without any launcher) or with
    ``Communicator(nranks, unique_id, rank)``. Collectives on one
    communicator must be called in the same order on every rank; see the
    README's "Threads" section for calls from several threads.
    """

    def __init__(self, nranks: int, unique_id: bytes, rank: int):
        self._handle: Optional[int] = None
        self._lock = threading.Lock()
        uid = _capi.UniqueIdStruct()
        data = bytes(UniqueId(bytes(unique_id)))
        ctypes.memmove(ctypes.addressof(uid), data, len(data))
        h = ctypes.c_void_p()
        _check(_capi.lib.brg_comm_init(ctypes.byref(h), int(nranks), ctypes.byref(uid), int(rank)),
               "brg_comm_init")
        self._adopt(h)

    @classmethod
    def from_env(cls) -> "Communicator":
        """From a launcher's environment (``brg_comm_init_env``): RANK, WORLD_SIZE,
        MASTER_ADDR, MASTER_PORT (torchrun, brigade-run), OMPI_COMM_WORLD_*
        (mpirun), SLURM_* (srun); BRIGADE_PORT moves the rendezvous off
        MASTER_PORT. With no launcher variable at all: one rank."""
        self = cls.__new__(cls)
        self._handle = None
        self._lock = threading.Lock()
        h = ctypes.c_void_p()
        _check(_capi.lib.brg_comm_init_env(ctypes.byref(h)), "brg_comm_init_env")
        self._adopt(h)
        return self

    def _adopt(self, h: ctypes.c_void_p) -> None:
        self._handle = h.value
        r, n = ctypes.c_int(), ctypes.c_int()
        _check(_capi.lib.brg_comm_rank(self._handle, ctypes.byref(r)), "brg_comm_rank",
               self._handle)
        _check(_capi.lib.brg_comm_size(self._handle, ctypes.byref(n)), "brg_comm_size",
               self._handle)
        self.rank: int = r.value
        self.size: int = n.value

    # ------------------------------------------------------------ lifetime
    def _handle_or_none(self) -> Optional[int]:
        return self._handle

    def _h(self, call: str) -> int:
        if self._handle is None:
            raise Error(Status.ERR_INVALID_USAGE, "the communicator was closed", call)
        return self._handle

    def close(self) -> None:
        """Destroys the communicator (``brg_comm_destroy``); idempotent."""
        h, self._handle = self._handle, None
        if h is not None:
            _check(_capi.lib.brg_comm_destroy(h), "brg_comm_destroy")

    def abort(self) -> None:
        """Makes every call in progress return ERR_ABORTED, here and on the other ranks."""
        _check(_capi.lib.brg_comm_abort(self._h("brg_comm_abort")), "brg_comm_abort", self._handle)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"rank {self.rank} of {self.size}"
        return f"<brigade.Communicator {state}>"

    @property
    def last_error(self) -> str:
        """The sentence of the last failure on this communicator ("" if none)."""
        m = _capi.lib.brg_comm_last_error(self._handle)
        return m.decode(errors="replace") if m else ""

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank has sent to its ring neighbour so far."""
        b = ctypes.c_uint64()
        _check(_capi.lib.brg_comm_bytes_sent(self._h("brg_comm_bytes_sent"), ctypes.byref(b)),
               "brg_comm_bytes_sent", self._handle)
        return b.value

    # ------------------------------------------------------------- buffers
    def _views(self, call: str, send: Any, out: Any, dtype: DTypeLike,
               out_required: bool = True) -> tuple:
        sv = as_view(send, False, "the input")
        ov = sv if out is None or out is send else as_view(out, True, "the output")
        if out is None and sv.readonly:
            sv.release()
            raise ValueError(f"brigade: {call}: the input is read-only and no output was given")
        d = dtype_of(dtype)
        for v, nm in ((sv, "the input"), (ov, "the output")):
            if d is not None:
                es = dtype_size(d)
                if v.nbytes % es:
                    raise ValueError(f"brigade: {call}: {nm} is {v.nbytes} bytes, not a "
                                     f"whole number of {d.name.lower()} elements")
                v.count, v.dtype = v.nbytes // es, d
            elif v.dtype is None:
                raise TypeError(f"brigade: {call}: {nm} is {v.what}; brigade's types are "
                                + ", ".join(x.name.lower() for x in DType)
                                + " (pass dtype= to reinterpret raw bytes)")
        if sv.dtype != ov.dtype:
            raise TypeError(f"brigade: {call}: the input is {sv.dtype.name.lower()} and the "
                            f"output {ov.dtype.name.lower()}; they must match")
        return sv, ov

    @staticmethod
    def _release(*views: View) -> None:
        for v in views:
            v.release()

    # --------------------------------------------------------- collectives
    def allreduce(self, buf: Any, out: Any = None, op: OpLike = "sum",
                  dtype: DTypeLike = None) -> Any:
        """Element-wise reduction over all ranks, into `out` (default: in place
        in `buf`). Returns the output object."""
        o = _op_of(op)
        sv, ov = self._views("allreduce", buf, out, dtype)
        try:
            if ov.count != sv.count:
                raise ValueError(f"brigade: allreduce: the input has {sv.count} elements and "
                                 f"the output {ov.count}; they must be equal")
            h = self._h("brg_allreduce")
            _check(_capi.lib.brg_allreduce(sv.ptr, ov.ptr, sv.count, int(sv.dtype), int(o), h,
                                           None), "brg_allreduce", h)
        finally:
            self._release(sv, ov)
        return buf if out is None else out

    def iallreduce(self, buf: Any, out: Any = None, op: OpLike = "sum",
                   dtype: DTypeLike = None) -> Request:
        """Starts an allreduce on the communicator's progress thread and returns at
        once; :meth:`Request.wait` or :meth:`Request.test` finishes it."""
        o = _op_of(op)
        sv, ov = self._views("iallreduce", buf, out, dtype)
        try:
            if ov.count != sv.count:
                raise ValueError(f"brigade: iallreduce: the input has {sv.count} elements and "
                                 f"the output {ov.count}; they must be equal")
            h = self._h("brg_iallreduce")
            req = Request(self, [sv, ov])
            _check(_capi.lib.brg_iallreduce(sv.ptr, ov.ptr, sv.count, int(sv.dtype), int(o), h,
                                            ctypes.byref(req._req)), "brg_iallreduce", h)
        except BaseException:
            self._release(sv, ov)
            raise
        return req

    def _alloc_like(self, call: str, buf: Any, count: int) -> Any:
        mod = type(buf).__module__
        if mod.startswith("torch"):
            import torch

            return torch.empty(count, dtype=buf.dtype)
        if mod.startswith("numpy"):
            import numpy

            return numpy.empty(count, dtype=buf.dtype)
        raise TypeError(f"brigade: {call}: pass out= (an output buffer) for a "
                        f"{type(buf).__name__} input")

    def reduce_scatter(self, buf: Any, out: Any = None, op: OpLike = "sum",
                       dtype: DTypeLike = None) -> Any:
        """Reduces `buf` (size × n elements) over all ranks; rank r gets block r in
        `out` (n elements; allocated when `buf` is a NumPy array or tensor)."""
        o = _op_of(op)
        if out is None:
            n = as_view(buf, False, "the input")
            total = n.count
            n.release()
            if total % self.size:
                raise ValueError(f"brigade: reduce_scatter: the input has {total} elements, "
                                 f"not a multiple of the {self.size} ranks")
            out = self._alloc_like("reduce_scatter", buf, total // self.size)
        sv, ov = self._views("reduce_scatter", buf, out, dtype)
        try:
            if sv.count != ov.count * self.size:
                raise ValueError(f"brigade: reduce_scatter: the input has {sv.count} elements; "
                                 f"with an output of {ov.count} it must have {self.size} x "
                                 f"{ov.count} = {ov.count * self.size}")
            h = self._h("brg_reduce_scatter")
            _check(_capi.lib.brg_reduce_scatter(sv.ptr, ov.ptr, ov.count, int(sv.dtype), int(o),
                                                h, None), "brg_reduce_scatter", h)
        finally:
            self._release(sv, ov)
        return out

    def all_gather(self, buf: Any, out: Any = None, dtype: DTypeLike = None) -> Any:
        """Every rank's `buf` (n elements each), in rank order, into `out`
        (size × n elements; allocated when `buf` is a NumPy array or tensor)."""
        if out is None:
            n = as_view(buf, False, "the input")
            total = n.count
            n.release()
            out = self._alloc_like("all_gather", buf, total * self.size)
        sv, ov = self._views("all_gather", buf, out, dtype)
        try:
            if ov.count != sv.count * self.size:
                raise ValueError(f"brigade: all_gather: the output has {ov.count} elements; "
                                 f"with an input of {sv.count} it must have {self.size} x "
                                 f"{sv.count} = {sv.count * self.size}")
            h = self._h("brg_all_gather")
            _check(_capi.lib.brg_all_gather(sv.ptr, ov.ptr, sv.count, int(sv.dtype), h, None),
                   "brg_all_gather", h)
        finally:
            self._release(sv, ov)
        return out

    def broadcast(self, buf: Any, root: int = 0, out: Any = None,
                  dtype: DTypeLike = None) -> Any:
        """Rank `root`'s `buf` into every rank's `out` (default: in place)."""
        sv, ov = self._views("broadcast", buf, out, dtype)
        try:
            if ov.count != sv.count:
                raise ValueError(f"brigade: broadcast: the input has {sv.count} elements and "
                                 f"the output {ov.count}; they must be equal")
            h = self._h("brg_broadcast")
            _check(_capi.lib.brg_broadcast(sv.ptr, ov.ptr, sv.count, int(sv.dtype), int(root), h,
                                           None), "brg_broadcast", h)
        finally:
            self._release(sv, ov)
        return buf if out is None else out

    def reduce(self, buf: Any, root: int = 0, out: Any = None, op: OpLike = "sum",
               dtype: DTypeLike = None) -> Any:
        """The reduction over all ranks into rank `root`'s `out` (default: in place);
        other ranks' outputs are left as they were."""
        o = _op_of(op)
        sv, ov = self._views("reduce", buf, out, dtype)
        try:
            if ov.count != sv.count:
                raise ValueError(f"brigade: reduce: the input has {sv.count} elements and "
                                 f"the output {ov.count}; they must be equal")
            h = self._h("brg_reduce")
            _check(_capi.lib.brg_reduce(sv.ptr, ov.ptr, sv.count, int(sv.dtype), int(o),
                                        int(root), h, None), "brg_reduce", h)
        finally:
            self._release(sv, ov)
        return buf if out is None else out

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        h = self._h("brg_barrier")
        _check(_capi.lib.brg_barrier(h), "brg_barrier", h)


from .reducer import Reducer  # noqa: E402  (needs Communicator and Error)
