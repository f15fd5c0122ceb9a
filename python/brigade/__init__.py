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
(NumPy), ``__cuda_array_interface__`` or DLPack, and torch tensors on the
CPU or a CUDA device; they must be C-contiguous. GPU buffers run on a CUDA
stream (``stream=``, or the one the buffer names). Every failure is a
:class:`brigade.Error` carrying the C status and the library's sentence
(``brg_comm_last_error``). ``brigade.torch`` adds a ``torch.distributed``
backend and a DDP communication hook.
"""
from __future__ import annotations

import ctypes
import operator
import threading
from typing import (Any, List, Literal, Optional, Sequence, Set, Tuple, TypeVar, Union, cast,
                    overload)

from . import _capi
from ._buffers import DTypeLike, View, as_view, dtype_of, dtype_size
from ._capi import DType, Op, Status

__all__ = ["ArgumentError", "Communicator", "DType", "Error", "Op", "Reducer", "Request",
           "Status", "UniqueId", "get_unique_id", "version", "library_version", "library_path"]

__version__ = "%d.%d.%d" % _capi.VERSION

# An op by name; the names in upper case are taken too, but do not type-check.
OpName = Literal["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]
OpLike = Union[Op, OpName]
# The call's output is the object given as `out`, else the input (in place)
# or one made like it: a NumPy array for a NumPy array, a tensor for a tensor.
_Buf = TypeVar("_Buf")
_Out = TypeVar("_Out")


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


class ArgumentError(Error, ValueError):
    """An integer argument outside the range of the C parameter it is passed
    to (a C ``int``, a ``size_t``): refused before the call, with the status
    the C library gives a bad argument (ERR_INVALID_ARGUMENT). Being a
    :class:`ValueError` as well, ``except ValueError`` catches it too."""


INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1  # a C int
SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1


def _c_int(value: Any, what: str, call: str, lo: int = INT_MIN, hi: int = INT_MAX) -> int:
    """`value` as an int for a C parameter whose valid range is [lo, hi] (a C
    int unless narrower): ctypes would wrap anything outside it silently
    (2**32 + 1 becomes 1). A non-integer (a float, a str) is a TypeError."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"brigade: {call}: {what} must be an integer, not "
                        f"{type(value).__name__}") from None
    if not lo <= v <= hi:
        raise ArgumentError(Status.ERR_INVALID_ARGUMENT,
                            f"{what} {v} is out of range ({lo} to {hi})", call)
    return v


def _status_string(s: int) -> str:
    r = _capi.lib.brg_status_string(s)
    return str(r.decode()) if r else f"status {s}"


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
    raise TypeError(f"brigade: unknown op {op!r}; brigade has sum, prod, min, max, avg, and "
                    "band, bor, bxor for integers")


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


Stream = Any  # an int handle (cudaStream_t), torch.cuda.Stream, a CuPy or Numba stream, or None


def _stream_handle(stream: Stream) -> Optional[int]:
    """The cudaStream_t of a stream object (0: the legacy default stream)."""
    if stream is None or isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, Numba
        h = getattr(stream, attr, None)
        if h is not None:
            h = getattr(h, "value", h)  # Numba's handle is a ctypes c_void_p
            return int(h or 0)
    raise TypeError(f"brigade: stream= takes a CUDA stream handle (int) or a torch, CuPy or "
                    f"Numba stream, not {type(stream).__name__}")


_owned_lock = threading.RLock()


