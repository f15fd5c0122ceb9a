"""python -m brigade.info: what brigade-info prints, for the library this
package loads (version, kernels, every BRIGADE_* setting, the transports),
preceded by what the package carries: the CUDA module (for which GPU
architectures, or why it is missing) and the NCCL-compatible library.

    python -m brigade.info [brigade-info's options]
    python -m brigade.info --nccl-path   the NCCL library's path, alone
                                         (for LD_PRELOAD / LD_LIBRARY_PATH)
    python -m brigade.info --include     the folder of brigade.h
    python -m brigade.info --pkgconfig-dir   the folder of brigade.pc
                                         (PKG_CONFIG_PATH)
    python -m brigade.info --cmake-dir   the folder of brigadeConfig.cmake
                                         (brigade_DIR, CMAKE_PREFIX_PATH)

It runs the brigade-info program installed with the package (the wheel puts
it beside the Python interpreter's scripts), since the settings table lives
in the library's internals; BRIGADE_INFO names another copy.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
from typing import Optional


def find_brigade_info() -> Optional[str]:
    env = os.environ.get("BRIGADE_INFO")
    if env:
        return env
    cands = [os.path.join(sysconfig.get_path("scripts"), "brigade-info"),
             os.path.join(os.path.dirname(sys.executable), "brigade-info")]
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("brigade-info")


def _build() -> object:
    try:  # written by meson at install
        return importlib.import_module("brigade._build")
    except ImportError:
        return None


def _libdir() -> str:
    import brigade

    return os.path.dirname(brigade.library_path())


def cuda_module() -> tuple[Optional[str], str]:
    """(path of the CUDA module the library will open, a sentence on it), or
    (None, why there is none). BRIGADE_CUDA_MODULE, when set, wins."""
    forced = os.environ.get("BRIGADE_CUDA_MODULE")
    if forced:
        return forced, "named by BRIGADE_CUDA_MODULE"
    b = _build()
    name = getattr(b, "CUDA_MODULE", "libbrigade_cuda.so") if b else "libbrigade_cuda.so"
    if b is not None and not name:
        return None, f"not built: {getattr(b, 'CUDA_WHY_NOT', '') or 'no nvcc at build time'}"
    path = os.path.join(_libdir(), name)
    if not os.path.exists(path):
        return None, f"not found beside the library ({path})"
    if b is None:
        return path, "GPU architectures unknown (not an installed build)"
    archs = " ".join("sm_" + a for a in b.CUDA_ARCHS.split())  # type: ignore[attr-defined]
    return path, f"machine code for {archs}, PTX of compute_{b.CUDA_PTX}"  # type: ignore


def nccl_library() -> tuple[Optional[str], str]:
    """(path of the NCCL-compatible library, "") or (None, why there is none)."""
    b = _build()
    names = [getattr(b, "NCCL_LIBRARY", "")] if b else ["libnccl.so.2", "libbrigade_nccl.so"]
    if b is not None and not names[0]:
        return None, f"not built: {getattr(b, 'NCCL_WHY_NOT', '') or 'no CUDA toolkit'}"
    d = _libdir()
    for n in names:
        for where in (d, os.path.join(d, "compat")):  # compat/: a build tree
            if os.path.exists(os.path.join(where, n)):
                return os.path.join(where, n), ""
    return None, f"not found beside the library ({d})"


# What a C or C++ program builds with: option -> (_build.py's field, the
# file that must be there, its use).
DEVEL = {"--include": ("INCLUDE_DIR", "brigade.h", "the headers"),
         "--pkgconfig-dir": ("PKGCONFIG_DIR", "brigade.pc", "pkg-config's brigade.pc"),
         "--cmake-dir": ("CMAKE_DIR", "brigadeConfig.cmake", "the CMake package")}


def devel_dir(option: str) -> tuple[Optional[str], str]:
    """(the folder DEVEL[option] names, "") or (None, why there is none)."""
    field, name, what = DEVEL[option]
    b = _build()
    if b is None or not getattr(b, field, ""):
        return None, f"{what}: not an installed build (no brigade._build)"
    # relative to the package folder (a wheel), or absolute (installed)
    d = os.path.join(os.path.dirname(os.path.abspath(getattr(b, "__file__"))), getattr(b, field))
    if not os.path.exists(os.path.join(d, name)):
        return None, f"{what}: no {name} in {d}"
    return d, ""


def main(argv: Optional[list[str]] = None) -> int:
    import brigade

    args = list(argv if argv is not None else sys.argv[1:])
    for opt in DEVEL:
        if opt in args:
            d, why = devel_dir(opt)
            if d is None:
                print(f"brigade: {why}", file=sys.stderr)
                return 1
            print(d)
            return 0
    if "--nccl-path" in args:
        path, why = nccl_library()
        if path is None:
            print(f"brigade: no NCCL-compatible library: {why}", file=sys.stderr)
            return 1
        print(path)
        return 0
    print(f"brigade (Python) {brigade.__version__}: {brigade.library_path()}")
    path, what = cuda_module()
    print(f"CUDA module: {path}: {what}" if path else f"CUDA module: none: {what}")
    path, why = nccl_library()
    print(f"NCCL library (LD_PRELOAD): {path}" if path else f"NCCL library: none: {why}")
    sys.stdout.flush()
    prog = find_brigade_info()
    if prog is None:
        print("brigade-info not found (pip install . puts it in the environment's bin; "
              "BRIGADE_INFO=path names it)", file=sys.stderr)
        return 1
    return subprocess.call([prog] + args)


if __name__ == "__main__":
    sys.exit(main())
