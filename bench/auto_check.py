#!/usr/bin/python3
"""BRIGADE_ALGO=auto against the fastest of ring, tree and rhd, measured.

For each transport and rank count, runs all_reduce_perf once per algorithm
(ring, tree, rhd, auto), ROUNDS rounds interleaved, on the sizes given,
and prints each algorithm's best out-of-place time, auto's choice (from
its INFO line), auto's time over the fastest one's, and the same for the
algorithm auto picked (the best of auto's runs and the forced runs of
that algorithm: the same code, so this takes out some of a busy
machine's noise). --before BUILD also runs auto of another build (an
earlier commit) in the same rounds: its choice and ratios beside.

  bench/auto_check.py --build build --transports tcp --ranks 8,16,32
  bench/auto_check.py --build build --transports shm --ranks 4,8,16,32,64 \
      --env BRIGADE_MODEL_FILE=model.json
"""
import argparse
import os
import re
import subprocess
import sys

ALGOS = ["ring", "tree", "rhd", "auto"]
BEFORE = "auto-before"


def run(build, transport, n, algo, lo, hi, iters, env_extra):
    env = dict(os.environ, BRIGADE_TRANSPORTS=transport, BRIGADE_ALGO=algo,
               BRIGADE_DEBUG="INFO", BRIGADE_DEBUG_SUBSYS="coll")
    env.update(env_extra)
    cmd = [os.path.join(build, "tools", "brigade-run"), "-n", str(n),
           os.path.join(build, "bench", "all_reduce_perf"), "-b", str(lo), "-e", str(hi),
           "-f", "2", "-n", str(iters), "-w", "3", "-R", "0"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    times, chosen = {}, {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) > 8 and f[0].isdigit() and f[4] == "-1":
            times[int(f[0])] = float(f[5]) * 1e-6
    for m in re.finditer(r"allreduce algorithm: (\w+) \(BRIGADE_ALGO=auto.*?first at (\d+) bytes",
                         p.stderr):
        chosen[int(m.group(2))] = m.group(1)
    if p.returncode != 0 or not times:
        sys.stderr.write("%s n=%d %s failed (%d):\n%s\n" % (transport, n, algo, p.returncode,
                                                            p.stderr[-2000:]))
    return times, chosen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--ranks", default="8,16,32")
    ap.add_argument("--sizes", default="8,65536")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for every run")
    ap.add_argument("--before", help="another build whose auto runs beside")
    a = ap.parse_args()
    env_extra = dict(e.split("=", 1) for e in a.env)
    sizes = [int(s) for s in a.sizes.split(",")]
    algos = ALGOS + ([BEFORE] if a.before else [])
    head = "| transport | N | bytes | ring us | tree us | rhd us | auto us | auto picks | " \
           "auto/fastest | pick/fastest |"
    if a.before:
        head += " before picks | before auto/fastest | before pick/fastest |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for tr in a.transports.split(","):
        for n in [int(x) for x in a.ranks.split(",")]:
            best = {al: {} for al in algos}
            picks = {al: {} for al in algos}
            for _ in range(a.rounds):
                for al in algos:
                    build = a.before if al == BEFORE else a.build
                    algo = "auto" if al == BEFORE else al
                    for size in sizes:  # auto says its choice once per kind: one size a run
                        t, ch = run(build, tr, n, algo, size, size, a.iters, env_extra)
                        for s, v in t.items():
                            best[al][s] = min(best[al].get(s, v), v)
                        picks[al].update(ch)
            for s in sizes:
                row = [best[al].get(s) for al in ALGOS]
                fastest = min(x for x in row[:3] if x) if any(row[:3]) else None

                def ratios(al):
                    pick = picks[al].get(s, "?")
                    t = best[al].get(s)
                    forced = best.get(pick, {}).get(s)
                    same = min(x for x in (t, forced) if x) if (t or forced) else None
                    r1 = t / fastest if t and fastest else float("nan")
                    r2 = same / fastest if same and fastest else float("nan")
                    return pick, r1, r2

                pick, r1, r2 = ratios("auto")
                line = "| %s | %d | %d | %s | %s | %.2f | %.2f |" % (
                    tr, n, s, " | ".join("%.0f" % (x * 1e6) if x else "-" for x in row),
                    pick, r1, r2)
                if a.before:
                    line += " %s | %.2f | %.2f |" % ratios(BEFORE)
                print(line, flush=True)


if __name__ == "__main__":
    main()
