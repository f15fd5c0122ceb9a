"""python -m brigade.info: what brigade-info prints, for the library this
package loads (version, kernels, every BRIGADE_* setting, the transports).

It runs the brigade-info program installed with the package (the wheel puts
it beside the Python interpreter's scripts), since the settings table lives
in the library's internals; BRIGADE_INFO names another copy.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig


def find_brigade_info() -> str | None:
    env = os.environ.get("BRIGADE_INFO")
    if env:
        return env
    cands = [os.path.join(sysconfig.get_path("scripts"), "brigade-info"),
             os.path.join(os.path.dirname(sys.executable), "brigade-info")]
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("brigade-info")


def main(argv: list[str] | None = None) -> int:
    import brigade

    print(f"brigade (Python) {brigade.__version__}: {brigade.library_path()}")
    sys.stdout.flush()
    prog = find_brigade_info()
    if prog is None:
        print("brigade-info not found (pip install . puts it in the environment's bin; "
              "BRIGADE_INFO=path names it)", file=sys.stderr)
        return 1
    return subprocess.call([prog] + list(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
