"""The ctypes declarations of brigade._capi against the C headers.

abi_dump (built by meson from tests/python/abi_dump.c) prints what the C
compiler makes of brigade.h and brigade_reducer.h; every enum value,
constant, struct size and field offset must match the Python side, and
every enumerator of the headers must be known to it (a value added to the
header without the package fails here).
"""
import ctypes
import json
import os
import re
import subprocess

import pytest

from brigade import _capi

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(HERE, "..", "..", "include")


@pytest.fixture(scope="module")
def abi():
    exe = os.environ.get("BRIGADE_ABI_DUMP")
    if not exe:
        pytest.skip("BRIGADE_ABI_DUMP is not set (meson test sets it)")
    return json.loads(subprocess.check_output([exe], text=True))


def strip_end(d):
    return {k: v for k, v in d.items() if k != "end"}


def test_enums(abi):
    for section, enum_cls, prefix in (("status", _capi.Status, "BRG_"),
                                      ("dtype", _capi.DType, "BRG_"), ("op", _capi.Op, "BRG_"),
                                      ("hook", _capi.ReducerHook, "BRG_REDUCER_HOOK_")):
        c = {k[len(prefix):]: v for k, v in strip_end(abi[section]).items()}
        py = {m.name: m.value for m in enum_cls}
        assert py == c, f"{section}: Python {py} vs C {c}"


def test_constants(abi):
    c = strip_end(abi["constants"])
    assert (c["BRG_VERSION_MAJOR"], c["BRG_VERSION_MINOR"], c["BRG_VERSION_PATCH"]) == \
        _capi.VERSION
    assert c["BRG_UNIQUE_ID_BYTES"] == _capi.UNIQUE_ID_BYTES
    assert c["BRG_NUM_DTYPES"] == _capi.NUM_DTYPES == len(_capi.DType)
    assert c["BRG_NUM_OPS"] == _capi.NUM_OPS == len(_capi.Op)
    assert c["BRG_SPLIT_NOCOLOR"] == _capi.SPLIT_NOCOLOR
    assert c["BRG_COMM_CONFIG_VERSION"] == _capi.COMM_CONFIG_VERSION
    assert c["BRG_CONFIG_UNSET"] == _capi.CONFIG_UNSET
    for name in ("SUM", "FIND_UNUSED", "STATIC_GRAPH", "GRAD_AS_VIEW", "NO_REBUILD", "DEVICE",
                 "NO_SYNC"):
        assert c["BRG_REDUCER_" + name] == getattr(_capi, "REDUCER_" + name), name


STRUCTS = {"brg_unique_id": _capi.UniqueIdStruct, "brg_request": _capi.RequestStruct,
           "brg_comm_config": _capi.CommConfig,
           "brg_reducer_param": _capi.ReducerParam, "brg_reducer_bucket": _capi.ReducerBucket,
           "brg_reducer_config": _capi.ReducerConfig}


@pytest.mark.parametrize("cname", sorted(STRUCTS))
def test_struct_layout(abi, cname):
    c = abi["structs"][cname]
    py = STRUCTS[cname]
    assert ctypes.sizeof(py) == c["size"], f"{cname}: sizeof"
    cf = {k: tuple(v) for k, v in c["fields"].items() if k != "end"}
    pf = {name: (getattr(py, name).offset, getattr(py, name).size) for name, _ in py._fields_}
    assert pf == cf, f"{cname}: Python (offset, size) {pf} vs C {cf}"


def test_every_enumerator_is_dumped(abi):
    """abi_dump itself must cover every enumerator the headers declare."""
    dumped = set()
    for section in ("status", "dtype", "op", "hook"):
        dumped |= set(strip_end(abi[section]))
    text = ""
    for h in ("brigade.h", "brigade_reducer.h"):
        with open(os.path.join(INCLUDE, h)) as f:
            text += f.read()
    declared = set()
    for body in re.findall(r"typedef enum\s*\{(.*?)\}", text, re.S):
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        for item in body.split(","):
            name = item.split("=")[0].strip()
            if name:
                declared.add(name)
    assert declared == dumped, f"declared {sorted(declared - dumped)} not dumped; " \
        f"dumped {sorted(dumped - declared)} not declared"


def _c_kind(param):
    """What ctypes passes for a C parameter: a pointer, size_t or int."""
    param = param.strip()
    if "*" in param or param.split()[0] in ("brg_stream",):
        return "ptr"
    if param.split()[0] == "size_t":
        return "size"
    return "int"  # int, brg_dtype, brg_op: C ints


_PY_KIND = {ctypes.c_void_p: "ptr", ctypes.c_size_t: "size", ctypes.c_int: "int"}


def test_optional_declarations():
    """Each call _capi declares where the library has it (point-to-point,
    its tagged forms, gather, scatter) against its prototype in brigade.h:
    the same number of parameters, each of the same kind (pointer, size_t,
    int), so that ctypes passes what the C function reads."""
    with open(os.path.join(INCLUDE, "brigade.h")) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    for name, (res, *args) in _capi.OPTIONAL.items():
        m = re.search(r"brg_status\s+" + name + r"\s*\(([^)]*)\)\s*;", text)
        assert m, f"{name} is not declared in brigade.h"
        c = [_c_kind(p) for p in m.group(1).split(",")]
        py = [_PY_KIND.get(a, "ptr") for a in args]
        assert res is ctypes.c_int, name
        assert py == c, f"{name}: Python passes {py}, the header declares {c}"