class _Owned:
    """A C object (a communicator, a reducer) and what depends on it.

    Python never frees what something still uses: ``close`` closes the
    children first (a communicator's reducers), and the C object is
    destroyed once no child is left and nothing pins it (a NumPy view over
    its memory holds a pin until the view and every slice of it are gone).
    Requests dropped while in flight are kept here, buffers and all, until
    they finish or the C object is destroyed (which finishes them).
    """

    def __init__(self, handle: int, destroy: Any, parent: Optional["_Owned"] = None):
        self.handle: Optional[int] = handle
        self._destroy = destroy
        self.parent = parent
        self.children: Set["_Owned"] = set()
        self.pins = 0
        self.orphans: List[Tuple[Any, List[View]]] = []
        self.closing = False
        if parent is not None:
            with _owned_lock:
                parent.children.add(self)

    def close(self) -> int:
        """Python is done with it; returns the destroy's status (SUCCESS when
        the destroy waits for children or pins)."""
        with _owned_lock:
            self.closing = True
            children = list(self.children)
        for ch in children:
            ch.close()
        return self._release()

    def _release(self) -> int:
        with _owned_lock:
            if self.handle is None or self.pins or self.children or not self.closing:
                return Status.SUCCESS
            h, self.handle = self.handle, None
        s = self._destroy(h)
        self.orphans = []  # the destroy finished them
        p = self.parent
        if p is not None:
            with _owned_lock:
                p.children.discard(self)
            p._release()
        return int(s)

    def pin(self) -> "_Pin":
        return _Pin(self)

    def adopt_orphan(self, req: "Request") -> None:
        """A request dropped in flight: its struct and buffers stay until it ends."""
        with _owned_lock:
            live = []
            for o in self.orphans:  # the ones that have finished go now
                done = ctypes.c_int(0)
                _capi.lib.brg_test(ctypes.byref(o[0]), ctypes.byref(done))
                if not done.value:
                    live.append(o)
            live.append((req._req, req._keep))
            self.orphans = live


class _Pin:
    """Keeps an :class:`_Owned` from being destroyed while it lives."""

    def __init__(self, owner: _Owned):
        with _owned_lock:
            owner.pins += 1
        self._owner: Optional[_Owned] = owner

    def __del__(self) -> None:
        owner, self._owner = getattr(self, "_owner", None), None
        if owner is None:
            return
        with _owned_lock:
            owner.pins -= 1
        try:
            owner._release()
        except Exception:
            pass


class Request:
    """A collective in flight (from :meth:`Communicator.iallreduce` and the
    other ``i`` forms).

    The buffers it was given must stay alive and untouched until
    :meth:`wait` returns or :meth:`test` returns True; the request keeps
    references to them. :meth:`wait` returns the call's output object.
    """

    def __init__(self, comm: "Communicator", keep: Sequence[View], result: Any = None,
                 then: Any = None):
        self._req = _capi.RequestStruct()
        self._comm = comm
        self._keep = list(keep)
        self._done = False
        self._status: int = Status.SUCCESS
        self._result = result
        self._then = then  # run once after success (copies out of a staging buffer)

    def _finish(self, s: int) -> None:
        self._done = True
        self._status = s
        for v in self._keep:
            v.release()
        self._keep = []
        _check(s, "brg_wait", self._comm._handle_or_none())
        then, self._then = self._then, None
        if then is not None:
            then()

    def _abandon(self) -> None:
        """The call was refused: nothing is in flight."""
        self._done = True
        for v in self._keep:
            v.release()
        self._keep = []

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

    def wait(self) -> Any:
        """Blocks until the collective has finished and returns its output object;
        raises :class:`Error` if it failed."""
        if not self._done:
            self._finish(_capi.lib.brg_wait(ctypes.byref(self._req)))
        return self._result

    def __del__(self) -> None:
        # The library writes into self._req and the buffers until the call is
        # over: one still in flight is kept by its communicator, without
        # blocking here, until it ends or the communicator is destroyed.
        if getattr(self, "_done", True):
            return
        try:
            done = ctypes.c_int(0)
            _capi.lib.brg_test(ctypes.byref(self._req), ctypes.byref(done))
            core = self._comm._core
            if not done.value and core is not None and core.handle is not None:
                core.adopt_orphan(self)
        except Exception:
            pass


def library_version() -> Tuple[int, int, int]:
    """The version of the libbrigade.so that runs, as (major, minor, patch)
    (``brg_get_version``); :func:`version` is this package's."""
    v = [ctypes.c_int() for _ in range(3)]
    _check(_capi.lib.brg_get_version(*(ctypes.byref(x) for x in v)), "brg_get_version")
    return (v[0].value, v[1].value, v[2].value)


def _p2p(cname: str) -> Any:
    if not _capi.has(cname):
        raise NotImplementedError(f"brigade: {cname} is not in the loaded library "
                                  f"({_capi.library_path()}); point-to-point, all-to-all, "
                                  "gather and scatter need a libbrigade.so that has them")
    return getattr(_capi.lib, cname)


