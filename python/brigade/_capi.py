"""The C API of libbrigade.so as ctypes declarations.

Every enum value and struct layout here is copied from include/brigade.h and
include/brigade_reducer.h; tests/python/test_abi.py compares them with what
a C compiler makes of those headers (tests/python/abi_dump.c), so the two
cannot drift apart unnoticed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import enum
import glob
import os
from typing import Any

UNIQUE_ID_BYTES = 128
VERSION = (0, 1, 0)  # BRG_VERSION_MAJOR, _MINOR, _PATCH


class Status(enum.IntEnum):
    """brg_status."""

    SUCCESS = 0
    IN_PROGRESS = 1
    ERR_INVALID_ARGUMENT = 2
    ERR_INVALID_USAGE = 3
    ERR_SYSTEM = 4
    ERR_TIMEOUT = 5
    ERR_REMOTE = 6
    ERR_MISMATCH = 7
    ERR_UNAVAILABLE = 8
    ERR_ABORTED = 9
    ERR_NO_MEMORY = 10
    ERR_INTERNAL = 11


class DType(enum.IntEnum):
    """brg_dtype."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    BFLOAT16 = 7
    FLOAT32 = 8
    FLOAT64 = 9


class Op(enum.IntEnum):
    """brg_op."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


NUM_DTYPES = 10
NUM_OPS = 8

# brg_reducer_config flags and brg_reducer_prepare's flag.
REDUCER_SUM = 0x01
REDUCER_FIND_UNUSED = 0x02
REDUCER_STATIC_GRAPH = 0x04
REDUCER_GRAD_AS_VIEW = 0x08
REDUCER_NO_REBUILD = 0x10
REDUCER_DEVICE = 0x20  # GPU buffers (not offered by this package yet)
REDUCER_NO_SYNC = 0x01


class ReducerHook(enum.IntEnum):
    """brg_reducer_hook."""

    ALLREDUCE = 0
    FP16 = 1
    BF16 = 2
    CUSTOM = 3


class UniqueIdStruct(ctypes.Structure):
    """brg_unique_id."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class RequestStruct(ctypes.Structure):
    """brg_request: caller-owned, opaque."""

    _fields_ = [("internal", ctypes.c_uint64 * 16)]


class CommConfig(ctypes.Structure):
    """brg_comm_config."""

    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint),
                ("timeout_ms", ctypes.c_int), ("transports", ctypes.c_char_p)]


COMM_CONFIG_VERSION = 1
CONFIG_UNSET = -1


