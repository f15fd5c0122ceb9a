#!/usr/bin/env python3
"""Checks the names the benchmark programs get.

In the build tree they keep nccl-tests' names (build/bench/all_reduce_perf,
which the README and the tests call); installed into bin they are
brigade_all_reduce_perf and so on, so that installing brigade beside
nccl-tests replaces none of its programs.

    check_names.py MESON BUILDDIR
"""
import json
import os
import subprocess
import sys

COLLS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"]


def main() -> int:
    meson, builddir = sys.argv[1], sys.argv[2]
    installed = json.loads(
        subprocess.check_output([meson, "introspect", "--installed", builddir], text=True))
    bins = {os.path.basename(dest) for dest in installed.values()}
    bad = []
    for coll in COLLS:
        ours, theirs = f"brigade_{coll}_perf", f"{coll}_perf"
        if ours not in bins:
            bad.append(f"{ours} is not installed")
        if theirs in bins:
            bad.append(f"{theirs} is installed: it would replace nccl-tests' program")
        if not os.access(os.path.join(builddir, "bench", theirs), os.X_OK):
            bad.append(f"build tree has no bench/{theirs}")
    for b in bad:
        print("FAIL:", b)
    if not bad:
        print("ok: installed as brigade_<coll>_perf; build tree keeps <coll>_perf")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
