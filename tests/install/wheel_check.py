#!/usr/bin/env python3
"""The wheel with the GPU path, as a user gets it: built by pip from this
source tree (nvcc on PATH), installed into a clean virtual environment, and
used from there with nothing of the source or build tree on the paths.

    wheel_check.py SOURCE EMU_MODULE [--archs 75] [--wheel FILE] [--work DIR]
    wheel_check.py SOURCE EMU_MODULE --meson [--work DIR]
    wheel_check.py SOURCE EMU_MODULE --meson --cuda-from BUILD --archs LIST
                   --nvcc NVCC [--work DIR]

Checks, in order:
  1. the wheel is tagged py3-none-<platform> and holds libbrigade.so.0,
     libbrigade_cuda.so, libnccl.so.2 and _build.py in brigade/, and
     include/ (brigade.h, brigade_reducer.h), lib/pkgconfig/brigade.pc and
     lib/cmake/brigade/ (brigadeConfig.cmake, brigadeConfigVersion.cmake);
  2. installed, every library resolves all its needs (ldd: no "not found"),
     libnccl.so.2 finds libbrigade.so.0 through its RUNPATH ($ORIGIN), and
     each one opens with dlopen;
  3. python -m brigade.info names the CUDA module with the architectures
     asked for, the module's fatbinary holds machine code for exactly
     those and PTX of the newest, and --nccl-path prints the installed
     libnccl.so.2;
  4. the installed libbrigade.so opens the installed libbrigade_cuda.so:
     without a GPU the device path says there is no device (the module was
     loaded and asked), never that the module could not be loaded;
  4b. bin/brigade-info, run as installed, names the package's CUDA module;
  4c. a C program builds against the installed package with pkg-config and
     with CMake (find_package(brigade), brigade::brigade) and runs
     (devel_check.py --python);
  5. one device allreduce through the installed package, 2 ranks, on the
     emulated CUDA module (BRIGADE_CUDA_MODULE=EMU_MODULE: the kernel source
     compiled for the CPU; a real GPU is the only check of the real module's
     kernels), every element checked.
--archs is passed as -Dgpu_archs (default: the build's own choice: the
GPU's, else sm_80 and sm_90); --wheel skips the build. Exit 77 (skip) without
nvcc or pip.

--meson is the quick form, for every test run (no nvcc, no meson-python,
no network): meson configures the wheel's layout (-Dwheel=true, as
pyproject.toml's setup arguments, with -Dcuda=disabled), builds only what
the install tags runtime and python-runtime install, installs that into a
staging folder and packs it as meson-python does: files bound for the
package folder ({py_purelib}) go to the wheel's root, programs ({bindir})
to its scripts, and anything bound elsewhere fails the check (meson-python
would move libraries to .brigade.mesonpy.libs, or tag the wheel for one
interpreter). pip installs that wheel (--no-index) into a clean venv, and
steps 2 to 5 run on what it has: libbrigade.so.0 and the package, the
CUDA module and the NCCL library said to be absent and why, and the device
allreduce on the emulated module named by BRIGADE_CUDA_MODULE. Every rank
also runs one host allreduce.

--cuda-from BUILD gives the quick form the CUDA module: the wheel's layout
is configured with CUDA (-Dgpu_archs=LIST, the architectures BUILD's module
was built for), so that its libnccl.so.2 and _build.py are its own and the
module is where the wheel's install tags put it; the module alone (minutes
of nvcc) is taken from BUILD, after checking that every command ninja would
run to build it in the wheel's tree is the one BUILD ran (the same nvcc,
sources, flags and architectures; paths inside each build folder compared
relative to it; nvcc's -Werror, which --werror adds, aside). meson install then puts
it wherever its install tag and folder say, and the checks of the full
form run: the module and libnccl.so.2 in the package, ldd, RUNPATH
$ORIGIN, dlopen, brigade.info, the installed library opening the module.
Both forms also read the architectures out of the installed module's
fatbinary (.nv_fatbin) and compare them with what brigade.info says. What
the quick form leaves to the full one: meson-python's own packing, and
nvcc's compile of the module in the wheel's own configuration (every
architecture).
"""
import argparse
import base64
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile

failed = []


