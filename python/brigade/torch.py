"""brigade for PyTorch: a torch.distributed backend and a DDP communication hook.

Importing this module registers the backend "brigade"::

    import torch.distributed as dist
    import brigade.torch  # noqa: F401  (registers "brigade")
    dist.init_process_group("brigade")  # torchrun, or MASTER_ADDR/PORT, RANK, WORLD_SIZE
    model = torch.nn.parallel.DistributedDataParallel(model)

The process group runs allreduce (and all_reduce_coalesced), reduce_scatter,
all_gather, broadcast, reduce, barrier, gather, scatter, send/recv
(isend/irecv with tags, batch_isend_irecv, recv from any source) and
all_to_all (all_to_all_single with any splits, all_to_all on lists) through
brigade, on CPU tensors and CUDA tensors (the latter on
torch's current stream; gather and scatter wait for it and are staged
through host memory; point-to-point and all-to-all on the CPU only, as
brigade's calls), contiguous or not (a non-contiguous
tensor goes through a contiguous copy, as with Gloo). Reduce ops: SUM,
PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR on integer tensors, and PREMUL_SUM
where torch shows its factor (2.x); int16, bool and complex tensors too
(_reduction says how). Every failure raises from the call, from
Work.wait() and from the Work's future; a failed collective breaks the
group, whose later calls raise naming it. Every other call raises
NotImplementedError naming the call. Brigade's unique id goes through the c10d store the group
is given, so brigade needs no port of its own (MASTER_PORT stays c10d's).

For users who keep Gloo or NCCL as the backend and want brigade only for
DDP's gradient allreduce, :func:`allreduce_hook` is a DDP communication
hook::

    comm = brigade.torch.communicator()  # over the default (e.g. Gloo) group
    ddp.register_comm_hook(comm, brigade.torch.allreduce_hook)

Tested with Debian 12's python3-torch 1.13.1 and PyPI's torch 2.15.0, on the
CPU. Debian's torchrun 1.13 crashes under Python 3.11 in ``to_map`` unless
given ``--redirects 2 --tee 2`` (a torch bug, fixed in later releases).
"""
# The type: ignore comments below answer the stubs of one torch release or
# another (1.13's lack names that 2.x has; 2.x declares ProcessGroup's calls
# with overloads that a Python backend's signatures do not follow): an
# ignore that one release needs is unused under another.
# mypy: warn-unused-ignores=False
import collections
import ctypes
import functools
import queue
import threading
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence, TypeVar, cast

import torch
import torch.distributed as dist

import brigade

__all__ = ["ProcessGroupBrigade", "allreduce_hook", "communicator", "BACKEND_NAME"]

BACKEND_NAME = "brigade"
_STORE_KEY = "brigade/unique_id"

_OPS = (("SUM", "sum"), ("PRODUCT", "prod"), ("MIN", "min"), ("MAX", "max"), ("AVG", "avg"),
        ("BAND", "band"), ("BOR", "bor"), ("BXOR", "bxor"))


def _op_name(reduce_op: Any) -> str:
    """torch's name of a ReduceOp ("PREMUL_SUM"), whatever form it comes in."""
    for x in (reduce_op, getattr(reduce_op, "op", None)):
        name = getattr(x, "name", None)
        if isinstance(name, str):
            return name
    R = dist.ReduceOp
    for name in dir(R):
        if name.isupper() and not name.startswith("_"):
            try:
                if reduce_op == getattr(R, name):
                    return name
            except (TypeError, RuntimeError):
                pass
    return type(reduce_op).__name__


def _op(reduce_op: Any) -> brigade.OpName:
    R = dist.ReduceOp
    for name, ours in _OPS:
        if hasattr(R, name) and reduce_op == getattr(R, name):
            return cast(brigade.OpName, ours)
    name = _op_name(reduce_op)
    why = (" (its factor is not visible to a backend written in Python)"
           if name == "PREMUL_SUM" else "")
    raise NotImplementedError(f"brigade: reduce op {name}{why}; brigade has SUM, PRODUCT, MIN, "
                              "MAX, AVG, and BAND, BOR, BXOR on integer tensors")


# Types brigade has no name for, moved as bytes of one it has (calls that
# only move data: broadcast, gather, send ...); complex as pairs of reals.
_RAW = {torch.bool: torch.uint8, torch.int16: torch.float16}


