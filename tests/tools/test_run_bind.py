#!/usr/bin/python3
"""brigade-run --bind: with N ranks on K CPUs (N <= K) rank r runs on the
r-th of N contiguous shares of the CPUs brigade-run may use, the shares
disjoint and together all of them; with more ranks than CPUs no rank is
bound and brigade-run says so. Without --bind every rank keeps them all.
The ranks report their own affinity (os.sched_getaffinity), read here.

usage: test_run_bind.py BRIGADE_RUN"""
import os
import subprocess
import sys

RUN = sys.argv[1]
REPORT = [sys.executable, "-c",
          "import os; print(os.environ['RANK'], ','.join(map(str, sorted(os.sched_getaffinity(0)))))"]


def run(n, bind):
    # --tag-output: whole lines, however the ranks' writes interleave
    p = subprocess.run([RUN, "--tag-output"] + (["--bind"] if bind else []) + ["-n", str(n)] + REPORT,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        sys.exit("FAIL: brigade-run -n %d exited %d: %s" % (n, p.returncode, p.stderr))
    got = {}
    for line in p.stdout.splitlines():
        _, r, cpus = line.split()
        got[int(r)] = [int(c) for c in cpus.split(",")]
    if sorted(got) != list(range(n)):
        sys.exit("FAIL: -n %d: ranks reported %s" % (n, sorted(got)))
    return got, p.stderr


allowed = sorted(os.sched_getaffinity(0))
k = len(allowed)
bad = 0
for n in sorted({1, 2, min(k, 3), k}):
    if n > k:
        continue
    got, _ = run(n, True)
    for r in range(n):
        want = allowed[r * k // n:(r + 1) * k // n]
        if got[r] != want:
            print("FAIL: --bind -n %d: rank %d runs on CPUs %s, expected %s" % (n, r, got[r], want))
            bad = 1
    print("--bind -n %d on %d CPUs: %s" % (n, k, "; ".join("rank %d: %s" % (r, got[r]) for r in range(n))))
got, err = run(k + 1, True)
if any(got[r] != allowed for r in got) or "not bound" not in err:
    print("FAIL: --bind -n %d on %d CPUs: %s, stderr %r" % (k + 1, k, got, err))
    bad = 1
got, _ = run(2, False)
if any(got[r] != allowed for r in got):
    print("FAIL: without --bind the ranks run on %s, expected %s each" % (got, allowed))
    bad = 1
print("FAIL" if bad else "ok")
sys.exit(bad)
