"""The emulated CUDA module (tests/gpu/emu_module.c) reached from Python.

libbrigade_cuda_emu.so exports one symbol, brg__cuda_module_api, returning
the table that kernels/cuda/brg_cuda.h declares (abi, then the driver and
the kernels tables). The ctypes struct below is built from that header's
field names, flattened, so it follows the header; the
table's abi field is checked against BRG__CUDA_ABI. A test loads the same
file that BRIGADE_CUDA_MODULE names, so it and libbrigade.so share one
instance of the module: memory allocated here is "device" memory to
brigade, and streams made here are streams brigade can run on.
"""
from __future__ import annotations

import ctypes
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "..", "..", "kernels", "cuda", "brg_cuda.h")


def _table_type() -> tuple:
    with open(HEADER) as f:
        text = f.read()
    abi = int(re.search(r"#define BRG__CUDA_ABI (\d+)", text).group(1))
    def body(name: str) -> str:
        m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
        return re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)

    top = body("brg__cuda_api").split()
    assert top == ["int", "abi;", "brg__cuda_driver", "drv;", "brg__cuda_kernels", "kern;"], (
        "brg_cuda.h: the table is no longer abi, drv, kern"
    )
    # the two tables of pointers follow abi with no padding between them
    names = []
    for sub in ("brg__cuda_driver", "brg__cuda_kernels"):
        names += re.findall(r"\(\*(\w+)\)\s*\(", body(sub))

    class Table(ctypes.Structure):
        _fields_ = [("abi", ctypes.c_int)] + [(n, ctypes.c_void_p) for n in names]

    return Table, abi


_I = ctypes.c_int
_P = ctypes.c_void_p
_SIGS = {  # the functions a test uses
    "probe": (_I, ctypes.c_char_p, ctypes.c_size_t),
    "error_string": (ctypes.c_char_p, _I),
    "pointer_is_device": (_I, _P, ctypes.POINTER(_I)),
    "mem_alloc": (_I, ctypes.POINTER(_P), ctypes.c_size_t),
    "mem_free": (_I, _P),
    "mem_copy": (_I, _P, _P, ctypes.c_size_t),
    "mem_set": (_I, _P, _I, ctypes.c_size_t),
    "stream_sync": (_I, _P),
    "stream_create": (_I, ctypes.POINTER(_P)),
    "stream_destroy": (_I, _P),
    "set_device": (_I, _I),
}


class Emu:
    """The module's functions a test needs; every failure raises."""

    def __init__(self, path: str):
        self.dl = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        entry = self.dl.brg__cuda_module_api
        Table, abi = _table_type()
        entry.restype = ctypes.POINTER(Table)
        t = entry().contents
        assert t.abi == abi, f"{path}: table abi {t.abi}, brg_cuda.h says {abi}"
        self.fn = {n: ctypes.CFUNCTYPE(*sig)(getattr(t, n)) for n, sig in _SIGS.items()}
        why = ctypes.create_string_buffer(256)
        self.devices = self.fn["probe"](why, 256)
        assert self.devices > 0, why.value.decode()

    def _ok(self, e: int, what: str) -> None:
        if e:
            raise RuntimeError(f"emulated CUDA {what}: {self.fn['error_string'](e).decode()}")

    def set_device(self, d: int) -> None:
        self._ok(self.fn["set_device"](d), "set_device")

    def alloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._ok(self.fn["mem_alloc"](ctypes.byref(p), nbytes), "mem_alloc")
        return p.value

    def free(self, p: int) -> None:
        self._ok(self.fn["mem_free"](p), "mem_free")

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self._ok(self.fn["stream_create"](ctypes.byref(s)), "stream_create")
        return s.value

    def sync(self, s: int) -> None:
        self._ok(self.fn["stream_sync"](s), "stream_sync")

    def upload(self, dst: int, src, nbytes: int) -> None:
        self._ok(self.fn["mem_copy"](dst, src, nbytes), "mem_copy")

    def download(self, dst, src: int, nbytes: int) -> None:
        self._ok(self.fn["mem_copy"](dst, src, nbytes), "mem_copy")

    def is_device(self, p: int) -> bool:
        d = ctypes.c_int(-1)
        return bool(self.fn["pointer_is_device"](p, ctypes.byref(d)))