def _raw(t: torch.Tensor) -> torch.Tensor:
    """t, or a view of its bytes in a type brigade moves."""
    if t.is_complex():
        return torch.view_as_real(t)
    d = _RAW.get(t.dtype)
    return t if d is None else t.view(d)


# bool reduces as uint8 0/1, as NCCL's backend does: SUM and MAX are a
# logical or, PRODUCT and MIN a logical and; AVG has no meaning.
_BOOL_OPS = {"sum": "max", "max": "max", "bor": "max", "prod": "min", "min": "min",
             "band": "min", "bxor": "bxor"}


def _reduction(t: torch.Tensor, reduce_op: Any, call: str,
               scale: bool = True) -> Any:
    """What brigade reduces for t with torch's reduce_op: (a tensor of a type
    brigade reduces, brigade's op, what copies the result back into t or
    None). int16 goes through an int32 copy (the result wraps as int16
    arithmetic does), bool through a uint8 view (_BOOL_OPS), complex through
    a view as pairs of reals (SUM and AVG only). PREMUL_SUM (torch 2.x:
    dist._make_nccl_premul_sum(factor)) sums a copy of t times the factor;
    with `scale` False (an output) only the op is taken from it."""
    name = _op_name(reduce_op)
    factor = None
    if name == "PREMUL_SUM":
        factor = getattr(reduce_op, "factor", None)
        if factor is None:
            raise NotImplementedError(f"brigade: {call}: reduce op PREMUL_SUM: this torch "
                                      "(1.13) does not show a backend written in Python its "
                                      "factor (torch 2.x does)")
        op: brigade.OpName = "sum"
    else:
        op = _op(reduce_op)
    back = None
    if t.is_complex():
        if op not in ("sum", "avg"):
            raise ValueError(f"brigade: {call}: reduce op {name} on {t.dtype}: complex numbers "
                             "reduce as pairs of reals, with SUM, AVG and PREMUL_SUM only")
        w = torch.view_as_real(t)
    elif t.dtype == torch.bool:
        if op not in _BOOL_OPS or factor is not None:
            raise ValueError(f"brigade: {call}: reduce op {name} on torch.bool (bool has SUM "
                             "and MAX as or, PRODUCT and MIN as and, BAND, BOR, BXOR)")
        op = cast(brigade.OpName, _BOOL_OPS[op])
        w = t.view(torch.uint8)
    elif t.dtype == torch.int16:
        w = t.to(torch.int32)
        back = lambda: t.copy_(w)  # noqa: E731
    else:
        w = t
    if factor is not None and scale:
        wide = w
        w = (w * factor).to(w.dtype)
        back = _then(lambda: wide.copy_(w), back)
    return w, op, back


def _dense(t: torch.Tensor) -> Any:
    """A contiguous tensor with t's values (its bytes in a type brigade
    moves: _raw), and what copies it back into t once a call has written it
    (None when it is t's own memory)."""
    r = _raw(t)
    if r.is_contiguous():
        return r, None
    c = r.contiguous()
    return c, lambda: r.copy_(c)


def _then(*fns: Any) -> Any:
    todo = [f for f in fns if f is not None]
    if not todo:
        return None

    def run() -> None:
        for f in todo:
            f()
    return run


# torch 1.13 keeps no Python object of a Work that C++ holds (DDP's reducer,
# _verify_params_across_processes, _broadcast_coalesced take the Work of a
# Python group): once the caller's reference goes, C++ finds none of the
# methods below and waits on the base Work forever. Those callers wait or
# take the future right after the call, so the last few Works are kept
# (torch 2.x keeps the Python object alive itself).
_KEEP: "Optional[collections.deque[Any]]" = (
    collections.deque(maxlen=64) if int(torch.__version__.split(".")[0]) < 2 else None)


class _Work(dist.Work):
    """A call's Work: its future, completed by the completer thread (or at
    once), and what torch asks of a Work read from it. wait() raises the
    call's error, as Gloo's Work does; torch's own Work over a future
    (_create_work_from_future) reports success whatever the future holds.
    """

    def __init__(self, fut: "torch.futures.Future[Any]"):
        super().__init__()
        self._fut = fut
        if _KEEP is not None:
            _KEEP.append(self)

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()  # raises the error the future was failed with
        return True

    def is_completed(self) -> bool:
        return bool(self._fut.done())

    def is_success(self) -> bool:
        return self._fut.done() and self.exception() is None

    def exception(self) -> Any:
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except BaseException as e:  # noqa: BLE001 - what the call failed with
            return e
        return None

    def get_future(self) -> Any:
        return self._fut

    def result(self) -> Any:
        return self._fut.wait()

    def synchronize(self) -> None:
        pass


