"""brigade for PyTorch: a torch.distributed backend and a DDP communication hook.

Importing this module registers the backend "brigade"::

    import torch.distributed as dist
    import brigade.torch  # noqa: F401  (registers "brigade")
    dist.init_process_group("brigade")  # torchrun, or MASTER_ADDR/PORT, RANK, WORLD_SIZE
    model = torch.nn.parallel.DistributedDataParallel(model)

The process group runs allreduce, reduce_scatter, all_gather, broadcast,
reduce and barrier on CPU tensors through brigade; every other call
(send/recv, all_to_all, gather, scatter, ...) raises NotImplementedError
naming the call. Brigade's unique id goes through the c10d store the group
is given, so brigade needs no port of its own (MASTER_PORT stays c10d's).

For users who keep Gloo or NCCL as the backend and want brigade only for
DDP's gradient allreduce, :func:`allreduce_hook` is a DDP communication
hook::

    comm = brigade.torch.communicator()  # over the default (e.g. Gloo) group
    ddp.register_comm_hook(comm, brigade.torch.allreduce_hook)

Tested with Debian 12's python3-torch 1.13 (CPU). Its torchrun crashes under
Python 3.11 in ``to_map`` unless given ``--redirects 2 --tee 2`` (a torch
bug, fixed in later releases).
"""
import queue
import threading
from datetime import timedelta
from typing import Any, List, Optional

import torch
import torch.distributed as dist

import brigade

__all__ = ["ProcessGroupBrigade", "allreduce_hook", "communicator", "BACKEND_NAME"]

BACKEND_NAME = "brigade"
_STORE_KEY = "brigade/unique_id"

try:
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError as e:  # pragma: no cover - torch without c10d
    raise ImportError("brigade.torch needs torch.distributed with Python process groups "
                      "(torch >= 1.13)") from e


def _op(reduce_op: Any) -> str:
    R = dist.ReduceOp
    for name, ours in (("SUM", "sum"), ("PRODUCT", "prod"), ("MIN", "min"), ("MAX", "max"),
                       ("AVG", "avg")):
        if hasattr(R, name) and reduce_op == getattr(R, name):
            return ours
    raise NotImplementedError(f"brigade: reduce op {reduce_op} (brigade has SUM, PRODUCT, MIN, "
                              "MAX, AVG)")


def _done(result: Any) -> Any:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class _Completer:
    """Finishes asynchronous collectives in issue order on one thread and
    completes their futures (brigade runs them in that order anyway)."""

    def __init__(self) -> None:
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._t = threading.Thread(target=self._run, name="brigade-completer", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            req, fut, result = item
            try:
                req.wait()  # the GIL is released inside brg_wait
                fut.set_result(result)
            except BaseException as e:  # noqa: BLE001 - handed to the future
                fut.set_exception(e)

    def submit(self, req: brigade.Request, result: Any) -> "torch.futures.Future[Any]":
        fut: torch.futures.Future = torch.futures.Future()
        self._q.put((req, fut, result))
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


def _one(tensors: List[torch.Tensor], call: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"brigade: {call}: one tensor per call (got {len(tensors)}); brigade "
                         "runs one device per process")
    return tensors[0]


class ProcessGroupBrigade(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on brigade."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Optional[timedelta] = None):
        super().__init__(rank, size)
        if rank == 0:
            uid = brigade.get_unique_id()
            store.set(_STORE_KEY, bytes(uid))
        else:
            uid = brigade.UniqueId(bytes(store.get(_STORE_KEY)))
        self.comm = brigade.Communicator(size, uid, rank)
        self._completer = _completer(self.comm)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    # --------------------------------------------------------- collectives
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        t = _one(tensors, "allreduce")
        op = _op(opts.reduceOp if opts is not None and hasattr(opts, "reduceOp")
                 else opts if opts is not None else dist.ReduceOp.SUM)
        req = self.comm.iallreduce(t, op=op)
        return _create_work_from_future(self._completer.submit(req, tensors))

    def broadcast(self, tensors: Any, opts: Any) -> Any:
        t = _one(tensors, "broadcast")
        self.comm.broadcast(t, root=opts.rootRank)
        return _done(tensors)

    def reduce(self, tensors: Any, opts: Any) -> Any:
        t = _one(tensors, "reduce")
        self.comm.reduce(t, root=opts.rootRank, op=_op(opts.reduceOp))
        return _done(tensors)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        t = _one(input_tensors, "all_gather")
        outs = _one(output_tensors, "all_gather")
        if len(outs) != self.size():
            raise ValueError(f"brigade: all_gather: {len(outs)} output tensors for "
                             f"{self.size()} ranks")
        for o in outs:
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError(f"brigade: all_gather: an output tensor is {o.numel()} x "
                                 f"{o.dtype}, the input {t.numel()} x {t.dtype}")
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype)
        self.comm.all_gather(t.contiguous() if t.is_contiguous() else t, out=flat)
        for r, o in enumerate(outs):
            o.copy_(flat[r * t.numel():(r + 1) * t.numel()].view_as(o))
        return _done(output_tensors)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Any:
        self.comm.all_gather(input, out=output)
        return _done([output])

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any) -> Any:
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
        self.comm.reduce_scatter(flat, out=out, op=_op(opts.reduceOp))
        return _done(output_tensors)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self.comm.reduce_scatter(input, out=output, op=_op(opts.reduceOp))
        return _done([output])

    def barrier(self, opts: Any = None) -> Any:
        self.comm.barrier()
        return _done([torch.empty(0)])

    # ------------------------------------------------------------ the rest
    def _unsupported(name: str):  # type: ignore[misc]
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"brigade: the torch.distributed backend \"brigade\" has no "
                                      f"{name} (it has allreduce, reduce_scatter, all_gather, "
                                      "broadcast, reduce and barrier)")
        call.__name__ = name
        return call

    send = _unsupported("send")
    recv = _unsupported("recv")
    recv_anysource = _unsupported("recv_anysource")
    alltoall = _unsupported("all_to_all")
    alltoall_base = _unsupported("all_to_all_single")
    gather = _unsupported("gather")
    scatter = _unsupported("scatter")
    allreduce_coalesced = _unsupported("all_reduce_coalesced")
    allgather_coalesced = _unsupported("all_gather_coalesced")
    monitored_barrier = _unsupported("monitored_barrier")
    del _unsupported


def _create(store: Any, rank: int, size: int, timeout: Any) -> ProcessGroupBrigade:
    return ProcessGroupBrigade(store, rank, size, timeout)


def register() -> None:
    """Registers the backend "brigade" with torch.distributed (done at import)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:  # type: ignore[attr-defined]
        dist.Backend.register_backend(BACKEND_NAME, _create)


register()


_group_comms: "dict[int, brigade.Communicator]" = {}


def communicator(group: Any = None) -> brigade.Communicator:
    """A brigade communicator over the ranks of a process group (default: the
    default group). For a "brigade" group, its own; for any other backend
    (Gloo, NCCL), one built once per group, its unique id broadcast through
    the group itself, so no port is needed. Call it on every rank of the group.
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupBrigade):
        return pg.comm
    c = _group_comms.get(id(pg))
    if c is None:
        rank, size = dist.get_rank(pg), dist.get_world_size(pg)
        box = [bytes(brigade.get_unique_id()) if rank == 0 else None]
        src = dist.distributed_c10d._get_global_rank(pg, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        c = _group_comms[id(pg)] = brigade.Communicator(size, box[0], rank)
    return c


def allreduce_hook(state: brigade.Communicator,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
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
    req = state.iallreduce(t, op="sum")
    return _completer(state).submit(req, t)