class Communicator:
    """A group of ranks that run collectives together (``brg_comm``).

    Build it with :meth:`from_env` (under brigade-run, torchrun, mpirun,
    srun; a single rank without any launcher), with
    ``Communicator(nranks, unique_id, rank)``, or with :meth:`split`.
    Collectives on one communicator must be called in the same order on
    every rank; see docs/api.md, "Threads", for calls from several
    threads.

    GPU buffers (torch CUDA tensors, ``__cuda_array_interface__``, DLPack on
    kDLCUDA) go to brigade's device collectives with a CUDA stream: the
    ``stream=`` argument, else the stream the buffer names (its interface's
    ``stream``; torch's current stream for a CUDA tensor), else the legacy
    default stream. The call returns once the work is queued on that stream,
    as NCCL's do; the buffers must live until the stream has run it. The
    non-blocking ``i`` forms take host buffers only.
    """

    def __init__(self, nranks: int, unique_id: bytes, rank: int,
                 timeout_ms: Optional[int] = None, transports: Optional[str] = None):
        """`timeout_ms` and `transports` are ``brg_comm_config``'s fields (None:
        the environment's BRIGADE_TIMEOUT_MS / BRIGADE_TRANSPORTS)."""
        self._handle: Optional[int] = None
        self._core: Optional[_Owned] = None
        self._lock = threading.Lock()
        uid = _capi.UniqueIdStruct()
        data = bytes(UniqueId(bytes(unique_id)))
        ctypes.memmove(ctypes.addressof(uid), data, len(data))
        h = ctypes.c_void_p()
        call = "brg_comm_init_config"
        n = _c_int(nranks, "nranks", call, 1)
        r = _c_int(rank, "rank", call, 0, n - 1)
        t = _capi.CONFIG_UNSET if timeout_ms is None else _c_int(timeout_ms, "timeout_ms", call)
        cfg = _capi.CommConfig(ctypes.sizeof(_capi.CommConfig), _capi.COMM_CONFIG_VERSION, t,
                               None if transports is None else transports.encode())
        _check(_capi.lib.brg_comm_init_config(ctypes.byref(h), n, ctypes.byref(uid), r,
                                              ctypes.byref(cfg)),
               "brg_comm_init_config")
        self._adopt(h)

    @classmethod
    def from_env(cls) -> "Communicator":
        """From a launcher's environment (``brg_comm_init_env``): RANK, WORLD_SIZE,
        MASTER_ADDR, MASTER_PORT (torchrun, brigade-run), OMPI_COMM_WORLD_*
        (mpirun), SLURM_* (srun); BRIGADE_PORT moves the rendezvous off
        MASTER_PORT. With no launcher variable at all: one rank."""
        self = cls.__new__(cls)
        self._handle = None
        self._core = None
        self._lock = threading.Lock()
        h = ctypes.c_void_p()
        _check(_capi.lib.brg_comm_init_env(ctypes.byref(h)), "brg_comm_init_env")
        self._adopt(h)
        return self

    def _adopt(self, h: ctypes.c_void_p) -> None:
        assert h.value, "the library returned SUCCESS and no communicator"
        self._handle = h.value
        self._core = _Owned(h.value, _capi.lib.brg_comm_destroy)
        r, n = ctypes.c_int(), ctypes.c_int()
        _check(_capi.lib.brg_comm_rank(self._handle, ctypes.byref(r)), "brg_comm_rank",
               self._handle)
        _check(_capi.lib.brg_comm_size(self._handle, ctypes.byref(n)), "brg_comm_size",
               self._handle)
        self.rank: int = r.value
        self.size: int = n.value

    def split(self, color: Optional[int], key: Optional[int] = None) -> Optional["Communicator"]:
        """A collective over this communicator (``brg_comm_split``): the ranks that
        pass the same `color` form a new communicator, ranked by (`key`, rank
        here; `key` defaults to this rank). A rank passing ``None`` takes part
        and gets ``None``. The new communicator is independent of this one
        once made and has its timeout and transports."""
        c = _capi.SPLIT_NOCOLOR if color is None else _c_int(color, "color", "brg_comm_split")
        k = self.rank if key is None else _c_int(key, "key", "brg_comm_split")
        h = self._h("brg_comm_split")
        out = ctypes.c_void_p()
        # brg_comm_split reports through the process-wide last error (comm NULL).
        _check(_capi.lib.brg_comm_split(h, c, k, ctypes.byref(out)), "brg_comm_split")
        if not out.value:
            return None
        new = Communicator.__new__(Communicator)
        new._handle = None
        new._core = None
        new._lock = threading.Lock()
        new._adopt(out)
        return new

    # ------------------------------------------------------------ lifetime
    def _handle_or_none(self) -> Optional[int]:
        return self._handle

    def _h(self, call: str) -> int:
        if self._handle is None:
            raise Error(Status.ERR_INVALID_USAGE, "the communicator was closed", call)
        return self._handle

    def close(self) -> None:
        """Destroys the communicator (``brg_comm_destroy``); idempotent.

        Its reducers are closed first, and every request still outstanding
        finishes (as aborted). Later calls on it, and on its reducers, raise
        :class:`Error`. While a NumPy view of a reducer's memory
        (:meth:`Reducer.grad`) lives, the C objects stay until it goes."""
        h, self._handle = self._handle, None
        core = getattr(self, "_core", None)
        if h is not None and core is not None:
            _check(core.close(), "brg_comm_destroy")

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
        return str(m.decode(errors="replace")) if m else ""

    @property
    def async_error(self) -> Status:
        """The error that stopped the communicator (a queued collective that failed
        after its call returned), or ``Status.SUCCESS`` while it works
        (``brg_comm_get_async_error``); :attr:`last_error` says why."""
        s = ctypes.c_int()
        h = self._h("brg_comm_get_async_error")
        _check(_capi.lib.brg_comm_get_async_error(h, ctypes.byref(s)),
               "brg_comm_get_async_error", h)
        try:
            return Status(s.value)
        except ValueError:
            return s.value  # type: ignore[return-value]

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank has sent to its ring neighbour so far."""
        b = ctypes.c_uint64()
        _check(_capi.lib.brg_comm_bytes_sent(self._h("brg_comm_bytes_sent"), ctypes.byref(b)),
               "brg_comm_bytes_sent", self._handle)
        return b.value

    def device_setup(self, device: int = -1) -> None:
        """Sets up the device collectives on GPU ``device`` (-1: the current
        one) now, on every rank, so that the first one may be captured in a
        CUDA graph (``brg_comm_device_setup``)."""
        d = _c_int(device, "device", "brg_comm_device_setup")
        _check(_capi.lib.brg_comm_device_setup(self._h("brg_comm_device_setup"), d),
               "brg_comm_device_setup", self._handle)

    # ------------------------------------------------------------- buffers
    def _views(self, call: str, send: Any, out: Any, dtype: DTypeLike,
               stream: Optional[int] = None,
               out_required: bool = True) -> Tuple[View, View]:
        sv = as_view(send, False, "the input", stream)
        try:
            ov = sv if out is None or out is send else as_view(out, True, "the output", stream)
        except BaseException:
            sv.release()
            raise
        try:
            self._typecheck(call, sv, ov, dtype, out is None)
        except BaseException:
            self._release(sv, ov)
            raise
        return sv, ov

    @staticmethod
    def _typecheck(call: str, sv: View, ov: View, dtype: DTypeLike, in_place: bool) -> None:
        if in_place and sv.readonly:
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
            raise TypeError(f"brigade: {call}: the input is {sv.type_name()} and the "
                            f"output {ov.type_name()}; they must match")

    @staticmethod
    def _release(*views: View) -> None:
        for v in views:
            v.release()

    @staticmethod
    def _stream_of(views: Sequence[View], stream: Optional[int]) -> Optional[int]:
        """The brg_stream to pass: the caller's, else the GPU buffer's own, else
        NULL (host buffers; for GPU buffers the legacy default stream)."""
        if stream is None and any(v.device for v in views):
            stream = next((v.stream for v in views if v.stream is not None), None)
        return stream or None

    def _launch(self, cname: str, views: Sequence[View], args: Tuple[Any, ...], nb: bool,
                result: Any,
                stream: Optional[int], then: Any = None) -> Any:
        """Runs the C call `cname`(*args, comm, stream) or, with nb, its
        non-blocking form (*args, comm, request); releases the views when the
        buffers are no longer used."""
        h = self._h(cname)
        fn = _p2p(cname) if cname in _capi.OPTIONAL else getattr(_capi.lib, cname)
        if nb:
            req = Request(self, views, result, then)
            try:
                _check(fn(*args, h, ctypes.byref(req._req)), cname, h)
            except BaseException:
                req._abandon()
                raise
            return req
        try:
            if cname == "brg_barrier":
                _check(fn(h), cname, h)
            else:
                _check(fn(*args, h, self._stream_of(views, stream)), cname, h)
        finally:
            self._release(*views)
        if then is not None:
            then()
        return result

    # --------------------------------------------------------- collectives
    def _allreduce(self, nb: bool, buf: Any, out: Any, op: OpLike, dtype: DTypeLike,
                   stream: Stream) -> Any:
        call = "iallreduce" if nb else "allreduce"
        o = _op_of(op)
        s = _stream_handle(stream)
        sv, ov = self._views(call, buf, out, dtype, s)
        if ov.count != sv.count:
            self._release(sv, ov)
            raise ValueError(f"brigade: {call}: the input has {sv.count} elements and "
                             f"the output {ov.count}; they must be equal")
        return self._launch("brg_" + call, [sv, ov],
                            (sv.ptr, ov.ptr, sv.count, sv.code(), int(o)), nb,
                            buf if out is None else out, s)

    @overload
    def allreduce(self, buf: _Buf, out: None = None, op: OpLike = "sum", dtype: DTypeLike = None,
                  stream: Stream = None) -> _Buf: ...

    @overload
    def allreduce(self, buf: Any, out: _Out, op: OpLike = "sum", dtype: DTypeLike = None,
                  stream: Stream = None) -> _Out: ...

    def allreduce(self, buf: Any, out: Any = None, op: OpLike = "sum",
                  dtype: DTypeLike = None, stream: Stream = None) -> Any:
        """Element-wise reduction over all ranks, into `out` (default: in place
        in `buf`). Returns the output object."""
        return self._allreduce(False, buf, out, op, dtype, stream)

    def iallreduce(self, buf: Any, out: Any = None, op: OpLike = "sum",
                   dtype: DTypeLike = None) -> Request:
        """Starts an allreduce on the communicator's progress thread and returns at
        once; :meth:`Request.wait` or :meth:`Request.test` finishes it."""
        return cast(Request, self._allreduce(True, buf, out, op, dtype, None))

    def _alloc_like(self, call: str, buf: Any, count: int) -> Any:
        mod = type(buf).__module__
        if mod.startswith("torch") and hasattr(buf, "device"):
            import torch

            return torch.empty(count, dtype=buf.dtype, device=buf.device)
        if mod.startswith("numpy"):
            import numpy

            return numpy.empty(count, dtype=buf.dtype)
        raise TypeError(f"brigade: {call}: pass out= (an output buffer) for a "
                        f"{type(buf).__name__} input")

    def _count(self, buf: Any) -> int:
        v = as_view(buf, False, "the input")
        n = v.count
        v.release()
        return n

    def _block_views(self, call: str, what: str, buf: Any, out: Any, dtype: DTypeLike,
                     s: Any, split: bool) -> Any:
        """Views of a buffer of one block per rank and of one of one block:
        the input is the long one when `split` (it is cut into the blocks),
        the output when not (it joins them). The output is made like the
        input when None. Returns (sv, ov, out)."""
        if out is None:
            total = self._count(buf)
            if split and total % self.size:
                raise ValueError(f"brigade: {call}: {what} has {total} elements, "
                                 f"not a multiple of the {self.size} ranks")
            out = self._alloc_like(call, buf,
                                   total // self.size if split else total * self.size)
        sv, ov = self._views(call, buf, out, dtype, s)
        long, one, other = (sv, ov, "an output") if split else (ov, sv, "an input")
        if long.count != one.count * self.size:
            self._release(sv, ov)
            raise ValueError(f"brigade: {call}: {what} has {long.count} elements; "
                             f"with {other} of {one.count} it must have {self.size} x "
                             f"{one.count} = {one.count * self.size}")
        return sv, ov, out

    def _reduce_scatter(self, nb: bool, buf: Any, out: Any, op: OpLike, dtype: DTypeLike,
                        stream: Stream) -> Any:
        call = "ireduce_scatter" if nb else "reduce_scatter"
        o = _op_of(op)
        s = _stream_handle(stream)
        sv, ov, out = self._block_views(call, "the input", buf, out, dtype, s, True)
        return self._launch("brg_" + call, [sv, ov],
                            (sv.ptr, ov.ptr, ov.count, sv.code(), int(o)), nb, out, s)

    @overload
    def reduce_scatter(self, buf: _Buf, out: None = None, op: OpLike = "sum",
                       dtype: DTypeLike = None, stream: Stream = None) -> _Buf: ...

    @overload
    def reduce_scatter(self, buf: Any, out: _Out, op: OpLike = "sum",
                       dtype: DTypeLike = None, stream: Stream = None) -> _Out: ...

    def reduce_scatter(self, buf: Any, out: Any = None, op: OpLike = "sum",
                       dtype: DTypeLike = None, stream: Stream = None) -> Any:
        """Reduces `buf` (size × n elements) over all ranks; rank r gets block r in
        `out` (n elements; allocated when `buf` is a NumPy array or tensor)."""
        return self._reduce_scatter(False, buf, out, op, dtype, stream)

    def ireduce_scatter(self, buf: Any, out: Any = None, op: OpLike = "sum",
                        dtype: DTypeLike = None) -> Request:
        """:meth:`reduce_scatter`, started and returned at once (``brg_ireduce_scatter``)."""
        return cast(Request, self._reduce_scatter(True, buf, out, op, dtype, None))

    def _all_gather(self, nb: bool, buf: Any, out: Any, dtype: DTypeLike, stream: Stream) -> Any:
        call = "iall_gather" if nb else "all_gather"
        s = _stream_handle(stream)
        sv, ov, out = self._block_views(call, "the output", buf, out, dtype, s, False)
        return self._launch("brg_" + call, [sv, ov], (sv.ptr, ov.ptr, sv.count, sv.code()),
                            nb, out, s)

    @overload
    def all_gather(self, buf: _Buf, out: None = None, dtype: DTypeLike = None,
                   stream: Stream = None) -> _Buf: ...

    @overload
    def all_gather(self, buf: Any, out: _Out, dtype: DTypeLike = None,
                   stream: Stream = None) -> _Out: ...

    def all_gather(self, buf: Any, out: Any = None, dtype: DTypeLike = None,
                   stream: Stream = None) -> Any:
        """Every rank's `buf` (n elements each), in rank order, into `out`
        (size × n elements; allocated when `buf` is a NumPy array or tensor)."""
        return self._all_gather(False, buf, out, dtype, stream)

    def iall_gather(self, buf: Any, out: Any = None, dtype: DTypeLike = None) -> Request:
        """:meth:`all_gather`, started and returned at once (``brg_iall_gather``)."""
        return cast(Request, self._all_gather(True, buf, out, dtype, None))

    def _rooted(self, nb: bool, what: str, buf: Any, root: int, out: Any, op: Optional[OpLike],
                dtype: DTypeLike, stream: Stream) -> Any:
        call = ("i" if nb else "") + what
        o = _op_of(op) if op is not None else None
        root = _c_int(root, "root", "brg_" + call)  # the library says whether it is a rank
        s = _stream_handle(stream)
        sv, ov = self._views(call, buf, out, dtype, s)
        if ov.count != sv.count:
            self._release(sv, ov)
            raise ValueError(f"brigade: {call}: the input has {sv.count} elements and "
                             f"the output {ov.count}; they must be equal")
        args = (sv.ptr, ov.ptr, sv.count, sv.code()) + ((int(o),) if o is not None else ()) \
            + (root,)
        return self._launch("brg_" + call, [sv, ov], args, nb, buf if out is None else out, s)

    @overload
    def broadcast(self, buf: _Buf, root: int = 0, out: None = None,
                  dtype: DTypeLike = None, stream: Stream = None) -> _Buf: ...

    @overload
    def broadcast(self, buf: Any, root: int = 0, *, out: _Out,
                  dtype: DTypeLike = None, stream: Stream = None) -> _Out: ...

    def broadcast(self, buf: Any, root: int = 0, out: Any = None,
                  dtype: DTypeLike = None, stream: Stream = None) -> Any:
        """Rank `root`'s `buf` into every rank's `out` (default: in place)."""
        return self._rooted(False, "broadcast", buf, root, out, None, dtype, stream)

    def ibroadcast(self, buf: Any, root: int = 0, out: Any = None,
                   dtype: DTypeLike = None) -> Request:
        """:meth:`broadcast`, started and returned at once (``brg_ibroadcast``)."""
        return cast(Request, self._rooted(True, "broadcast", buf, root, out, None, dtype, None))

    @overload
    def reduce(self, buf: _Buf, root: int = 0, out: None = None,
               op: OpLike = "sum", dtype: DTypeLike = None, stream: Stream = None) -> _Buf: ...

    @overload
    def reduce(self, buf: Any, root: int = 0, *, out: _Out,
               op: OpLike = "sum", dtype: DTypeLike = None, stream: Stream = None) -> _Out: ...

    def reduce(self, buf: Any, root: int = 0, out: Any = None, op: OpLike = "sum",
               dtype: DTypeLike = None, stream: Stream = None) -> Any:
        """The reduction over all ranks into rank `root`'s `out` (default: in place);
        other ranks' outputs are left as they were."""
        return self._rooted(False, "reduce", buf, root, out, op, dtype, stream)

    def ireduce(self, buf: Any, root: int = 0, out: Any = None, op: OpLike = "sum",
                dtype: DTypeLike = None) -> Request:
        """:meth:`reduce`, started and returned at once (``brg_ireduce``)."""
        return cast(Request, self._rooted(True, "reduce", buf, root, out, op, dtype, None))

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        self._launch("brg_barrier", [], (), False, None, None)

    def ibarrier(self) -> Request:
        """A barrier that returns at once; the request completes once every rank
        has called it (``brg_ibarrier``)."""
        return cast(Request, self._launch("brg_ibarrier", [], (), True, None, None))

    # --------------------------------------------- point-to-point, all-to-all
    def _p2p_call(self, nb: bool, what: str, buf: Any, peer: int, dtype: DTypeLike,
                  stream: Stream, tag: int = 0) -> Any:
        call = ("i" if nb else "") + what
        s = _stream_handle(stream)
        v = as_view(buf, what == "recv", "the buffer", s)
        try:
            if what == "recv" and v.readonly:
                raise ValueError(f"brigade: {call}: the buffer is read-only")
            self._typecheck(call, v, v, dtype, False)
            peer = self._rank_arg(call, "peer", peer)
            tag = _c_int(tag, "tag", call, 0)
        except BaseException:
            v.release()
            raise
        if tag == 0:  # the untagged calls, which older libraries have too
            return self._launch("brg_" + call, [v], (v.ptr, v.count, v.code(), peer), nb,
                                buf, s)
        return self._launch("brg_" + call + "_tagged", [v], (v.ptr, v.count, v.code(), peer, tag),
                            nb, buf, s)

    def send(self, buf: Any, peer: int, dtype: DTypeLike = None, stream: Stream = None,
             tag: int = 0) -> None:
        """Sends `buf` to rank `peer`, which calls :meth:`recv` with as many
        elements and the same `tag` (``brg_send``; ``brg_send_tagged``).
        Returns once `buf` may be reused."""
        self._p2p_call(False, "send", buf, peer, dtype, stream, tag)

    def recv(self, buf: Any, peer: int, dtype: DTypeLike = None, stream: Stream = None,
             tag: int = 0) -> Any:
        """Receives into `buf` the next message of `tag` that rank `peer`
        sends it (``brg_recv``; ``brg_recv_tagged``: messages are matched in
        order per (peer, tag)); returns `buf`."""
        return self._p2p_call(False, "recv", buf, peer, dtype, stream, tag)

    def isend(self, buf: Any, peer: int, dtype: DTypeLike = None, tag: int = 0) -> Request:
        """:meth:`send`, started and returned at once (``brg_isend``)."""
        return cast(Request, self._p2p_call(True, "send", buf, peer, dtype, None, tag))

    def irecv(self, buf: Any, peer: int, dtype: DTypeLike = None, tag: int = 0) -> Request:
        """:meth:`recv`, started and returned at once (``brg_irecv``)."""
        return cast(Request, self._p2p_call(True, "recv", buf, peer, dtype, None, tag))

    def all_to_all(self, buf: Any, out: Any = None, dtype: DTypeLike = None,
                   stream: Stream = None) -> Any:
        """Block j of `buf` (size × n elements) to rank j; block j of `out` from
        rank j (``brg_all_to_all``). `out` is allocated like `buf` when
        omitted; ``out=buf`` exchanges in place."""
        s = _stream_handle(stream)
        if out is None:
            out = self._alloc_like("all_to_all", buf, self._count(buf))
        sv, ov = self._views("all_to_all", buf, None if out is buf else out, dtype, s)
        if sv.count % self.size or ov.count != sv.count:
            self._release(sv, ov)
            raise ValueError(f"brigade: all_to_all: the input has {sv.count} elements and the "
                             f"output {ov.count}; both must be {self.size} blocks of n "
                             "elements")
        return self._launch("brg_all_to_all", [sv, ov],
                            (sv.ptr, ov.ptr, sv.count // self.size, sv.code()), False, out,
                            s)

    # ------------------------------------------------------ gather, scatter
    def _gather(self, nb: bool, buf: Any, root: int, out: Any, dtype: DTypeLike) -> Any:
        call = "igather" if nb else "gather"
        root = self._check_root(call, root)
        is_root = self.rank == root
        if not is_root:
            sv = as_view(buf, False, "the input")
            try:
                self._typecheck(call, sv, sv, dtype, False)
            except BaseException:
                sv.release()
                raise
            return self._launch("brg_" + call, [sv], (sv.ptr, None, sv.count, sv.code(),
                                                      root), nb, None, None)
        sv, ov, out = self._block_views(call, "the root's output", buf, out, dtype, None, False)
        return self._launch("brg_" + call, [sv, ov],
                            (sv.ptr, ov.ptr, sv.count, sv.code(), root), nb, out, None)

    def gather(self, buf: Any, root: int = 0, out: Any = None, dtype: DTypeLike = None) -> Any:
        """Every rank's `buf` (n elements each), in rank order, into rank
        `root`'s `out` (size × n elements; allocated when `buf` is a NumPy
        array or tensor) (``brg_gather``). Returns `out` on the root, None on
        the other ranks, whose `out` is not used."""
        return self._gather(False, buf, root, out, dtype)

    def igather(self, buf: Any, root: int = 0, out: Any = None,
                dtype: DTypeLike = None) -> Request:
        """:meth:`gather`, started and returned at once (``brg_igather``)."""
        return cast(Request, self._gather(True, buf, root, out, dtype))

    def _scatter(self, nb: bool, buf: Any, root: int, out: Any, dtype: DTypeLike) -> Any:
        call = "iscatter" if nb else "scatter"
        root = self._check_root(call, root)
        if self.rank != root:
            if out is None:
                if buf is None:
                    raise ValueError(f"brigade: {call}: pass out= (the block to receive) on "
                                     "the ranks other than the root")
                out = self._alloc_like(call, buf, self._count(buf) // self.size)
            ov = as_view(out, True, "the output")
            try:
                if ov.readonly:
                    raise ValueError(f"brigade: {call}: the output is read-only")
                self._typecheck(call, ov, ov, dtype, False)
            except BaseException:
                ov.release()
                raise
            return self._launch("brg_" + call, [ov], (None, ov.ptr, ov.count, ov.code(),
                                                      root), nb, out, None)
        sv, ov, out = self._block_views(call, "the root's input", buf, out, dtype, None, True)
        return self._launch("brg_" + call, [sv, ov],
                            (sv.ptr, ov.ptr, ov.count, sv.code(), root), nb, out, None)

    def scatter(self, buf: Any, root: int = 0, out: Any = None, dtype: DTypeLike = None) -> Any:
        """Block j of rank `root`'s `buf` (size × n elements) into rank j's
        `out` (n elements; allocated like `buf` when omitted) (``brg_scatter``).
        The other ranks' `buf` is not used (None is fine when `out` is given).
        Returns `out`."""
        return self._scatter(False, buf, root, out, dtype)

    def iscatter(self, buf: Any, root: int = 0, out: Any = None,
                 dtype: DTypeLike = None) -> Request:
        """:meth:`scatter`, started and returned at once (``brg_iscatter``)."""
        return cast(Request, self._scatter(True, buf, root, out, dtype))

    def _check_root(self, call: str, root: int) -> int:
        return self._rank_arg(call, "root", root)

    def _rank_arg(self, call: str, what: str, value: Any) -> int:
        """A rank of this communicator, as an int (ValueError otherwise)."""
        try:
            v = operator.index(value)
        except TypeError:
            v = None
        if v is None or not 0 <= v < self.size:
            raise ValueError(f"brigade: {call}: {what} {value!r} is not a rank of this "
                             f"communicator (0 to {self.size - 1})")
        return v


from .reducer import Reducer  # noqa: E402  (needs Communicator and Error)