def _done(result: Any) -> Any:
    fut: "torch.futures.Future[Any]" = torch.futures.Future()
    fut.set_result(result)
    return _Work(fut)


class _Completer:
    """Finishes asynchronous calls in issue order on one thread and completes
    their futures (brigade runs a communicator's calls in that order anyway)."""

    def __init__(self) -> None:
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._t = threading.Thread(target=self._run, name="brigade-completer", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            reqs, fut, result, then, failed = item
            try:
                for req in reqs:
                    req.wait()  # the GIL is released inside brg_wait
                if then is not None:
                    then()
            except BaseException as e:  # noqa: BLE001 - handed to the future
                for req in reqs:  # none may still write into a tensor
                    try:
                        req.wait()
                    except BaseException:  # noqa: BLE001 - the first error is reported
                        pass
                if failed is not None:
                    failed(e)
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def submit(self, reqs: Any, result: Any, then: Any = None,
               failed: Any = None) -> "torch.futures.Future[Any]":
        """The future of `reqs` (a Request or a list): `result` once all have
        finished and `then` has run; failed with the first error otherwise,
        after `failed` has been told it."""
        fut: "torch.futures.Future[Any]" = torch.futures.Future()
        self._q.put((reqs if isinstance(reqs, list) else [reqs], fut, result, then, failed))
        return fut

    def close(self) -> None:
        self._q.put(None)
        self._t.join()


_completers: "dict[int, _Completer]" = {}
_completers_lock = threading.Lock()


def _completer(comm: brigade.Communicator) -> _Completer:
    with _completers_lock:
        c = _completers.get(id(comm))
        if c is None:
            c = _completers[id(comm)] = _Completer()
        return c


_T = TypeVar("_T")


def _one(tensors: Sequence[_T], call: str) -> _T:
    if len(tensors) != 1:
        raise ValueError(f"brigade: {call}: one tensor per call (got {len(tensors)}); brigade "
                         "runs one device per process")
    return tensors[0]


_ANY_SOURCE = -1  # BRG_ANY_SOURCE


def _irecv_any(comm: brigade.Communicator, t: torch.Tensor, tag: int) -> Any:
    """brg_irecv (brg_irecv_tagged) from BRG_ANY_SOURCE into t (the Python
    API's irecv takes ranks only)."""
    from brigade import _capi
    from brigade._buffers import as_view

    if not _capi.has("brg_request_source"):
        raise NotImplementedError("brigade: recv_anysource: the loaded libbrigade has no "
                                  "brg_request_source (receives from any source)")
    fn = _capi.lib.brg_request_source
    if fn.argtypes is None:
        fn.argtypes = [ctypes.POINTER(_capi.RequestStruct), ctypes.POINTER(ctypes.c_int)]
        fn.restype = ctypes.c_int
    v = as_view(t, True, "the buffer")
    try:
        comm._typecheck("irecv", v, v, None, False)
        tag = brigade._c_int(tag, "tag", "recv_anysource", 0)
    except BaseException:
        v.release()
        raise
    dtype = v.dtype
    if dtype is None:
        v.release()
        raise TypeError("brigade: recv_anysource: the tensor's dtype has no brigade type")
    if tag:
        return comm._launch("brg_irecv_tagged", [v], (v.ptr, v.count, int(dtype), _ANY_SOURCE,
                                                      tag), True, t, None)
    return comm._launch("brg_irecv", [v], (v.ptr, v.count, int(dtype), _ANY_SOURCE), True, t,
                        None)


class _P2PWork(_Work):
    """The Work of a send or a receive, completed by whoever asks: wait()
    (and is_completed()) wait for or test its request on the caller's
    thread, so that no other call's completion waits behind a receive
    (irecv, then a barrier, then the isend its sender waits for: the
    completer thread, which finishes calls in issue order, would hold the
    barrier behind the receive). get_future() hands the wait to a thread
    of its own."""

    def __init__(self, req: Any, result: Any, then: Any, failed: Any):
        super().__init__(torch.futures.Future())
        self._req, self._result, self._then, self._failed = req, result, then, failed
        self._lock = threading.Lock()
        self._waiter: Optional[threading.Thread] = None

    def _finish(self, step: Callable[[], bool]) -> bool:
        """step() (the request's wait or test) under the lock; completes the
        future once it has finished. Whether it has."""
        with self._lock:
            if self._fut.done():
                return True
            try:
                if not step():
                    return False
                if self._then is not None:
                    self._then()
            except BaseException as e:  # noqa: BLE001 - handed to the future
                if self._failed is not None:
                    self._failed(e)
                self._fut.set_exception(e)
            else:
                self._fut.set_result(self._result)
            return True

    def _wait_req(self) -> bool:
        self._req.wait()  # the GIL is released inside brg_wait
        return True

    def wait(self, timeout: Any = None) -> bool:
        self._finish(self._wait_req)
        return super().wait()

    def is_completed(self) -> bool:
        return self._finish(self._req.test)

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> Any:
        self.is_completed()
        return super().exception()

    def get_future(self) -> Any:
        with self._lock:
            if self._waiter is None and not self._fut.done():
                self._waiter = threading.Thread(target=self._wait_quietly, daemon=True,
                                                name="brigade-p2p-wait")
                self._waiter.start()
        return self._fut

    def _wait_quietly(self) -> None:
        try:
            self.wait()
        except BaseException:  # noqa: BLE001 - the future holds it
            pass


class _AnySourceWork(_P2PWork):
    """The Work of recv_anysource, and the rank the message came from
    (brg_request_source) once it has finished."""

    def _source_rank(self) -> int:
        from brigade import _capi

        self.wait()
        src = ctypes.c_int(-1)
        s = _capi.lib.brg_request_source(ctypes.byref(self._req._req), ctypes.byref(src))
        if s != 0:
            raise brigade.Error(s, "brigade: recv_anysource: no sender: "
                                + _capi.lib.brg_comm_last_error(None).decode(errors="replace"))
        return src.value

    source_rank = _source_rank


def _unsupported(name: str) -> Any:
    """The method `name` of ProcessGroupBrigade, which raises NotImplementedError."""
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"brigade: the torch.distributed backend \"brigade\" has no "
                                  f"{name} (it has allreduce, all_reduce_coalesced, "
                                  "reduce_scatter, all_gather, broadcast, reduce, barrier, "
                                  "gather, scatter, send, recv (from any source too) and "
                                  "all_to_all)")
    call.__name__ = name
    return call