class ReducerParam(ctypes.Structure):
    """brg_reducer_param."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("count", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("grad", ctypes.c_void_p),
    ]


class ReducerBucket(ctypes.Structure):
    """brg_reducer_bucket."""

    _fields_ = [
        ("index", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("average", ctypes.c_int),
        ("request", ctypes.POINTER(RequestStruct)),
        ("stream", ctypes.c_void_p),  # device form: the communication stream
    ]


HOOK_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.POINTER(ReducerBucket))


class ReducerConfig(ctypes.Structure):
    """brg_reducer_config."""

    _fields_ = [
        ("bucket_cap_bytes", ctypes.c_size_t),
        ("first_bucket_cap_bytes", ctypes.c_size_t),
        ("flags", ctypes.c_uint),
        ("hook", ctypes.c_int),
        ("hook_launch", HOOK_FN),
        ("hook_finish", HOOK_FN),
        ("hook_arg", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
    ]


def _candidates() -> list[str]:
    env = os.environ.get("BRIGADE_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    # A wheel holds the versioned file only (wheels carry no symlinks).
    out = sorted(glob.glob(os.path.join(here, "libbrigade.so*")))
    found = ctypes.util.find_library("brigade")
    out += [found] if found else []
    out.append("libbrigade.so.0")
    return out


def _load() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
    raise ImportError("brigade: cannot load libbrigade.so (set BRIGADE_LIBRARY to its path): "
                      + "; ".join(errors))


lib = _load()

_st = ctypes.c_int
_comm = ctypes.c_void_p
_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_int = ctypes.c_int


def _decl(name: str, restype: Any, *argtypes: Any) -> None:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_decl("brg_status_string", ctypes.c_char_p, _int)
_decl("brg_dtype_name", ctypes.c_char_p, _int)
_decl("brg_op_name", ctypes.c_char_p, _int)
_decl("brg_dtype_size", _sz, _int)
_decl("brg_get_unique_id", _st, ctypes.POINTER(UniqueIdStruct))
_decl("brg_comm_init", _st, ctypes.POINTER(_comm), _int, ctypes.POINTER(UniqueIdStruct), _int)
_decl("brg_comm_init_env", _st, ctypes.POINTER(_comm))
_decl("brg_comm_init_config", _st, ctypes.POINTER(_comm), _int, ctypes.POINTER(UniqueIdStruct),
      _int, ctypes.POINTER(CommConfig))
_decl("brg_comm_rank", _st, _comm, ctypes.POINTER(_int))
_decl("brg_comm_size", _st, _comm, ctypes.POINTER(_int))
_decl("brg_comm_last_error", ctypes.c_char_p, _comm)
_decl("brg_comm_abort", _st, _comm)
_decl("brg_comm_destroy", _st, _comm)
_decl("brg_comm_bytes_sent", _st, _comm, ctypes.POINTER(ctypes.c_uint64))
_decl("brg_allreduce", _st, _vp, _vp, _sz, _int, _int, _comm, _vp)
_decl("brg_reduce_scatter", _st, _vp, _vp, _sz, _int, _int, _comm, _vp)
_decl("brg_all_gather", _st, _vp, _vp, _sz, _int, _comm, _vp)
_decl("brg_broadcast", _st, _vp, _vp, _sz, _int, _int, _comm, _vp)
_decl("brg_reduce", _st, _vp, _vp, _sz, _int, _int, _int, _comm, _vp)
_decl("brg_barrier", _st, _comm)
_decl("brg_iallreduce", _st, _vp, _vp, _sz, _int, _int, _comm, ctypes.POINTER(RequestStruct))
_req = ctypes.POINTER(RequestStruct)
_decl("brg_ireduce_scatter", _st, _vp, _vp, _sz, _int, _int, _comm, _req)
_decl("brg_iall_gather", _st, _vp, _vp, _sz, _int, _comm, _req)
_decl("brg_ibroadcast", _st, _vp, _vp, _sz, _int, _int, _comm, _req)
_decl("brg_ireduce", _st, _vp, _vp, _sz, _int, _int, _int, _comm, _req)
_decl("brg_ibarrier", _st, _comm, _req)
_decl("brg_get_version", _st, ctypes.POINTER(_int), ctypes.POINTER(_int), ctypes.POINTER(_int))
_decl("brg_comm_split", _st, _comm, _int, _int, ctypes.POINTER(_comm))
_decl("brg_comm_get_async_error", _st, _comm, ctypes.POINTER(_int))
_decl("brg_comm_device_setup", _st, _comm, _int)
_decl("brg_test", _st, ctypes.POINTER(RequestStruct), ctypes.POINTER(_int))
_decl("brg_wait", _st, ctypes.POINTER(RequestStruct))

# Point-to-point and all-to-all: declared where the loaded library has them
# (older libraries do not; the wrappers then raise naming the call).
OPTIONAL = {
    "brg_send": (_st, _vp, _sz, _int, _int, _comm, _vp),
    "brg_recv": (_st, _vp, _sz, _int, _int, _comm, _vp),
    "brg_all_to_all": (_st, _vp, _vp, _sz, _int, _comm, _vp),
    "brg_isend": (_st, _vp, _sz, _int, _int, _comm, _req),
    "brg_irecv": (_st, _vp, _sz, _int, _int, _comm, _req),
    "brg_gather": (_st, _vp, _vp, _sz, _int, _int, _comm, _vp),
    "brg_scatter": (_st, _vp, _vp, _sz, _int, _int, _comm, _vp),
    "brg_igather": (_st, _vp, _vp, _sz, _int, _int, _comm, _req),
    "brg_iscatter": (_st, _vp, _vp, _sz, _int, _int, _comm, _req),
    "brg_send_tagged": (_st, _vp, _sz, _int, _int, _int, _comm, _vp),
    "brg_recv_tagged": (_st, _vp, _sz, _int, _int, _int, _comm, _vp),
    "brg_isend_tagged": (_st, _vp, _sz, _int, _int, _int, _comm, _req),
    "brg_irecv_tagged": (_st, _vp, _sz, _int, _int, _int, _comm, _req),
}
for _name, (_res, *_args) in OPTIONAL.items():
    if hasattr(lib, _name):
        _decl(_name, _res, *_args)


def has(name: str) -> bool:
    """Whether the loaded library exports the C function `name`."""
    return hasattr(lib, name)


SPLIT_NOCOLOR = -1  # BRG_SPLIT_NOCOLOR

_red = ctypes.c_void_p
_decl("brg_reducer_create", _st, ctypes.POINTER(_red), _comm, ctypes.POINTER(ReducerParam), _sz,
      ctypes.POINTER(ReducerConfig))
_decl("brg_reducer_destroy", _st, _red)
_decl("brg_reducer_broadcast_params", _st, _red, _int)
_decl("brg_reducer_prepare", _st, _red, ctypes.c_uint)
_decl("brg_reducer_mark_ready", _st, _red, _sz)
_decl("brg_reducer_finalize", _st, _red)
_decl("brg_reducer_grad", _st, _red, _sz, ctypes.POINTER(_vp))
_decl("brg_reducer_num_buckets", _st, _red, ctypes.POINTER(_sz))
_decl("brg_reducer_bucket_layout", _st, _red, _sz, ctypes.POINTER(_int), ctypes.POINTER(_sz),
      ctypes.POINTER(_sz), ctypes.POINTER(ctypes.POINTER(_sz)))
_decl("brg_reducer_last_error", ctypes.c_char_p, _red)


def library_path() -> str:
    """The file libbrigade.so was loaded from."""
    with open("/proc/self/maps") as f:
        for line in f:
            if "libbrigade.so" in line and "libbrigade_" not in line.rsplit("/", 1)[-1]:
                return line.split()[-1]
    return lib._name
