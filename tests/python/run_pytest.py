#!/usr/bin/env python3
"""Runs one file of the Python package's tests under pytest for meson test.

Exits 77 (meson's skip) when pytest or NumPy is missing, or when the build
is instrumented by a sanitizer: a Python interpreter cannot load an
ASan/TSan-built libbrigade.so without preloading the sanitizer runtime, and
the C tests already cover the library in those trees.

    run_pytest.py SANITIZE FILE [pytest args...]
"""
import os
import subprocess
import sys


def main() -> int:
    sanitize, test_file, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if sanitize not in ("", "none"):
        print(f"skip: a sanitizer build (b_sanitize={sanitize}); the Python tests run in "
              "the plain build")
        return 77
    missing = []
    for mod in ("pytest", "numpy"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print(f"skip: {', '.join(missing)} not installed for {sys.executable} "
              "(apt-get install python3-pytest python3-numpy)")
        return 77
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-rs", test_file] + rest, env=env,
                           cwd=os.path.dirname(os.path.abspath(test_file)))


if __name__ == "__main__":
    sys.exit(main())