# Refusals before anything ran leave the communicator as it was.
_REFUSALS = (brigade.Status.ERR_INVALID_ARGUMENT, brigade.Status.ERR_INVALID_USAGE)
_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(fn: _F) -> _F:
    """A collective of the group: refused while its communicator is broken;
    a brigade error that it raises at once (the blocking forms) breaks it,
    as a failed collective stops brigade's communicator."""
    @functools.wraps(fn)
    def call(self: "ProcessGroupBrigade", *args: Any, **kwargs: Any) -> Any:
        self._check_broken(fn.__name__)
        try:
            return fn(self, *args, **kwargs)
        except brigade.Error as e:
            self._broke(e)
            raise
    return cast(_F, call)


def _p2p_guarded(fn: _F) -> _F:
    """A send or a receive: refused while the communicator is broken; its
    own failure (a timeout, a mismatch, a peer gone) leaves the
    communicator usable, as brigade's point-to-point calls do."""
    @functools.wraps(fn)
    def call(self: "ProcessGroupBrigade", *args: Any, **kwargs: Any) -> Any:
        self._check_broken(fn.__name__)
        return fn(self, *args, **kwargs)
    return cast(_F, call)


class ProcessGroupBrigade(dist.ProcessGroup):  # type: ignore[name-defined,misc]
    """A torch.distributed process group whose collectives run on brigade.

    CPU tensors go through brigade's non-blocking calls: each call returns a
    Work at once, completed on a helper thread when brigade has finished, so
    ``async_op=True`` and DDP's bucket allreduces overlap with the caller.
    CUDA tensors run on the device collectives on torch's current stream
    (the Work is complete once the work is queued there, as NCCL's Work is
    for the current stream)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Optional[timedelta] = None):
        super().__init__(rank, size)
        if rank == 0:
            uid = brigade.get_unique_id()
            store.set(_STORE_KEY, bytes(uid))
        else:
            uid = brigade.UniqueId(bytes(store.get(_STORE_KEY)))
        # The group's timeout (init_process_group(timeout=...)) is the
        # communicator's: a rank that waits that long for a peer raises.
        # torch's default (30 minutes) leaves BRIGADE_TIMEOUT_MS in charge.
        ms = None
        default = getattr(dist, "default_pg_timeout", None)
        if timeout is not None and timeout != default:
            ms = max(100, min(int(timeout.total_seconds() * 1000), 2**31 - 1))
        self.comm = brigade.Communicator(size, uid, rank, timeout_ms=ms)
        self._completer = _completer(self.comm)
        # The first error of a call that ran (a timeout, a mismatch, a peer
        # gone): the communicator is broken, and every later call says so.
        self._broken: Optional[brigade.Error] = None
        self._broken_lock = threading.Lock()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    # torch 2.x asks a group for the backend of a device (batch_isend_irecv
    # does, to see whether it coalesces): a Python process group is its own
    # backend for every device it serves; its calls run one by one.
    supports_coalescing = False

    def _get_backend(self, device: Any = None) -> Any:
        return self

    def _work(self, reqs: Any, result: Any, then: Any = None) -> Any:
        return _Work(self._completer.submit(reqs, result, then, self._broke))

    def _broke(self, e: BaseException) -> None:
        if not isinstance(e, brigade.Error) or e.status in _REFUSALS:
            return
        with self._broken_lock:
            if self._broken is None:
                self._broken = e

    def _check_broken(self, call: str) -> None:
        first = self._broken
        if first is not None:
            raise brigade.Error(first.status, "the group's communicator is broken by an earlier "
                                f"call's failure ({first}); make a new group",
                                f"brigade: {call.lstrip('_')}")

    # --------------------------------------------------------- collectives
    @_guarded
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        w, op, conv = _reduction(_one(tensors, "allreduce"),
                                 opts.reduceOp if opts is not None and hasattr(opts, "reduceOp")
                                 else opts if opts is not None else dist.ReduceOp.SUM,
                                 "allreduce")
        t, back = _dense(w)
        back = _then(back, conv)
        if t.is_cuda:
            self.comm.allreduce(t, op=op)
            if back is not None:
                back()
            return _done(tensors)
        return self._work(self.comm.iallreduce(t, op=op), tensors, back)

    @_guarded
    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        """One allreduce over the tensors laid end to end (one dtype, one device)."""
        reduce_op = (opts.reduceOp if opts is not None and hasattr(opts, "reduceOp")
                     else dist.ReduceOp.SUM)
        if not tensors:
            return _done(tensors)
        for t in tensors:
            if t.dtype != tensors[0].dtype or t.device != tensors[0].device:
                raise ValueError(f"brigade: all_reduce_coalesced: the tensors must share one "
                                 f"dtype and device ({tensors[0].dtype} on {tensors[0].device} "
                                 f"and {t.dtype} on {t.device})")
        whole = torch.cat([t.reshape(-1) for t in tensors])
        w, op, conv = _reduction(whole, reduce_op, "all_reduce_coalesced")
        flat, _ = _dense(w)  # a new tensor: contiguous

        def unpack() -> None:
            if conv is not None:
                conv()
            off = 0
            for t in tensors:
                t.copy_(whole[off:off + t.numel()].view_as(t))
                off += t.numel()

        if flat.is_cuda:
            self.comm.allreduce(flat, op=op)
            unpack()
            return _done(tensors)
        return self._work(self.comm.iallreduce(flat, op=op), tensors, unpack)

    @_guarded
    def broadcast(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        t, back = _dense(_one(tensors, "broadcast"))
        if t.is_cuda:
            self.comm.broadcast(t, root=opts.rootRank)
            if back is not None:
                back()
            return _done(tensors)
        return self._work(self.comm.ibroadcast(t, root=opts.rootRank), tensors, back)

    @_guarded
    def reduce(self, tensors: Any, opts: Any) -> Any:  # type: ignore[override]
        w, op, conv = _reduction(_one(tensors, "reduce"), opts.reduceOp, "reduce")
        t, back = _dense(w)
        back = _then(back, conv)
        if t.is_cuda:
            self.comm.reduce(t, root=opts.rootRank, op=op)
            if back is not None:
                back()
            return _done(tensors)
        return self._work(self.comm.ireduce(t, root=opts.rootRank, op=op), tensors, back)

    @_guarded
    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        t = _raw(_one(input_tensors, "all_gather")).contiguous()
        outs = _one(output_tensors, "all_gather")
        if len(outs) != self.size():
            raise ValueError(f"brigade: all_gather: {len(outs)} output tensors for "
                             f"{self.size()} ranks")
        outs = [_raw(o) for o in outs]
        for o in outs:
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError(f"brigade: all_gather: an output tensor is {o.numel()} x "
                                 f"{o.dtype}, the input {t.numel()} x {t.dtype}")
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype, device=t.device)
        n = t.numel()

        def unpack() -> None:
            for r, o in enumerate(outs):
                o.copy_(flat[r * n:(r + 1) * n].view_as(o))

        if t.is_cuda:
            self.comm.all_gather(t, out=flat)
            unpack()
            return _done(output_tensors)
        return self._work(self.comm.iall_gather(t, out=flat), output_tensors, unpack)

    @_guarded
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Any:
        out, back = _dense(output)
        input = _raw(input).contiguous()
        if input.is_cuda:
            self.comm.all_gather(input, out=out)
            if back is not None:
                back()
            return _done([output])
        return self._work(self.comm.iall_gather(input, out=out), [output], back)

    @_guarded
    def reduce_scatter(self, output_tensors: Any, input_tensors: Any,  # type: ignore[override]
                       opts: Any) -> Any:
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise ValueError(f"brigade: reduce_scatter: {len(ins)} input tensors for "
                             f"{self.size()} ranks")
        for i in ins:
            if i.numel() != out.numel() or i.dtype != out.dtype:
                raise ValueError(f"brigade: reduce_scatter: an input tensor is {i.numel()} x "
                                 f"{i.dtype}, the output {out.numel()} x {out.dtype}")
        flat = torch.cat([i.reshape(-1) for i in ins])
        return self._reduce_scatter_base(out, flat, opts, output_tensors)

    @_guarded
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any,
                             result: Any = None) -> Any:
        result = [output] if result is None else result
        input, op, _ = _reduction(input, opts.reduceOp, "reduce_scatter")
        input = input.contiguous()
        w, _, conv = _reduction(output, opts.reduceOp, "reduce_scatter", scale=False)
        out, back = _dense(w)
        back = _then(back, conv)
        if input.is_cuda:
            self.comm.reduce_scatter(input, out=out, op=op)
            if back is not None:
                back()
            return _done(result)
        return self._work(self.comm.ireduce_scatter(input, out=out, op=op), result, back)

    @_guarded
    def barrier(self, opts: Any = None) -> Any:
        return self._work(self.comm.ibarrier(), [torch.empty(0)])

    # ------------------------------------------ point-to-point, all-to-all
    @_p2p_guarded
    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Any:  # noqa: N803
        t = _raw(_one(tensors, "send")).contiguous()
        if t.is_cuda:
            self.comm.send(t, dstRank, tag=tag)
            return _done(tensors)
        return _P2PWork(self.comm.isend(t, dstRank, tag=tag), tensors, None, None)

    @_p2p_guarded
    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Any:  # noqa: N803
        t, back = _dense(_one(tensors, "recv"))
        if t.is_cuda:
            self.comm.recv(t, srcRank, tag=tag)
            if back is not None:
                back()
            return _done(tensors)
        return _P2PWork(self.comm.irecv(t, srcRank, tag=tag), tensors, back, None)

    @_p2p_guarded
    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        """recv from whichever rank sends a message of `tag` first
        (``brg_irecv_tagged`` from ``BRG_ANY_SOURCE``); the Work's source rank
        names it, as ``dist.recv(t)`` without ``src`` returns."""
        t, back = _dense(_one(tensors, "recv_anysource"))
        req = _irecv_any(self.comm, t, tag)
        return _AnySourceWork(req, tensors, back, None)

    def _exchange(self, call: str, sends: List[torch.Tensor],
                  recvs: List[torch.Tensor]) -> Any:
        """Block j of sends to rank j, block j of recvs from rank j, over
        isend/irecv (the unequal and list forms of all-to-all). Returns the
        requests and what copies non-contiguous outputs back."""
        me = self.rank()
        if any(x.is_cuda for x in sends + recvs):
            raise NotImplementedError(f"brigade: {call} on CUDA tensors (brigade's "
                                      "point-to-point calls take host memory)")
        for j, (a, b) in enumerate(zip(sends, recvs)):
            if a.dtype != b.dtype:
                raise ValueError(f"brigade: {call}: block {j} is {a.dtype} to send and "
                                 f"{b.dtype} to receive")
        sends = [_raw(x).contiguous() for x in sends]
        dense = [_dense(x) for x in recvs]
        recvs = [d[0] for d in dense]
        recvs[me].copy_(sends[me])
        reqs = []
        for j in range(self.size()):
            if j != me:
                reqs.append(self.comm.irecv(recvs[j], j))
        for j in range(self.size()):
            if j != me:
                reqs.append(self.comm.isend(sends[j], j))
        return reqs, _then(*(d[1] for d in dense))

    @_guarded
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: List[int], input_split_sizes: List[int],
                      opts: Any = None) -> Any:
        n = self.size()
        outs, ins = list(output_split_sizes or []), list(input_split_sizes or [])
        out, back = _dense(output)
        input = _raw(input).contiguous()
        if (not outs or len(set(outs)) == 1) and (not ins or len(set(ins)) == 1):
            if output.numel() != input.numel() or input.numel() % n:
                raise ValueError(f"brigade: all_to_all_single: input {input.numel()} and "
                                 f"output {output.numel()} elements must be equal and a "
                                 f"multiple of the {n} ranks")
            self.comm.all_to_all(input, out=out)
            if back is not None:
                back()
            return _done([output])
        if len(outs) != n or len(ins) != n:
            raise ValueError(f"brigade: all_to_all_single: split sizes for {len(ins)} and "
                             f"{len(outs)} ranks, the group has {n}")
        sends = list(torch.split(input, ins)) if ins else list(torch.chunk(input, n))
        recvs = list(torch.split(out, outs)) if outs else list(torch.chunk(out, n))
        reqs, then = self._exchange("all_to_all_single", sends, recvs)
        return self._work(reqs, [output], _then(then, back))

    @_guarded
    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"brigade: all_to_all: {len(input_tensors)} inputs and "
                             f"{len(output_tensors)} outputs for {n} ranks")
        reqs, then = self._exchange("all_to_all", list(input_tensors), list(output_tensors))
        return self._work(reqs, output_tensors, then)

    # ------------------------------------------------------ gather, scatter
    # A rank whose own tensor (gather: the input, scatter: the output) is a
    # CUDA tensor calls brigade's blocking form, which takes GPU buffers
    # (staged through host memory, after torch's current stream) and
    # returns with the result in place; the Work is complete at once. A
    # CPU tensor goes through the non-blocking form. Each rank chooses for
    # itself, as brigade's calls allow.
    def _check_blocks(self, call: str, blocks: List[torch.Tensor], t: torch.Tensor,
                      what: str) -> None:
        if len(blocks) != self.size():
            raise ValueError(f"brigade: {call}: {len(blocks)} {what} tensors on the root for "
                             f"{self.size()} ranks")
        for b in blocks:
            if b.numel() != t.numel() or b.dtype != t.dtype:
                raise ValueError(f"brigade: {call}: a {what} tensor is {b.numel()} x {b.dtype}, "
                                 f"this rank's {t.numel()} x {t.dtype}")

    @_guarded
    def gather(self, output_tensors: Any, input_tensors: Any,  # type: ignore[override]
               opts: Any) -> Any:
        t = _raw(_one(input_tensors, "gather")).contiguous()
        root = opts.rootRank
        if self.rank() != root:
            if t.is_cuda:
                self.comm.gather(t, root=root)
                return _done(output_tensors)
            return self._work(self.comm.igather(t, root=root), output_tensors)
        outs = [_raw(o) for o in _one(output_tensors, "gather")]
        self._check_blocks("gather", outs, t, "output")
        # The blocks arrive in one buffer on the input's device.
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype, device=t.device)
        n = t.numel()

        def unpack() -> None:
            for r, o in enumerate(outs):
                o.copy_(flat[r * n:(r + 1) * n].view_as(o))

        if t.is_cuda:
            self.comm.gather(t, root=root, out=flat)
            unpack()
            return _done(output_tensors)
        return self._work(self.comm.igather(t, root=root, out=flat), output_tensors, unpack)

    @_guarded
    def scatter(self, output_tensors: Any, input_tensors: Any,  # type: ignore[override]
                opts: Any) -> Any:
        out, back = _dense(_one(output_tensors, "scatter"))
        root = opts.rootRank
        if self.rank() != root:
            if out.is_cuda:
                self.comm.scatter(None, root=root, out=out)
                if back is not None:
                    back()
                return _done(output_tensors)
            return self._work(self.comm.iscatter(None, root=root, out=out), output_tensors, back)
        ins = [_raw(i) for i in _one(input_tensors, "scatter")]
        self._check_blocks("scatter", ins, out, "input")
        # The blocks leave from one buffer on the output's device.
        flat = (torch.cat([i.reshape(-1).to(out.device) for i in ins]) if ins
                else torch.empty(0, dtype=out.dtype, device=out.device))
        if out.is_cuda:
            self.comm.scatter(flat, root=root, out=out)
            if back is not None:
                back()
            return _done(output_tensors)
        return self._work(self.comm.iscatter(flat, root=root, out=out), output_tensors, back)

    # The names newer torch (2.x) calls the flat-tensor forms by.
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Any:
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any) -> Any:
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: List[int], input_split_sizes: List[int],
                          opts: Any = None) -> Any:
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    # ------------------------------------------------------------ the rest
    allgather_coalesced = _unsupported("all_gather_coalesced")
    monitored_barrier = _unsupported("monitored_barrier")


def _create(store: Any, rank: int, size: int, timeout: Any) -> ProcessGroupBrigade:
    return ProcessGroupBrigade(store, rank, size, timeout)


def register() -> None:
    """Registers the backend "brigade" with torch.distributed (done at import)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        try:  # torch >= 2.0 asks which devices the backend serves
            dist.Backend.register_backend(  # type: ignore[no-untyped-call,call-arg]
                BACKEND_NAME, _create, devices=["cpu", "cuda"])
        except TypeError:
            dist.Backend.register_backend(BACKEND_NAME, _create)  # type: ignore[no-untyped-call]


