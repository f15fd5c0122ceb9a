"""GPU buffers from Python: ``__cuda_array_interface__`` (v2 and v3 with its
stream) and DLPack on kDLCUDA, through brigade's device collectives, on the
emulated CUDA module (tests/gpu/emu_module.c), so no GPU is needed.

Each rank allocates "device" memory and streams through the module
(emu.py), the same instance libbrigade.so opens (BRIGADE_CUDA_MODULE), wraps
them in small objects that expose only the interface under test, runs a
collective, waits for the stream, copies the result back and checks every
element against a reference computed with NumPy from the same inputs. The
emulated streams are asynchronous threads with random delays, so a
collective that ran on another stream than the one the test waits for, or
that read its input before the upload, shows up as wrong data.
"""
import ctypes
import os

import numpy as np
import pytest

import brigade
import ranks
from emu import Emu
from test_collectives import NP_TYPES, check, decoded, expect, make, values

EMU = os.environ.get("BRIGADE_EMU_MODULE", "")


@pytest.fixture(autouse=True)
def need_emu():
    if not EMU or not os.path.exists(EMU):
        if os.environ.get("BRIGADE_TEST_NO_SKIP"):
            pytest.fail(f"BRIGADE_EMU_MODULE ({EMU!r}) names no emulated CUDA module")
        pytest.skip("BRIGADE_EMU_MODULE is not set (meson test sets it)")


def rank_env():
    # BRIGADE_DEVICE_PROXY=1: the call returns once the work is queued, so a
    # result read after waiting for another stream than the one used is wrong.
    return {"BRIGADE_CUDA_MODULE": EMU, "BRIGADE_TRANSPORTS": "cuda_ipc,shm", "BRIGADE_DEVICE_PROXY": "1"}


class DevArray:
    """One-dimensional "device" memory with __cuda_array_interface__."""

    def __init__(self, emu, host, stream=None, version=3):
        self.emu, self.dtype, self.count = emu, host.dtype, host.size
        self.nbytes = host.nbytes
        self.ptr = emu.alloc(self.nbytes)
        self.stream, self.version = stream, version
        emu.upload(self.ptr, host.ctypes.data, self.nbytes)

    @property
    def __cuda_array_interface__(self):
        d = {"shape": (self.count,), "typestr": self.dtype.str, "data": (self.ptr, False),
             "strides": None, "version": self.version}
        if self.version >= 3:
            d["stream"] = self.stream
        return d

    def host(self):
        # Read directly (the module's "device" memory is host memory): a copy
        # through the module would first wait for the legacy default stream,
        # as cudaMemcpy does, and hide work left running on it.
        return np.frombuffer(ctypes.string_at(self.ptr, self.nbytes), dtype=self.dtype).copy()

    def free(self):
        self.emu.free(self.ptr)