def check(ok, what, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failed.append(what)
    return ok


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


CHILD = r'''
import ctypes, os, sys
import numpy as np
import brigade
site = sys.argv[1]
assert brigade.library_path().startswith(site), brigade.library_path()
sys.path.insert(0, sys.argv[2])  # tests/python: emu.py
from emu import Emu

class Dev:
    def __init__(self, emu, host, stream):
        self.ptr, self.n, self.stream = emu.alloc(host.nbytes), host.size, stream
        emu.upload(self.ptr, host.ctypes.data, host.nbytes)
    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": "<f4", "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": self.stream}

comm = brigade.Communicator.from_env()
h = np.arange(1001, dtype=np.int64) * (comm.rank + 1)
comm.allreduce(h)
want = np.arange(1001, dtype=np.int64) * sum(r + 1 for r in range(comm.size))
assert np.array_equal(h, want), (h[:8], want[:8])
emu = Emu(os.environ["BRIGADE_CUDA_MODULE"])
emu.set_device(comm.rank % emu.devices)
s = emu.stream()
host = np.arange(4099, dtype=np.float32) + comm.rank
a = Dev(emu, host, s)
comm.allreduce(a)
emu.sync(s)
got = np.frombuffer(ctypes.string_at(a.ptr, host.nbytes), np.float32)
want = sum(np.arange(4099, dtype=np.float32) + r for r in range(comm.size))
assert np.array_equal(got, want), (got[:8], want[:8])
comm.close()
print("allreduce ok", comm.size, "ranks")
'''


def introspect(build, what):
    r = run(["meson", "introspect", "--" + what, build])
    if r.returncode:
        raise SystemExit(f"FAIL meson introspect --{what}: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


# The CUDA module's file name in a build folder and in the package
# (python/meson.build's CUDA_MODULE).
CUDA_MODULE = "libbrigade_cuda.so"


def ninja_commands(build, target):
    """Every command ninja runs to build `target` in `build`, each as a list
    of words, with paths inside `build` relative to it and every other
    relative path made absolute, and nvcc's "-Werror all-warnings" (from
    --werror: it stops a build, it changes no output) left out, so that two
    build folders of one source tree compare equal when they build the same
    thing the same way."""
    r = run(["ninja", "-C", build, "-t", "commands", target])
    if r.returncode:
        return None
    top = os.path.realpath(build)
    cmds = []
    for line in r.stdout.splitlines():
        words = []
        for w in shlex.split(line):
            if w == "all-warnings" and words and words[-1] == "-Werror":
                words.pop()
                continue
            if "/" in w and not w.startswith("-") and not os.path.isabs(w):
                full = os.path.realpath(os.path.join(top, w))
                w = os.path.relpath(full, top) if full.startswith(top + os.sep) else full
            words.append(w)
        cmds.append(words)
    return cmds


def meson_wheel(src, work, cuda_from=None, archs="", nvcc=""):
    """The wheel from meson alone (--meson): the wheel's configuration
    (without CUDA, or with it and the CUDA module taken from the build
    folder cuda_from), only what the wheel's install tags name built,
    staged by meson install and packed as meson-python packs it. Returns
    its path, or None after a failed check."""
    build, stage, out = (os.path.join(work, d) for d in ("build", "stage", "dist"))
    tags = ("runtime", "python-runtime")  # pyproject.toml's install arguments
    t = time.monotonic()
    # pyproject.toml's setup arguments, meson-python's build type; the
    # interpreter is the one the venv is made from.
    setup = ["--buildtype=release", "-Db_ndebug=if-release", "-Dwheel=true",
             "-Dpython=enabled", "-Dtests=disabled", "-Dbench_peers=disabled"]
    env = None
    if cuda_from:
        setup += ["-Dcuda=enabled", "-Dgpu_archs=" + archs]
        env = dict(os.environ, PATH=os.path.dirname(nvcc) + os.pathsep + os.environ["PATH"])
    else:
        setup += ["-Dcuda=disabled"]
    said = os.path.join(work, "setup-args.json")
    if not os.path.exists(said) or json.load(open(said)) != setup:
        shutil.rmtree(build, ignore_errors=True)  # configured otherwise by an earlier run
    if not os.path.exists(os.path.join(build, "meson-private", "coredata.dat")):
        r = run(["meson", "setup", build, src] + setup + ["--native-file", native_file(work)],
                env=env)
        if not check(r.returncode == 0, "meson setup (the wheel's layout)",
                     r.stdout[-3000:] + r.stderr[-2000:]):
            return None
        with open(said, "w") as f:
            json.dump(setup, f)
    # meson regenerates the tree first if the source's build files changed
    # since it was configured: the install plan read next is today's.
    r = run(["ninja", "-C", build, "build.ninja"])
    if not check(r.returncode == 0, "the wheel's tree regenerated",
                 r.stdout[-3000:] + r.stderr[-2000:]):
        return None
    plan = introspect(build, "install-plan")
    installed = introspect(build, "installed")
    files = {}  # build or source path -> destination with meson's placeholders
    for group in plan.values():
        for path, d in group.items():
            if d.get("tag") in tags:
                files[path] = d["destination"]
    wanted = [os.path.relpath(p, build) for p in plan.get("targets", {}) if p in files]
    if cuda_from:
        # The module is whatever the wheel's tree names libbrigade_cuda.so:
        # if its install tag is not one of the wheel's, it is not in
        # `wanted`, meson install leaves it out and the wheel lacks it.
        module = next((w for w in wanted if os.path.basename(w) == CUDA_MODULE), None)
        if module is not None:
            wanted.remove(module)
            mine, theirs = ninja_commands(build, module), ninja_commands(cuda_from, module)
            same = mine is not None and mine == theirs
            diff = "" if same else "\n".join(
                f"wheel tree: {' '.join(a)}\n{os.path.basename(cuda_from)}: {' '.join(b)}"
                for a, b in zip(mine or [[]], theirs or [[]]) if a != b)
            if not check(same and bool(mine), f"the wheel's tree builds {module} as "
                         f"{cuda_from} did (every nvcc command)", diff[-3000:]):
                return None
            # ... from today's sources (meson test --no-rebuild could leave it behind)
            r = run(["ninja", "-C", cuda_from, "-n", module])
            if not check(r.returncode == 0 and "no work to do" in r.stdout,
                         f"{cuda_from}/{module} is up to date", r.stdout[-2000:] + r.stderr):
                return None
            shutil.copy2(os.path.join(cuda_from, module), os.path.join(build, module))
    r = run(["ninja", "-C", build] + wanted)
    if not check(r.returncode == 0, "ninja " + " ".join(wanted), r.stdout[-4000:] + r.stderr):
        return None
    shutil.rmtree(stage, ignore_errors=True)
    r = run(["meson", "install", "-C", build, "--no-rebuild", "--destdir", stage,
             "--tags", ",".join(tags)])
    if not check(r.returncode == 0, "meson install --tags " + ",".join(tags), r.stderr[-2000:]):
        return None
    info = introspect(build, "projectinfo")
    dist = "brigade-" + info["version"]
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    whl = os.path.join(out, f"{dist}-py3-none-{plat}.whl")
    os.makedirs(out, exist_ok=True)
    elsewhere, record = [], []
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc, data, mode=0o644):
            zi = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{arc},sha256={digest.decode()},{len(data)}")

        for path, dest in sorted(files.items(), key=lambda x: x[1]):
            if dest.startswith("{py_purelib}/"):
                arc = dest[len("{py_purelib}/"):]
            elif dest.startswith("{bindir}/"):
                arc = f"{dist}.data/scripts/" + dest[len("{bindir}/"):]
            else:  # platlib (an interpreter's tag), libdir (.mesonpy.libs), ...
                elsewhere.append(dest)
                continue
            src_file = stage + installed.get(path, "")
            if not os.path.isfile(src_file):
                elsewhere.append(dest + " (not installed)")
                continue
            with open(src_file, "rb") as f:
                add(arc, f.read(), os.stat(src_file).st_mode & 0o777)
        meta = (f"Metadata-Version: 2.1\nName: brigade\nVersion: {info['version']}\n"
                "Requires-Python: >=3.9\n")
        add(f"{dist}.dist-info/METADATA", meta.encode())
        add(f"{dist}.dist-info/WHEEL", ("Wheel-Version: 1.0\nGenerator: wheel_check.py\n"
                                        f"Root-Is-Purelib: true\nTag: py3-none-{plat}\n").encode())
        record.append(f"{dist}.dist-info/RECORD,,")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    check(not elsewhere, "every file of the wheel's install tags goes to the package or bin",
          ", ".join(elsewhere))
    print(f"ok   wheel from meson: {os.path.basename(whl)} in {time.monotonic() - t:.0f} s")
    return whl


def native_file(work):
    """A meson native file naming the interpreter the venv is made from,
    as meson-python names the one that builds."""
    path = os.path.join(work, "native.ini")
    with open(path, "w") as f:
        f.write(f"[binaries]\npython = '{base_python()}'\npython3 = '{base_python()}'\n")
    return path


def base_python():
    # A clean environment: Debian's interpreter and its packages (NumPy),
    # nothing of this tree.
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def fatbin_archs(path):
    """({compute capabilities with machine code}, {with PTX}) of the
    device code in an ELF file's .nv_fatbin section: a run of fatbinaries
    (magic 0xBA55ED50, a 16-byte header, then entries of kind 1, PTX, or 2,
    machine code, each with its own header: size at 4, padded payload size
    at 8, architecture at 28)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:5] != b"\x7fELF\x02":
        raise ValueError(f"{path}: not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = secs[shstrndx][4]

    def name(sec):
        at = names + sec[0]
        return data[at:data.index(b"\0", at)].decode()

    fat = next((sec for sec in secs if name(sec) == ".nv_fatbin"), None)
    if fat is None:
        raise ValueError(f"{path}: no .nv_fatbin section (no device code)")
    blob = data[fat[4]:fat[4] + fat[5]]
    sm, ptx = set(), set()
    pos = 0
    while pos + 16 <= len(blob):
        magic, _, hsize, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != 0xBA55ED50:
            pos += 8  # alignment between fatbinaries
            continue
        at, end = pos + hsize, pos + hsize + size
        while at + 32 <= end:
            kind, _, ehsize, padded = struct.unpack_from("<HHII", blob, at)
            arch = struct.unpack_from("<I", blob, at + 28)[0]
            if kind == 1:
                ptx.add(str(arch))
            elif kind == 2:
                sm.add(str(arch))
            else:
                raise ValueError(f"{path}: fatbinary entry of unknown kind {kind}")
            at += ehsize + padded
        pos = end
    return sm, ptx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("emu")
    ap.add_argument("--archs", default="")
    ap.add_argument("--wheel", default="")
    ap.add_argument("--work", default="")
    ap.add_argument("--meson", action="store_true",
                    help="the quick form: the wheel packed from meson's install")
    ap.add_argument("--cuda-from", default="",
                    help="with --meson: the build folder whose CUDA module the wheel carries")
    ap.add_argument("--nvcc", default="", help="with --cuda-from: the nvcc it was built with")
    ap.add_argument("--no-nccl", action="store_true",
                    help="with --cuda-from: that folder has no NCCL library (no nccl.h in "
                    "the CUDA toolkit), so the wheel has none either")
    a = ap.parse_args()
    if a.cuda_from and not (a.meson and a.archs and a.nvcc):
        ap.error("--cuda-from goes with --meson, --archs and --nvcc")
    src = os.path.abspath(a.source)
    if not shutil.which("nvcc") and not a.wheel and not a.meson:
        print("skip: nvcc is not on PATH (the wheel's CUDA module needs it)")
        return 77
    work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="brigade-wheel-"))
    os.makedirs(work, exist_ok=True)
    venv = os.path.join(work, "venv")
    t0 = time.monotonic()
    base = base_python()
    # A fresh venv each run: what an earlier run installed must not count.
    shutil.rmtree(venv, ignore_errors=True)
    r = run([base, "-m", "venv", "--system-site-packages", venv])
    if r.returncode:
        print(f"skip: no venv ({r.stderr.strip()[-300:]})")
        return 77
    py = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "BRIGADE_LIBRARY", "BRIGADE_INFO", "BRIGADE_CUDA_MODULE",
                        "LD_LIBRARY_PATH", "LD_PRELOAD", "RANK", "WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    whl = a.wheel
    if not whl and a.meson:
        whl = meson_wheel(src, work, os.path.abspath(a.cuda_from) if a.cuda_from else None,
                          a.archs, a.nvcc)
        if whl is None:
            return 1
    elif not whl:
        out = os.path.join(work, "dist")
        cmd = [py, "-m", "pip", "wheel", "--no-deps", "-w", out, src,
               "--config-settings=build-dir=" + os.path.join(work, "build")]
        if a.archs:
            cmd.append("--config-settings=setup-args=-Dgpu_archs=" + a.archs)
        t = time.monotonic()
        # pip builds in an isolated environment with meson-python from the
        # index: the one step that reaches out (the install takes --no-index).
        r = run(cmd, env=env)
        if r.returncode:
            print(r.stdout[-6000:] + r.stderr[-3000:])
            check(False, "pip wheel")
            return 1
        whl = glob.glob(os.path.join(out, "brigade-*.whl"))[0]
        print(f"ok   pip wheel: {os.path.basename(whl)} in {time.monotonic() - t:.0f} s")
    # The quick form's wheel carries the CUDA module and the NCCL library
    # with --cuda-from only.
    gpu = not a.meson or bool(a.cuda_from)
    nccl = gpu and not a.no_nccl
    name = os.path.basename(whl)
    check(re.search(r"-py3-none-linux_[a-z0-9_]+\.whl$", name) is not None,
          "wheel tag py3-none-<platform>", name)
    names = zipfile.ZipFile(whl).namelist()
    inside = {os.path.basename(n): n for n in names if "/brigade/" in "/" + n}
    want_files = ["libbrigade.so.0", "_build.py", "__init__.py", "torch.py", "info.py"]
    # what a C or C++ program builds with (packaging/meson.build)
    for f in ["include/brigade.h", "include/brigade_reducer.h", "lib/pkgconfig/brigade.pc",
              "lib/cmake/brigade/brigadeConfig.cmake",
              "lib/cmake/brigade/brigadeConfigVersion.cmake"]:
        check(any(n.endswith("brigade/" + f) for n in names), f"wheel holds brigade/{f}")
    if gpu:
        want_files += ["libbrigade_cuda.so"]
    if nccl:
        want_files += ["libnccl.so.2"]
    for f in want_files:
        check(f in inside, f"wheel holds brigade/{f}", ", ".join(sorted(inside)))
    check(any(n.endswith(".data/scripts/brigade-info") for n in names),
          "wheel holds the brigade-info program", ", ".join(names))
    check(not any(".mesonpy.libs" in n for n in names), "no library outside the package",
          ", ".join(n for n in names if ".mesonpy.libs" in n))

    r = run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
             "--force-reinstall", whl], env=env)
    if not check(r.returncode == 0, "pip install", r.stderr[-2000:]):
        return 1
    cwd = work  # not the source tree, whose python/ would be imported
    r = run([py, "-c", "import brigade, os; print(os.path.dirname(brigade.__file__))"],
            env=env, cwd=cwd)
    pkg = r.stdout.strip()
    check(pkg.startswith(venv), "the package is the installed one", pkg or r.stderr)
    lib_names = ("libbrigade.so.0",) + (("libbrigade_cuda.so",) if gpu else ()) + (
        ("libnccl.so.2",) if nccl else ())
    libs = {n: os.path.join(pkg, n) for n in lib_names}
    for n, p in libs.items():
        r = run(["ldd", p])
        check(r.returncode == 0 and "not found" not in r.stdout, f"ldd {n}: every need found",
              r.stdout + r.stderr)
        r = run(["readelf", "-d", p])
        check(src not in r.stdout and work not in r.stdout,
              f"{n}: no RUNPATH into the source or build tree", r.stdout[-800:])
        if n != "libbrigade_cuda.so":  # a module for dlopen, without a soname
            check(f"[{n}]" in r.stdout, f"{n}: soname {n}", r.stdout[-800:])
    if nccl:
        r = run(["ldd", libs["libnccl.so.2"]])
        m = re.search(r"libbrigade\.so\.0 => (\S+)", r.stdout)
        check(m is not None and os.path.realpath(m.group(1)) == os.path.realpath(
            libs["libbrigade.so.0"]), "libnccl.so.2 finds the package's libbrigade.so.0",
            r.stdout)
        r = run(["readelf", "-d", libs["libnccl.so.2"]])
        check("[$ORIGIN]" in r.stdout, "libnccl.so.2 RUNPATH $ORIGIN", r.stdout[-800:])
    opener = ("import ctypes, os, sys\n"
              "for p in sys.argv[1:]:\n"
              "    ctypes.CDLL(p, mode=os.RTLD_NOW)\n"
              "    print('opened', p)\n")
    r = run([py, "-c", opener] + list(libs.values()), env=env, cwd=cwd)
    check(r.returncode == 0, f"dlopen of {', '.join(libs)}", r.stdout + r.stderr)

    r = run([py, "-m", "brigade.info", "--nccl-path"], env=env, cwd=cwd)
    if nccl:
        check(r.returncode == 0 and os.path.realpath(r.stdout.strip()) == os.path.realpath(
            libs["libnccl.so.2"]), "brigade.info --nccl-path", r.stdout + r.stderr)
    else:
        why = "nccl.h" if gpu else "-Dcuda=disabled"
        check(r.returncode == 1 and "not built" in r.stderr and why in r.stderr,
              "brigade.info --nccl-path: none, and why", r.stdout + r.stderr)
    r = run([py, "-m", "brigade.info"], env=env, cwd=cwd)
    check(r.returncode == 0 and "BRIGADE_" in r.stdout,
          "python -m brigade.info runs the installed brigade-info", r.stdout[-800:] + r.stderr)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("CUDA module:")), "")
    if gpu:
        # the build's own choice (this GPU's, or the wheel's default list)
        # otherwise: any, as long as the fatbinary holds it (below)
        want = ["sm_" + x for x in a.archs.split(",")] if a.archs else ["sm_"]
        check(libs["libbrigade_cuda.so"] in line
              and all(re.search(re.escape(w) + r"\b", line) for w in want),
              "brigade.info names the CUDA module and its architectures", line or r.stdout)
        # What the module itself carries: machine code for exactly the
        # architectures brigade.info names, PTX of the newest.
        said = re.search(r"machine code for (.*), PTX of compute_(\d+)", line)
        try:
            sm, ptx = fatbin_archs(libs["libbrigade_cuda.so"])
        except (OSError, ValueError) as e:
            sm, ptx = None, str(e)
        check(said is not None and sm == {x[3:] for x in said.group(1).split()}
              and ptx == {said.group(2)},
              "the installed module's fatbinary holds what brigade.info says",
              f"machine code {sorted(sm or [])}, PTX {ptx}; brigade.info: {line}")
        print(f"     fatbinary: sm_{', sm_'.join(sorted(sm or [], key=int))}; "
              f"PTX compute_{', compute_'.join(sorted(ptx, key=int)) if sm else ptx}")
    else:
        check(line == "CUDA module: none: not built: disabled with -Dcuda=disabled",
              "brigade.info says there is no CUDA module, and why", line or r.stdout)
    print("     " + line)

    if gpu:
        # The installed library opens the installed module (no GPU here: it
        # must say so, which only a loaded module can).
        probe = ("import brigade\n"
                 "c = brigade.Communicator.from_env()\n"
                 "try:\n"
                 "    c.device_setup()\n"
                 "    print('device path ready')\n"
                 "except brigade.Error as e:\n"
                 "    print('refused:', e)\n")
        r = run([py, "-c", probe], env=env, cwd=cwd, timeout=120)
        out = r.stdout + r.stderr
        check(r.returncode == 0 and "could not be loaded" not in out
              and "built without" not in out and "does not match" not in out,
              "the installed CUDA module is opened", out)
        print("     " + out.strip().splitlines()[-1] if out.strip() else "")

    if gpu:
        # brigade-info run as installed (bin/, apart from the package) finds
        # the package's module, as the package's library does.
        prog = os.path.join(venv, "bin", "brigade-info")
        r = run([prog], env=env, cwd=cwd, timeout=120)
        check(f"CUDA module: {os.path.realpath(libs['libbrigade_cuda.so'])}" in r.stdout
              and "cannot open" not in r.stdout and "could not be loaded" not in r.stdout,
              "bin/brigade-info finds the package's CUDA module",
              r.stdout[-1500:] + r.stderr[-500:])
        print("     " + next((ln.strip() for ln in r.stdout.splitlines()
                                if ln.strip().startswith("cuda_ipc")), ""))

    # A C program against the installed package: pkg-config and CMake.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import devel_check
    devel_check.wheel(py, os.path.join(work, "devel"), env)
    failed.extend(devel_check.failed)

    # One device allreduce through the installed package, on the emulator.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tests_py = os.path.join(src, "tests", "python")
    procs = []
    for rank in range(2):
        e = dict(env, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), BRIGADE_CUDA_MODULE=os.path.abspath(a.emu),
                 BRIGADE_TRANSPORTS="cuda_ipc,shm", BRIGADE_TIMEOUT_MS="60000")
        procs.append(subprocess.Popen([py, "-c", CHILD, venv, tests_py], env=e, cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    check(all(p.returncode == 0 for p in procs) and all("allreduce ok" in o for o in outs),
          "host and device allreduce through the installed package (emulated module)",
          "\n".join(outs)[-3000:])
    print(f"{len(failed) == 0 and 'all passed' or f'{len(failed)} failed'} "
          f"({time.monotonic() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
