#!/usr/bin/env python3
"""A C program built against an installed brigade, as its user builds it:
with pkg-config (brigade.pc) and with CMake (find_package(brigade), the
imported target brigade::brigade), then run.

    devel_check.py --destdir MESON BUILDDIR WORK
        meson install (tags devel and runtime) of BUILDDIR into WORK/stage
        (--destdir), then both builds against that staging tree: pkg-config
        with PKG_CONFIG_SYSROOT_DIR (brigade.pc names the final prefix),
        CMake with CMAKE_PREFIX_PATH (the package finds itself relative to
        its own folder); the programs run with LD_LIBRARY_PATH on the
        staged libdir.
    devel_check.py --python PY WORK
        the package installed for the interpreter PY (a wheel): the folders
        come from PY -m brigade.info --pkgconfig-dir / --cmake-dir /
        --include; the programs run with nothing on LD_LIBRARY_PATH (the
        wheel's brigade.pc adds a RUNPATH, CMake its build RPATH).

The program includes brigade.h and brigade_reducer.h, takes the address of
one call of each, compares brg_get_version with the header's BRG_VERSION_*
and with the version the package says (brigade.pc's, brigadeConfig's),
and prints it. Exit 77 when pkg-config or cmake is missing (both are
reported; the other still runs).
"""
import json
import os
import shutil
import subprocess
import sys

PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include "brigade.h"
#include "brigade_reducer.h"

