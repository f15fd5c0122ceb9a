"""brigade.Reducer: the bucketed gradient reducer of brigade_reducer.h."""
from __future__ import annotations

import ctypes
import operator
from typing import Any, List, Optional, Sequence, Tuple, cast

from . import _capi
from ._buffers import View, as_view
from ._capi import DType, Status


class Reducer:
    """What DDP's Reducer does, for any framework: gradients registered once,
    grouped into buckets (reverse registration order, one dtype per bucket),
    each bucket allreduced asynchronously as soon as all its gradients are
    marked ready, averaged (or summed) when :meth:`finalize` returns.

    Args:
        comm: the :class:`brigade.Communicator`.
        params: the parameters' values in forward order (buffers, arrays or
            CPU tensors; used by :meth:`broadcast_params`; entries may be None).
        grads: their gradients (same lengths and dtypes); None with
            ``grad_as_view`` (the gradients then live in the buckets: see
            :meth:`grad_address`).
        names: optional names, used in error messages.
        average: False leaves the sum over ranks (BRG_REDUCER_SUM).
        find_unused, static_graph, grad_as_view, no_rebuild: the
            BRG_REDUCER_* flags of the same names.
        hook: "allreduce", "fp16" or "bf16" (compress float buckets).
        bucket_cap_bytes, first_bucket_cap_bytes: 0 for the defaults
            (25 MiB and 1 MiB).

    A step: :meth:`prepare`, then :meth:`mark_ready` for each parameter as
    its gradient is final (any order, any thread), then :meth:`finalize`.
    Errors are :class:`brigade.Error` with brg_reducer_last_error's sentence.
    """

    def __init__(self, comm: Any, params: Sequence[Any], grads: Optional[Sequence[Any]] = None,
                 names: Optional[Sequence[str]] = None, *, average: bool = True,
                 find_unused: bool = False, static_graph: bool = False,
                 grad_as_view: bool = False, no_rebuild: bool = False, hook: str = "allreduce",
                 bucket_cap_bytes: int = 0, first_bucket_cap_bytes: int = 0):
        from . import SIZE_MAX, Error, _c_int, _Owned

        self._core: Optional[_Owned] = None
        self._comm = comm
        n = len(params)
        if grads is not None and len(grads) != n:
            raise ValueError(f"brigade: Reducer: {n} params but {len(grads)} grads")
        if grads is None and not grad_as_view:
            raise ValueError("brigade: Reducer: grads are needed unless grad_as_view=True")
        if grads is not None and grad_as_view:
            raise ValueError("brigade: Reducer: with grad_as_view the gradients live in the "
                             "buckets; pass grads=None")
        if names is not None and len(names) != n:
            raise ValueError(f"brigade: Reducer: {n} params but {len(names)} names")
        self._views: List[View] = []
        self._names = [ctypes.c_char_p(str(nm).encode()) for nm in names] if names else None
        arr = (_capi.ReducerParam * max(n, 1))()
        self._dtypes: List[DType] = []
        self._counts: List[int] = []
        try:
            for i in range(n):
                label = f"param {i}" + (f" ({names[i]})" if names else "")
                pv = as_view(params[i], True, f"{label}'s values") if params[i] is not None \
                    else None
                gv = as_view(grads[i], True, f"{label}'s gradient") if grads is not None else None
                ref = pv or gv
                if ref is None:
                    raise ValueError(f"brigade: Reducer: {label} has neither values nor gradient, "
                                     "so its size and dtype are unknown")
                for v in (pv, gv):
                    if v is not None:
                        self._views.append(v)
                        if v.dtype is None:
                            raise TypeError(f"brigade: Reducer: {label} is {v.what}, "
                                            "not a brigade type")
                if pv is not None and gv is not None and (pv.count, pv.dtype) != (gv.count,
                                                                                  gv.dtype):
                    raise ValueError(f"brigade: Reducer: {label}: values are {pv.count} x "
                                     f"{pv.type_name()}, gradient {gv.count} x "
                                     f"{gv.type_name()}")
                arr[i].name = self._names[i] if self._names else None
                arr[i].count = ref.count
                arr[i].dtype = ref.code()
                arr[i].data = pv.ptr if pv is not None else None
                arr[i].grad = gv.ptr if gv is not None else None
                self._dtypes.append(DType(ref.code()))
                self._counts.append(ref.count)
            flags = ((0 if average else _capi.REDUCER_SUM)
                     | (_capi.REDUCER_FIND_UNUSED if find_unused else 0)
                     | (_capi.REDUCER_STATIC_GRAPH if static_graph else 0)
                     | (_capi.REDUCER_GRAD_AS_VIEW if grad_as_view else 0)
                     | (_capi.REDUCER_NO_REBUILD if no_rebuild else 0))
            hooks = {"allreduce": _capi.ReducerHook.ALLREDUCE, "fp16": _capi.ReducerHook.FP16,
                     "bf16": _capi.ReducerHook.BF16}
            if hook not in hooks:
                raise ValueError(f"brigade: Reducer: hook {hook!r} is not one of "
                                 + ", ".join(hooks))
            call = "brg_reducer_create"
            cap = _c_int(bucket_cap_bytes, "bucket_cap_bytes", call, 0, SIZE_MAX)
            first = _c_int(first_bucket_cap_bytes, "first_bucket_cap_bytes", call, 0, SIZE_MAX)
            cfg = _capi.ReducerConfig(bucket_cap_bytes=cap, first_bucket_cap_bytes=first,
                                      flags=flags, hook=int(hooks[hook]))
            h = ctypes.c_void_p()
            s = _capi.lib.brg_reducer_create(ctypes.byref(h), comm._h("brg_reducer_create"), arr,
                                             n, ctypes.byref(cfg))
            if s != Status.SUCCESS:
                m = _capi.lib.brg_reducer_last_error(None)  # create's own failure
                raise Error(s, m.decode(errors="replace") if m else "", "brg_reducer_create")
            self._params = arr
            views = self._views

            def destroy(handle: int) -> int:
                st = _capi.lib.brg_reducer_destroy(handle)
                for v in views:  # the library is done with the buffers
                    v.release()
                views.clear()
                return int(st)

            # A child of the communicator's: closing that closes this first.
            assert h.value, "brg_reducer_create returned SUCCESS and no reducer"
            self._core = _Owned(h.value, destroy, comm._core)
        except BaseException:
            for v in self._views:
                v.release()
            raise


    @property
    def _handle(self) -> Optional[int]:
        """The C reducer, None once this reducer or its communicator is closed."""
        core = self._core
        return None if core is None or core.closing else core.handle

    def _check(self, s: int, call: str) -> None:
        from . import Error

        if s != Status.SUCCESS:
            m = _capi.lib.brg_reducer_last_error(self._handle)
            raise Error(s, m.decode(errors="replace") if m else "", call)

    def _h(self) -> int:
        from . import Error

        h = self._handle
        if h is None:
            comm_closed = getattr(self._comm, "_handle", 0) is None
            raise Error(Status.ERR_INVALID_USAGE,
                        "the reducer was closed" + (" (its communicator was closed)"
                                                    if comm_closed else ""), "brigade.Reducer")
        return h

    def _param(self, param: Any, call: str) -> int:
        """A parameter index as an int; one outside the registered ones is the
        library's ERR_INVALID_ARGUMENT with its sentence (a negative index or
        one past size_t would otherwise wrap on its way into C)."""
        from . import ArgumentError, _c_int

        n = len(self._counts)
        try:
            return _c_int(param, "parameter", call, 0, n - 1)
        except ArgumentError:
            raise ArgumentError(Status.ERR_INVALID_ARGUMENT,
                                f"{call}: parameter {param} out of range ({n} registered)",
                                call) from None

    def broadcast_params(self, root: int = 0) -> None:
        """Copies every parameter's values from rank `root` to all ranks."""
        from . import _c_int

        r = _c_int(root, "root", "brg_reducer_broadcast_params")
        self._check(_capi.lib.brg_reducer_broadcast_params(self._h(), r),
                    "brg_reducer_broadcast_params")

    def prepare(self, no_sync: bool = False) -> None:
        """Starts a backward pass; no_sync=True only accumulates gradients locally."""
        self._check(_capi.lib.brg_reducer_prepare(self._h(),
                                                  _capi.REDUCER_NO_SYNC if no_sync else 0),
                    "brg_reducer_prepare")

    def mark_ready(self, param: int) -> None:
        """Parameter `param`'s gradient is final for this step."""
        h = self._h()
        self._check(_capi.lib.brg_reducer_mark_ready(h, self._param(param,
                                                                    "brg_reducer_mark_ready")),
                    "brg_reducer_mark_ready")

    def finalize(self) -> None:
        """Waits for every bucket: the gradients are averaged (or summed)."""
        self._check(_capi.lib.brg_reducer_finalize(self._h()), "brg_reducer_finalize")

    def grad_address(self, param: int) -> int:
        """Where parameter `param`'s gradient lives (with grad_as_view: in a bucket)."""
        p = ctypes.c_void_p()
        h = self._h()
        i = self._param(param, "brg_reducer_grad")
        self._check(_capi.lib.brg_reducer_grad(h, i, ctypes.byref(p)),
                    "brg_reducer_grad")
        return p.value or 0

    def grad(self, param: int) -> Any:
        """Parameter `param`'s gradient as a NumPy array over brigade's memory
        (needs NumPy; float16 as numpy.float16, bfloat16 as raw uint16). The
        array, and every slice of it, keeps that memory alive: a reducer closed
        meanwhile is destroyed once the last of them is gone."""
        import numpy as np

        table = {DType.INT8: np.int8, DType.UINT8: np.uint8, DType.INT32: np.int32,
                 DType.UINT32: np.uint32, DType.INT64: np.int64, DType.UINT64: np.uint64,
                 DType.FLOAT16: np.float16, DType.BFLOAT16: np.uint16,
                 DType.FLOAT32: np.float32, DType.FLOAT64: np.float64}
        addr = self.grad_address(param)
        i = operator.index(param)  # grad_address checked it
        dt = np.dtype(table[self._dtypes[i]])
        n = self._counts[i]
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(addr)
        buf._pin = self._core.pin()  # type: ignore[attr-defined,union-attr]
        return np.frombuffer(cast(Any, buf), dtype=dt, count=n)

    @property
    def num_buckets(self) -> int:
        n = ctypes.c_size_t()
        self._check(_capi.lib.brg_reducer_num_buckets(self._h(), ctypes.byref(n)),
                    "brg_reducer_num_buckets")
        return n.value

    def bucket_layout(self, bucket: int) -> Tuple[DType, int, List[int]]:
        """(dtype, element count, parameter indices in bucket order) of a bucket."""
        d, c, npar = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_size_t()
        idx = ctypes.POINTER(ctypes.c_size_t)()
        from . import SIZE_MAX, _c_int

        b = _c_int(bucket, "bucket", "brg_reducer_bucket_layout", 0, SIZE_MAX)
        self._check(_capi.lib.brg_reducer_bucket_layout(self._h(), b, ctypes.byref(d),
                                                        ctypes.byref(c), ctypes.byref(npar),
                                                        ctypes.byref(idx)),
                    "brg_reducer_bucket_layout")
        return DType(d.value), c.value, [idx[i] for i in range(npar.value)]

    def close(self) -> None:
        """Destroys the reducer (``brg_reducer_destroy``); idempotent. Later calls
        raise :class:`brigade.Error`; while a view from :meth:`grad` lives, the
        C reducer stays until it goes."""
        core = self._core
        if core is not None and not core.closing:
            s = core.close()
            if s != Status.SUCCESS:
                from . import Error

                raise Error(s, "brg_reducer_destroy failed", "brg_reducer_destroy")

    def __enter__(self) -> "Reducer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None and not core.closing:
            try:
                self.close()
            except Exception:
                pass