register()


_group_comms: "dict[int, brigade.Communicator]" = {}


def communicator(group: Any = None) -> brigade.Communicator:
    """A brigade communicator over the ranks of a process group (default: the
    default group). For a "brigade" group, its own; for any other backend
    (Gloo, NCCL), one built once per group, its unique id broadcast through
    the group itself, so no port is needed. Call it on every rank of the group.
    """
    pg = group if group is not None else \
        dist.distributed_c10d._get_default_group()  # type: ignore[no-untyped-call]
    if isinstance(pg, ProcessGroupBrigade):
        return pg.comm
    c = _group_comms.get(id(pg))
    if c is None:
        rank, size = dist.get_rank(pg), dist.get_world_size(pg)
        box = [bytes(brigade.get_unique_id()) if rank == 0 else None]
        src = dist.distributed_c10d._get_global_rank(  # type: ignore[no-untyped-call]
            pg, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)  # type: ignore[no-untyped-call]
        uid = box[0]
        assert uid is not None, "the unique id did not arrive"
        c = _group_comms[id(pg)] = brigade.Communicator(size, uid, rank)
    return c


def allreduce_hook(state: brigade.Communicator,
                   bucket: dist.GradBucket,  # type: ignore[name-defined]
                   ) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradients averaged over ranks by a
    brigade allreduce, started at once and finished on a helper thread so that
    backward goes on meanwhile. Divides by the number of ranks, then sums, as
    DDP's own allreduce does.

    Register with ``ddp.register_comm_hook(comm, brigade.torch.allreduce_hook)``
    where ``comm`` is a :class:`brigade.Communicator` of the same ranks.
    """
    if not isinstance(state, brigade.Communicator):
        raise TypeError("brigade.torch.allreduce_hook: the hook's state must be a "
                        f"brigade.Communicator, not {type(state).__name__}")
    t = bucket.buffer()
    t.div_(state.size)
    if t.is_cuda:
        state.allreduce(t, op="sum")  # on the current stream
        fut: "torch.futures.Future[Any]" = torch.futures.Future()
        fut.set_result(t)
        return fut
    req = state.iallreduce(t, op="sum")
    return _completer(state).submit(req, t)
