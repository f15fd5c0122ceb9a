"""Turning Python objects into (address, element count, brigade dtype).

Accepted, in this order of preference:

- torch tensors (CPU): ``data_ptr()``, ``numel()``, ``dtype``; they must be
  contiguous.
- objects with ``__array_interface__`` (NumPy arrays and anything that
  mimics them): the data pointer, typestr, shape and strides.
- objects with the buffer protocol (``bytearray``, ``array.array``,
  ``memoryview``, ...), through ``PyObject_GetBuffer`` asking for a
  C-contiguous buffer with its format.

GPU buffers, passed to brigade's device collectives with a CUDA stream:

- torch CUDA tensors: ``data_ptr()``; their stream is torch's current
  stream on the tensor's device.
- objects with ``__cuda_array_interface__`` (version 2 or 3: CuPy, Numba,
  PyTorch, ...): the data pointer, typestr, shape, strides, and (v3) the
  ``stream`` the producer's work is ordered on.
- objects with DLPack (``__dlpack__`` and ``__dlpack_device__``) on kDLCUDA
  (or kDLCPU / kDLCUDAHost, which are host memory): the capsule's
  DLTensor. ``__dlpack__(stream=s)`` is called with the stream the
  collective will run on, so the producer orders its work before it, as the
  DLPack protocol says.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional, Union

from ._capi import DType

# A dtype by name: the names brigade has (and half, float, double).
DTypeName = Literal["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "half",
                    "bfloat16", "float32", "float", "float64", "double"]
DTypeLike = Union[DType, DTypeName, None]

_NAMES = {
    "int8": DType.INT8, "uint8": DType.UINT8, "int32": DType.INT32, "uint32": DType.UINT32,
    "int64": DType.INT64, "uint64": DType.UINT64, "float16": DType.FLOAT16, "half": DType.FLOAT16,
    "bfloat16": DType.BFLOAT16, "float32": DType.FLOAT32, "float": DType.FLOAT32,
    "float64": DType.FLOAT64, "double": DType.FLOAT64,
}
_SIZES = {DType.INT8: 1, DType.UINT8: 1, DType.INT32: 4, DType.UINT32: 4, DType.INT64: 8,
          DType.UINT64: 8, DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT32: 4, DType.FLOAT64: 8}
# __array_interface__ typestr kind + size -> dtype
_TYPESTR = {("i", 1): DType.INT8, ("u", 1): DType.UINT8, ("i", 4): DType.INT32,
            ("u", 4): DType.UINT32, ("i", 8): DType.INT64, ("u", 8): DType.UINT64,
            ("f", 2): DType.FLOAT16, ("f", 4): DType.FLOAT32, ("f", 8): DType.FLOAT64}
# struct-module format codes (native sizes on Linux x86-64/aarch64)
_FORMAT = {"b": DType.INT8, "B": DType.UINT8, "c": DType.UINT8, "i": DType.INT32,
           "I": DType.UINT32, "l": DType.INT64, "L": DType.UINT64, "q": DType.INT64,
           "Q": DType.UINT64, "n": DType.INT64, "N": DType.UINT64, "e": DType.FLOAT16,
           "f": DType.FLOAT32, "d": DType.FLOAT64}


def dtype_of(x: DTypeLike) -> Optional[DType]:
    """A brigade dtype from a DType, a name ("float32", "bfloat16", ...), or None."""
    if x is None or isinstance(x, DType):
        return x
    if isinstance(x, str) and x.lower() in _NAMES:
        return _NAMES[x.lower()]
    raise TypeError(f"brigade: unknown dtype {x!r}; brigade has "
                    + ", ".join(d.name.lower() for d in DType))


def dtype_size(d: DType) -> int:
    return _SIZES[d]


@dataclass
class View:
    """A contiguous buffer as the C API sees it."""

    ptr: int
    count: int  # elements
    dtype: Optional[DType]  # None: the object's type is not one brigade has
    nbytes: int
    readonly: bool
    what: str  # the object's type and element type, for messages
    keep: Any = None  # whatever must stay alive while the pointer is used
    device: bool = False  # GPU memory: the collective needs a stream
    stream: Optional[int] = None  # the producer's stream, where the object names one

    def code(self) -> int:
        """The brg_dtype to pass (the caller has checked that there is one)."""
        assert self.dtype is not None, self.what
        return int(self.dtype)

    def type_name(self) -> str:
        return self.dtype.name.lower() if self.dtype is not None else self.what

    def release(self) -> None:
        if isinstance(self.keep, (_PyBuffer, _DLPackHold)):
            self.keep.release()
        self.keep = None


class _Py_buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
                ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
                ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)), ("internal", ctypes.c_void_p)]


_PyBUF_WRITABLE, _PyBUF_FORMAT, _PyBUF_C_CONTIGUOUS = 0x1, 0x4, 0x38
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_Py_buffer)]
_release_buffer.restype = None


class _PyBuffer:
    """A held Py_buffer, released once."""

    def __init__(self, obj: Any, writable: bool):
        self.held = False  # set first: __del__ runs even when the request below fails
        self.view = _Py_buffer()
        flags = _PyBUF_FORMAT | _PyBUF_C_CONTIGUOUS | (_PyBUF_WRITABLE if writable else 0)
        _get_buffer(obj, ctypes.byref(self.view), flags)  # raises BufferError itself
        self.held = True

    def release(self) -> None:
        if self.held:
            _release_buffer(ctypes.byref(self.view))
            self.held = False

    def __del__(self) -> None:
        if getattr(self, "held", False):
            self.release()


def _is_masked(obj: Any) -> bool:
    """A NumPy masked array (numpy.ma), told by its class without importing NumPy."""
    return any(c.__name__ == "MaskedArray" and c.__module__.startswith("numpy.ma")
               for c in type(obj).__mro__)


def _is_torch(obj: Any) -> bool:
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "dtype")


def _torch_view(t: Any, writable: bool, name: str) -> View:
    import torch

    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"brigade: {name} is a {t.device.type} tensor; brigade takes CPU and "
                        "CUDA tensors")
    if not t.is_contiguous():
        raise ValueError(f"brigade: {name} is a non-contiguous tensor (shape {tuple(t.shape)}, "
                         f"strides {t.stride()}); call .contiguous() first")
    table = {torch.int8: DType.INT8, torch.uint8: DType.UINT8, torch.int32: DType.INT32,
             torch.int64: DType.INT64, torch.float16: DType.FLOAT16,
             torch.bfloat16: DType.BFLOAT16, torch.float32: DType.FLOAT32,
             torch.float64: DType.FLOAT64}
    d = table.get(t.dtype)
    n = t.numel()
    v = View(ptr=t.data_ptr(), count=n, dtype=d, nbytes=n * t.element_size(),
             readonly=False, what=f"a tensor of {t.dtype}", keep=t)
    if t.device.type == "cuda":
        v.device = True
        v.stream = torch.cuda.current_stream(t.device).cuda_stream
    return v


def _array_interface_view(obj: Any, ai: Dict[str, Any], writable: bool, name: str,
                          gpu: bool = False) -> View:
    if ai.get("mask") is not None:
        raise ValueError(f"brigade: {name} is a masked array; pass its data")
    typestr = ai.get("typestr")
    if not isinstance(typestr, str) or len(typestr) < 2:
        raise TypeError(f"brigade: {name}: typestr {typestr!r} of its array interface is not a "
                        "type string")
    kind = typestr[1]
    if kind == "O":
        raise TypeError(f"brigade: {name} is an array of Python objects (dtype object); "
                        "brigade reduces numbers: convert it first (for example "
                        "numpy.asarray(x, dtype=numpy.float64))")
    if not typestr[2:].isdigit() or typestr[0] not in "<>|=":
        raise TypeError(f"brigade: {name}: typestr {typestr!r} of its array interface is not a "
                        "type string")
    size = int(typestr[2:])
    shape = tuple(ai["shape"])
    if typestr[0] == ">" and size > 1:
        raise TypeError(f"brigade: {name} is big-endian ({typestr}); brigade works on this "
                        "machine's byte order")
    n = 1
    for s in shape:
        n *= s
    strides = ai.get("strides")
    if strides is not None and n > 1:
        expect, want = size, []
        for s in reversed(shape):
            want.append(expect)
            expect *= s
        if any(st != w for st, w, dim in zip(strides, reversed(want), shape) if dim > 1):
            raise ValueError(f"brigade: {name} is not contiguous (shape {shape}, strides "
                             f"{tuple(strides)}); pass a contiguous copy "
                             "(numpy.ascontiguousarray)")
    d = _TYPESTR.get((kind, size))
    nbytes = n * size
    data = ai.get("data")
    keep: Any = obj
    if isinstance(data, tuple) or gpu:
        ptr, ro = data if data is not None else (0, False)
        ptr = int(ptr or 0)
    else:
        # The data are an object with the buffer protocol (None: obj itself),
        # from byte `offset` on; hold its buffer while the pointer is used.
        src = obj if data is None else data
        try:
            hold = _PyBuffer(src, False)
        except BufferError as e:
            raise ValueError(f"brigade: {name}: the buffer of its array interface: {e}") from None
        except TypeError:
            raise TypeError(f"brigade: {name}: the data of its array interface "
                            f"({type(src).__name__}) are neither (address, read-only) nor an "
                            "object with the buffer protocol") from None
        offset = ai.get("offset", 0) or 0
        if not isinstance(offset, int) or offset < 0 or offset + nbytes > hold.view.len:
            hold.release()
            raise ValueError(f"brigade: {name}: its array interface describes {nbytes} bytes "
                             f"from offset {offset!r}, but its buffer holds {hold.view.len}")
        ptr, ro, keep = (hold.view.buf or 0) + offset, bool(hold.view.readonly), hold
    return View(ptr=ptr, count=n, dtype=d, nbytes=nbytes, readonly=bool(ro),
                what=f"an array of {_describe_typestr(obj, typestr)}", keep=keep)


def _describe_typestr(obj: Any, typestr: str) -> str:
    dt = getattr(obj, "dtype", None)
    return str(dt) if dt is not None else typestr


def _cuda_array_interface_view(obj: Any, cai: Dict[str, Any], name: str) -> View:
    version = cai.get("version", 0)
    if version < 2:
        raise TypeError(f"brigade: {name}: __cuda_array_interface__ version {version}; brigade "
                        "reads versions 2 and 3")
    v = _array_interface_view(obj, cai, False, name, gpu=True)
    v.device = True
    # v3: None means the producer needs no ordering; 1 is the legacy default
    # stream (handle 0 in CUDA's API), 2 the per-thread default stream (its
    # handle is 2, cudaStreamPerThread); 0 is forbidden by the protocol.
    st = cai.get("stream") if version >= 3 else None
    if st is not None:
        st = int(st)
        if st == 0:
            raise ValueError(f"brigade: {name}: __cuda_array_interface__ stream 0 is "
                             "disallowed by the protocol (1 is the legacy default stream)")
        v.stream = 0 if st == 1 else st
    return v


# DLPack (dlpack.h, the unversioned capsule "dltensor")
_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_DLPACK_DTYPE = {(0, 8): DType.INT8, (1, 8): DType.UINT8, (0, 32): DType.INT32,
                 (1, 32): DType.UINT32, (0, 64): DType.INT64, (1, 64): DType.UINT64,
                 (2, 16): DType.FLOAT16, (2, 32): DType.FLOAT32, (2, 64): DType.FLOAT64,
                 (4, 16): DType.BFLOAT16}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", ctypes.CFUNCTYPE(None,
                                                          ctypes.POINTER(_DLManagedTensor)))]

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get.restype = ctypes.c_void_p
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid.restype = ctypes.c_int
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_rename.restype = ctypes.c_int


class _DLPackHold:
    """A consumed DLPack capsule: the producer's memory stays ours until
    release() calls its deleter (once)."""

    def __init__(self, obj: Any, capsule: Any, managed: Any):
        self.obj, self.capsule, self.managed = obj, capsule, managed

    def release(self) -> None:
        m, self.managed = self.managed, None
        if m is not None and m.contents.deleter:
            m.contents.deleter(m)

    def __del__(self) -> None:
        self.release()


def _dlpack_view(obj: Any, name: str, stream: Optional[int]) -> View:
    dev_type, dev_id = obj.__dlpack_device__()
    dev_type = int(dev_type)
    if dev_type not in (_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged):
        raise TypeError(f"brigade: {name} is a DLPack tensor on device type {dev_type}; "
                        "brigade takes kDLCPU, kDLCUDA, kDLCUDAHost and kDLCUDAManaged")
    on_gpu = dev_type in (_kDLCUDA, _kDLCUDAManaged)
    # The consumer's stream: 1 stands for the legacy default stream (handle 0).
    capsule = obj.__dlpack__(stream=stream or 1) if on_gpu else obj.__dlpack__()
    if not _capsule_valid(capsule, b"dltensor"):
        raise TypeError(f"brigade: {name}: __dlpack__ returned no unconsumed \"dltensor\" "
                        "capsule")
    managed = ctypes.cast(_capsule_get(capsule, b"dltensor"), ctypes.POINTER(_DLManagedTensor))
    _capsule_rename(capsule, b"used_dltensor")  # ours now: the capsule must not free it
    hold = _DLPackHold(obj, capsule, managed)
    try:
        t = managed.contents.dl_tensor
        shape = [t.shape[i] for i in range(t.ndim)]
        n = 1
        for s in shape:
            n *= s
        if t.strides and n > 1:
            expect = 1
            for i in reversed(range(t.ndim)):
                if shape[i] > 1 and t.strides[i] != expect:
                    raise ValueError(f"brigade: {name} is not contiguous (shape "
                                     f"{tuple(shape)}, strides "
                                     f"{tuple(t.strides[k] for k in range(t.ndim))}); pass a "
                                     "contiguous copy")
                expect *= shape[i]
        code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
        d = _DLPACK_DTYPE.get((code, bits)) if lanes == 1 else None
        size = bits // 8 * max(lanes, 1)
        v = View(ptr=(t.data or 0) + t.byte_offset, count=n, dtype=d, nbytes=n * size,
                 readonly=False, what=f"a DLPack tensor of type code {code}, {bits} bits"
                 + (f" x {lanes} lanes" if lanes != 1 else ""), keep=hold)
        v.device = on_gpu
        return v
    except BaseException:
        hold.release()
        raise


def as_view(obj: Any, writable: bool, name: str, stream: Optional[int] = None) -> View:
    """A View of obj; raises TypeError/ValueError naming `name` when it cannot be one.
    `stream` is the CUDA stream the collective will run on (for DLPack's
    __dlpack__(stream=)), when the caller chose one."""
    if _is_masked(obj):
        raise TypeError(f"brigade: {name} is a NumPy masked array; brigade would reduce its "
                        "masked elements too: pass x.filled(value) or, to ignore the mask, "
                        "x.data")
    if _is_torch(obj):
        return _torch_view(obj, writable, name)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _cuda_array_interface_view(obj, cai, name)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__") \
            and not hasattr(obj, "__array_interface__"):
        return _dlpack_view(obj, name, stream)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        v = _array_interface_view(obj, ai, writable, name)
        if writable and v.readonly:
            raise ValueError(f"brigade: {name} is read-only")
        return v
    try:
        pb = _PyBuffer(obj, writable)
    except BufferError as e:
        raise ValueError(f"brigade: {name}: {e}") from None
    except TypeError:
        raise TypeError(f"brigade: {name} ({type(obj).__name__}) has no buffer protocol, "
                        "__array_interface__ or tensor interface") from None
    pv = pb.view
    fmt = (pv.format or b"B").decode()
    code = fmt.lstrip("@=<")
    d = _FORMAT.get(code) if len(code) == 1 else None
    if d is not None and _SIZES[d] != pv.itemsize:
        d = None
    return View(ptr=pv.buf or 0, count=pv.len // max(pv.itemsize, 1), dtype=d, nbytes=pv.len,
                readonly=bool(pv.readonly), what=f"a {type(obj).__name__} of format {fmt!r}",
                keep=pb)