# DLPack, as dlpack.h lays it out
class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManaged(ctypes.Structure):
    _fields_ = [("t", DLTensor), ("ctx", ctypes.c_void_p), ("deleter", DELETER)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object
_DL_CODES = {"i": 0, "u": 1, "f": 2}


class DevDLPack(DevArray):
    """The same memory with only DLPack (kDLCUDA); records the streams its
    __dlpack__ was asked for and counts the deleter calls."""

    def __init__(self, emu, host, device, bfloat16=False):
        super().__init__(emu, host)
        self.device, self.bf16 = device, bfloat16
        self.asked, self.deleted, self._keep = [], 0, []

    __cuda_array_interface__ = None  # hide the base class's

    def __dlpack_device__(self):
        return (2, self.device)  # kDLCUDA

    def __dlpack__(self, stream=None):
        self.asked.append(stream)
        shape = (ctypes.c_int64 * 1)(self.count)
        m = DLManaged()
        m.t.data, m.t.device_type, m.t.device_id, m.t.ndim = self.ptr, 2, self.device, 1
        m.t.code = 4 if self.bf16 else _DL_CODES[self.dtype.kind]
        m.t.bits, m.t.lanes = self.dtype.itemsize * 8, 1
        m.t.shape = shape

        def deleter(_):
            self.deleted += 1

        m.deleter = DELETER(deleter)
        self._keep += [shape, m, m.deleter]
        return _capsule_new(ctypes.addressof(m), b"dltensor", None)


def body_device(comm):
    n, r = comm.size, comm.rank
    emu = Emu(EMU)
    dev = r % emu.devices  # as LOCAL_RANK would pick on a machine with several GPUs
    emu.set_device(dev)
    s1, s2 = emu.stream(), emu.stream()
    live = []

    def dev_array(host, **kw):
        a = DevArray(emu, host, **kw)
        live.append(a)
        assert emu.is_device(a.ptr)
        return a

    # allreduce: every dtype; the interface's stream (v3), stream= (v2, no
    # stream in the interface), and the legacy default stream (v3, stream None)
    for dt in NP_TYPES:
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for count, op in ((1, "sum"), (4099, "max"), (70001, "sum"), (4099, "avg")):
            want = expect(dt, n, count, op)
            x = make(dt, values(r, count, op))
            a = dev_array(x, stream=s1)
            o = dev_array(np.zeros_like(x), stream=s1)
            assert comm.allreduce(a, out=o, op=op, **kw) is o
            emu.sync(s1)
            check("device allreduce (interface stream)", dt, o.host(), want, op, n)
            check("device allreduce input untouched", dt, a.host(), x, "none", n)
            b = dev_array(x, version=2)
            comm.allreduce(b, op=op, stream=s2, **kw)
            emu.sync(s2)
            check("device allreduce in place (stream=)", dt, b.host(), want, op, n)
            c = dev_array(x, stream=None)
            comm.allreduce(c, op=op, **kw)
            emu.sync(0)
            check("device allreduce (default stream)", dt, c.host(), want, op, n)
    # the other collectives, on DLPack and the interface
    for dt in ("float32", "bfloat16", "int64", "uint8"):
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for count in (1, 5001):
            x = make(dt, values(r, count * n, "sum"))
            a = DevDLPack(emu, x, dev, bfloat16=bool(kw))
            o = dev_array(np.zeros(count, dtype=x.dtype), stream=s2)
            comm.reduce_scatter(a, out=o, stream=s2, **kw)
            emu.sync(s2)
            assert a.asked == [s2] and a.deleted == 1, (a.asked, a.deleted)
            check("device reduce_scatter (DLPack input)", dt, o.host(),
                  expect(dt, n, count * n, "sum")[r * count:(r + 1) * count], "sum", n)
            mine = make(dt, values(r, count, "sum"))
            a = dev_array(mine, stream=s1)
            o = DevDLPack(emu, np.zeros(count * n, dtype=x.dtype), dev, bfloat16=bool(kw))
            comm.all_gather(a, out=o, stream=s1, **kw)
            emu.sync(s1)
            want = np.concatenate([make(dt, values(k, count, "sum")) for k in range(n)])
            check("device all_gather (DLPack output)", dt, o.host(), decoded(dt, want), "none",
                  n)
            for root in range(n):
                a = dev_array(make(dt, values(r, count, "sum")), stream=s1)
                comm.broadcast(a, root=root, **kw)
                emu.sync(s1)
                check("device broadcast", dt, a.host(),
                      decoded(dt, make(dt, values(root, count, "sum"))), "none", n)
                d = DevDLPack(emu, make(dt, values(r, count, "sum")), dev, bfloat16=bool(kw))
                before = d.host()
                comm.reduce(d, root=root, **kw)  # no stream anywhere: the legacy default
                emu.sync(0)
                assert d.asked == [1], d.asked  # DLPack's name for the legacy default stream
                check("device reduce", dt, d.host(),
                      expect(dt, n, count, "sum") if r == root else decoded(dt, before),
                      "sum" if r == root else "none", n)
    # gather and scatter (staged through host memory): every root, odd
    # counts, the interface's stream; the other ranks' output or input unused
    for dt in ("float64", "int32"):
        for count in (1, 1001):
            for root in range(n):
                a = dev_array(make(dt, values(r, count, "sum")), stream=s1)
                o = dev_array(np.zeros(count * n, dtype=a.dtype), stream=s1) if r == root else None
                got = comm.gather(a, root=root, out=o)
                assert got is o
                if r == root:
                    want = np.concatenate([make(dt, values(k, count, "sum")) for k in range(n)])
                    check("device gather", dt, o.host(), want, "none", n)
                ins = dev_array(np.concatenate([make(dt, values(k + 7, count, "sum"))
                                                for k in range(n)]), stream=s2) if r == root else None
                o = dev_array(np.zeros(count, dtype=a.dtype), stream=s2)
                assert comm.scatter(ins, root=root, out=o) is o
                check("device scatter", dt, o.host(), make(dt, values(r + 7, count, "sum")),
                      "none", n)
    # ranks mix host and GPU buffers in one gather and one scatter (each
    # rank's buffers are its own choice): odd ranks GPU, even ranks NumPy
    count = 33
    for root in (0, 1):
        mine = make("int32", values(r, count, "sum"))
        a = dev_array(mine, stream=s1) if r % 2 else mine.copy()
        o = None
        if r == root:
            z = np.zeros(count * n, np.int32)
            o = dev_array(z, stream=s1) if r % 2 else z
        comm.gather(a, root=root, out=o)
        if r == root:
            got = o.host() if r % 2 else o
            want = np.concatenate([make("int32", values(k, count, "sum")) for k in range(n)])
            check("mixed gather", "int32", got, want, "none", n)
        ins = None
        if r == root:
            h = np.concatenate([make("int32", values(k + 3, count, "sum")) for k in range(n)])
            ins = dev_array(h, stream=s2) if r % 2 else h
        z = np.zeros(count, np.int32)
        o = dev_array(z, stream=s2) if r % 2 else z
        comm.scatter(ins, root=root, out=o)
        check("mixed scatter", "int32", o.host() if r % 2 else o,
              make("int32", values(r + 3, count, "sum")), "none", n)
    # what the device path refuses, with brigade's own sentence
    a = dev_array(np.ones(8, np.float32), stream=s1)
    with pytest.raises(brigade.Error) as e:
        comm.iallreduce(a)
    assert e.value.status == brigade.Status.ERR_INVALID_ARGUMENT, e.value
    with pytest.raises(brigade.Error) as e:
        comm.allreduce(a, out=np.zeros(8, np.float32))
    assert "host memory" in str(e.value), e.value
    with pytest.raises(ValueError, match="stream 0"):
        comm.allreduce(dev_array(np.ones(8, np.float32), stream=0))
    comm.barrier()
    for s in (s1, s2):
        emu.sync(s)
    for a in live:
        a.free()


@pytest.mark.parametrize("n", [2, 3])
def test_device_buffers(n):
    ranks.run(n, body_device, timeout=240, env=rank_env())


def test_dlpack_cpu_torch():
    """DLPack from a real producer (torch, on the CPU): its capsule is read,
    the data reduced in place, and its deleter runs once."""
    torch = pytest.importorskip("torch")
    ranks.run(2, _body_dlpack_cpu)
    assert torch


class _OnlyDLPack:
    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        assert stream is None, "a CPU producer must be asked with stream None"
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def _body_dlpack_cpu(comm):
    import torch

    n, r = comm.size, comm.rank
    for dt in (torch.float32, torch.int32, torch.bfloat16, torch.uint8):
        t = (torch.arange(300) % 50 + r).to(dt)
        comm.allreduce(_OnlyDLPack(t))
        assert torch.equal(t, (torch.arange(300) % 50 * n + sum(range(n))).to(dt)), dt
    with pytest.raises(ValueError, match="not contiguous"):
        comm.allreduce(_OnlyDLPack(torch.ones(4, 4)[:, 1]))


def body_device_setup(comm):
    emu = Emu(EMU)
    dev = comm.rank % emu.devices
    emu.set_device(dev)
    with pytest.raises(brigade.Error, match="device 99 is not in"):
        comm.device_setup(99)
    comm.device_setup()  # every rank: the device path is built here
    comm.device_setup(dev)  # already built: returns at once
    s = emu.stream()
    host = np.arange(1001, dtype=np.float32) + comm.rank
    a = DevArray(emu, host, stream=s)
    comm.allreduce(a)
    emu.sync(s)
    want = sum(np.arange(1001, dtype=np.float32) + r for r in range(comm.size))
    assert np.array_equal(a.host(), want)
    a.free()


def test_device_setup():
    ranks.run(2, body_device_setup, timeout=120, env=rank_env())
