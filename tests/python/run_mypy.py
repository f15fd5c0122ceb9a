#!/usr/bin/env python3
"""mypy --strict over the package brigade (python/), as its users' type
checkers see it, then typing_cases.py, a program using it; skipped (77) where mypy is not installed (Debian:
python3-mypy).

    run_mypy.py PACKAGE_PARENT CACHE_DIR
"""
import os
import sys

try:
    from mypy import api
except ImportError:
    print(f"skip: mypy is not installed for {sys.executable} (apt-get install python3-mypy)")
    sys.exit(77)

os.chdir(sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
out, err, rc = api.run(["--strict", "--cache-dir", sys.argv[2], "-p", "brigade"])
if rc == 0:  # a program using it: what must not type-check does not
    out, err, rc = api.run(["--strict", "--cache-dir", sys.argv[2],
                            os.path.join(here, "typing_cases.py")])
print(out + err, end="")
sys.exit(rc)