int main(int argc, char **argv) {
  int major = -1, minor = -1, patch = -1;
  if (brg_get_version(&major, &minor, &patch) != BRG_SUCCESS) return 1;
  char lib[64], hdr[64];
  snprintf(lib, sizeof lib, "%d.%d.%d", major, minor, patch);
  snprintf(hdr, sizeof hdr, "%d.%d.%d", BRG_VERSION_MAJOR, BRG_VERSION_MINOR, BRG_VERSION_PATCH);
  /* a call of each header, resolved by the loader */
  void *calls[] = {(void *)brg_allreduce, (void *)brg_reducer_create};
  if (!calls[0] || !calls[1]) return 1;
  printf("library %s, header %s, package %s\n", lib, hdr, argc > 1 ? argv[1] : "?");
  return strcmp(lib, hdr) != 0 || (argc > 1 && strcmp(lib, argv[1]) != 0);
}
"""

CMAKELISTS = """cmake_minimum_required(VERSION 3.13)
project(brigade_user C)
find_package(brigade {version} REQUIRED)
add_executable(user main.c)
target_link_libraries(user PRIVATE brigade::brigade)
file(WRITE ${{CMAKE_BINARY_DIR}}/found.txt "${{brigade_VERSION}}")
"""

failed = []
skipped = []
# A library built with sanitizers (b_sanitize) is linked by programs built
# with the same ones, whose runtime must come first in the process.
san_flags = []


def check(ok, what, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failed.append(what)
    return ok


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def build_pkgconfig(work, pc_dir, sysroot=None, run_env=None):
    pkgc = shutil.which("pkg-config")
    if not pkgc:
        skipped.append("pkg-config not found")
        print("skip pkg-config: not found")
        return
    env = dict(os.environ, PKG_CONFIG_PATH=pc_dir)
    env.pop("PKG_CONFIG_LIBDIR", None)
    if sysroot:
        env["PKG_CONFIG_SYSROOT_DIR"] = sysroot
    r = run([pkgc, "--cflags", "--libs", "brigade"], env=env)
    if not check(r.returncode == 0, "pkg-config --cflags --libs brigade", r.stderr):
        return
    flags = r.stdout.split()
    ver = run([pkgc, "--modversion", "brigade"], env=env).stdout.strip()
    d = os.path.join(work, "pkgconfig-user")
    os.makedirs(d, exist_ok=True)
    src = os.path.join(d, "main.c")
    with open(src, "w") as f:
        f.write(PROGRAM)
    exe = os.path.join(d, "user")
    r = run(["cc", "-Wall", "-Werror", "-o", exe, src] + san_flags + flags)
    if not check(r.returncode == 0, "cc main.c $(pkg-config --cflags --libs brigade)",
                 " ".join(flags) + "\n" + r.stderr[-2000:]):
        return
    r = run([exe, ver], env=run_env)
    check(r.returncode == 0 and f"library {ver}" in r.stdout,
          f"the pkg-config program runs (brigade {ver})", r.stdout + r.stderr)
    print("     " + r.stdout.strip())


def build_cmake(work, prefix_path, version, run_env=None):
    cmake = shutil.which("cmake")
    if not cmake:
        skipped.append("cmake not found")
        print("skip cmake: not found")
        return
    d = os.path.join(work, "cmake-user")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "main.c"), "w") as f:
        f.write(PROGRAM)
    with open(os.path.join(d, "CMakeLists.txt"), "w") as f:
        # the version asked for: major.minor of this one (served before 1.0)
        f.write(CMAKELISTS.format(version=".".join(version.split(".")[:2])))
    b = os.path.join(d, "build")
    # CMAKE_FIND_USE_PACKAGE_REGISTRY off, no system prefixes: only the
    # tree under test can answer find_package
    r = run([cmake, "-S", d, "-B", b, "-DCMAKE_PREFIX_PATH=" + prefix_path,
             "-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF",
             "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", "-DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF",
             "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_C_FLAGS=" + " ".join(san_flags)])
    if not check(r.returncode == 0, "cmake: find_package(brigade) with brigade::brigade",
                 r.stdout[-2000:] + r.stderr[-2000:]):
        return
    found = open(os.path.join(b, "found.txt")).read().strip()
    check(found == version, "brigadeConfig.cmake's brigade_VERSION",
          f"{found!r}, expected {version!r}")
    r = run([cmake, "--build", b])
    if not check(r.returncode == 0, "cmake --build", r.stdout[-2000:] + r.stderr[-2000:]):
        return
    r = run([os.path.join(b, "user"), version], env=run_env)
    check(r.returncode == 0 and f"library {version}" in r.stdout,
          f"the CMake program runs (brigade {version})", r.stdout + r.stderr)
    print("     " + r.stdout.strip())
    # a version this package does not serve is refused
    with open(os.path.join(d, "CMakeLists.txt"), "w") as f:
        f.write(CMAKELISTS.format(version="99.0"))
    r = run([cmake, "-S", d, "-B", b + "-99", "-DCMAKE_PREFIX_PATH=" + prefix_path,
             "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", "-DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF"])
    check(r.returncode != 0 and "99.0" in r.stderr, "find_package(brigade 99.0) is refused",
          r.stderr[-1500:])


def destdir(meson, build, work):
    stage = os.path.join(work, "stage")
    shutil.rmtree(stage, ignore_errors=True)
    r = run([meson, "install", "-C", build, "--no-rebuild", "--destdir", stage,
             "--tags", "devel,runtime"])
    if not check(r.returncode == 0, "meson install --destdir --tags devel,runtime",
                 r.stdout[-2000:] + r.stderr[-2000:]):
        return
    opts = {o["name"]: o["value"] for o in json.loads(
        run([meson, "introspect", "--buildoptions", build]).stdout)}
    prefix, libdir = opts["prefix"], opts["libdir"]
    if opts.get("b_sanitize", "none") != "none":
        san_flags.append("-fsanitize=" + opts["b_sanitize"])
    info = json.loads(run([meson, "introspect", "--projectinfo", build]).stdout)
    version = info["version"]
    root = stage + prefix
    lib = os.path.join(root, libdir)
    for rel in [os.path.join(opts["includedir"], "brigade.h"),
                os.path.join(opts["includedir"], "brigade_reducer.h"),
                os.path.join(libdir, "pkgconfig", "brigade.pc"),
                os.path.join(libdir, "cmake", "brigade", "brigadeConfig.cmake"),
                os.path.join(libdir, "cmake", "brigade", "brigadeConfigVersion.cmake")]:
        check(os.path.exists(os.path.join(root, rel)), f"installed {rel}")
    run_env = dict(os.environ, LD_LIBRARY_PATH=lib)
    build_pkgconfig(work, os.path.join(lib, "pkgconfig"), sysroot=stage, run_env=run_env)
    build_cmake(work, root, version, run_env=run_env)


def wheel(py, work, env=None):
    os.makedirs(work, exist_ok=True)
    env = {k: v for k, v in (env or os.environ).items() if k != "LD_LIBRARY_PATH"}
    dirs = {}
    for opt in ("--include", "--pkgconfig-dir", "--cmake-dir"):
        r = run([py, "-m", "brigade.info", opt], cwd=work, env=env)
        check(r.returncode == 0 and os.path.isdir(r.stdout.strip()),
              f"python -m brigade.info {opt}", r.stdout + r.stderr)
        dirs[opt] = r.stdout.strip()
    if not all(os.path.isdir(d) for d in dirs.values()):
        return
    check(os.path.exists(os.path.join(dirs["--include"], "brigade_reducer.h")),
          "the package holds brigade_reducer.h")
    r = run([py, "-c", "import brigade; print(brigade.__version__)"], cwd=work, env=env)
    version = r.stdout.strip()
    build_pkgconfig(work, dirs["--pkgconfig-dir"], run_env=env)
    # CMAKE_PREFIX_PATH at the package folder: <prefix>/lib/cmake/brigade
    build_cmake(work, os.path.dirname(os.path.dirname(os.path.dirname(dirs["--cmake-dir"]))),
                version, run_env=env)


def main():
    args = sys.argv[1:]
    if len(args) == 4 and args[0] == "--destdir":
        work = os.path.abspath(args[3])
        os.makedirs(work, exist_ok=True)
        destdir(args[1], os.path.abspath(args[2]), work)
    elif len(args) == 3 and args[0] == "--python":
        work = os.path.abspath(args[2])
        os.makedirs(work, exist_ok=True)
        wheel(args[1], work)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if failed:
        print(f"{len(failed)} failed")
        return 1
    if len(skipped) == 2:
        return 77
    print("all passed" + (f" ({'; '.join(skipped)})" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
