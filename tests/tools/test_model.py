#!/usr/bin/python3
"""bench/model on cases worked by hand (its formulas are runtime/plan/model.c's,
through brigade-info --model: BRIGADE_INFO names the build's), and its
calibration on synthetic
all_reduce_perf output made with known constants.

  test_model.py BENCH_MODEL

The expected times below are written out term by term from the formulas
in bench/model's docstring, not computed by its functions; the latency
chain is also checked against a brute-force walk over every window of the
ring. The calibration is fed text in all_reduce_perf's layout, made here
from alpha and beta chosen per transport and N, and must give them back.
"""
import importlib.machinery
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import tempfile

MODEL = sys.argv[1]
loader = importlib.machinery.SourceFileLoader("bench_model", MODEL)
spec = importlib.util.spec_from_loader("bench_model", loader)
m = importlib.util.module_from_spec(spec)
loader.exec_module(m)

fails = 0


def close(what, got, want, rel=1e-9):
    global fails
    if not math.isclose(got, want, rel_tol=rel, abs_tol=1e-15):
        print("FAIL %s: got %.9g, expected %.9g" % (what, got, want))
        fails += 1
    else:
        print("ok   %s: %.6g" % (what, got))


us = 1e-6
shm = m.Link(1 * us, 1 / 10e9)  # 1 us, 10 GB/s
net = m.Link(20 * us, 1 / 1e9)  # 20 us, 1 GB/s
S = 1 << 20

# (a) flat ring
close("N=2 one host: 2a + S*b", m.ring_time(S, 1, 2, shm, net), 2 * 1e-6 + S / 10e9)
close("N=2 two hosts: 2a_n + S*b_n", m.ring_time(S, 2, 1, shm, net), 2 * 20e-6 + S / 1e9)
# 2 hosts x 2: ring 0 1 | 2 3; a chain of 6 hops crosses 3 network links
close("2x2 flat", m.ring_time(S, 2, 2, shm, net),
      3 * 20e-6 + 3 * 1e-6 + 2 * 3 / 4 * S / 1e9)
# 4 hosts x 2, 14 hops: one lap (4 net + 4 shm) and 6 more (3 net + 3 shm)
close("4x2 flat", m.ring_time(S, 4, 2, shm, net),
      7 * 20e-6 + 7 * 1e-6 + 2 * 7 / 8 * S / 1e9)
# small path (S <= 4 KiB): N-1 hops of S bytes each
close("N=3 one host, 4 KiB", m.ring_time(4096, 1, 3, shm, net), 2 * 1e-6 + 2 * 4096 / 10e9)
close("N=3 one host, 8 KiB", m.ring_time(8192, 1, 3, shm, net),
      4 * 1e-6 + 4 / 3 * 8192 / 10e9)
close("2x2, 4 KiB", m.ring_time(4096, 2, 2, shm, net), 2 * 20e-6 + 1e-6 + 3 * 4096 / 1e9)

# hosts of different sizes: ring 0 1 2 | 3 4 (3,2), links shm shm net shm
# net; a chain of 8 hops is one lap (2 net, 3 shm) and 3 more, at worst
# net shm net
close("layout 2,2 = 2x2", m.ring_time_layout(S, [2, 2], shm, net), m.ring_time(S, 2, 2, shm, net))
close("layout 3,2", m.ring_time_layout(S, [3, 2], shm, net),
      4 * 20e-6 + 4 * 1e-6 + 2 * 4 / 5 * S / 1e9)
close("layout 3,2, 4 KiB", m.ring_time_layout(4096, [3, 2], shm, net),
      2 * 20e-6 + 2 * 1e-6 + 4 * 4096 / 1e9)

# (b) R rings: 2 hosts x 4, 4 rings over 2 NICs: two rings share a NIC;
# 14 hops: one lap (2 net + 6 shm) and 6 more (net shm shm shm net shm)
close("2x4, 4 rings, 2 NICs", m.ring_time(S, 2, 4, shm, net, rings=4, nics=2),
      (4 * 20e-6 + 10 * 1e-6) + 2 * 7 / 8 * (S / 4) * 2 / 1e9)
close("2x4, 4 rings, 1 NIC = one ring", m.ring_time(S, 2, 4, shm, net, rings=4, nics=1),
      m.ring_time(S, 2, 4, shm, net))

# (c) hierarchical, 2 hosts x 4 ranks, one NIC per host and one per rank
local = 3 * 1e-6 + 3 / 4 * S / 10e9
close("2x4 hier, 1 NIC", m.hier_time(S, 2, 4, shm, net, nics=1),
      2 * local + 2 * 20e-6 + 2 * 1 / 2 * (S / 4) * 4 / 1e9)
close("2x4 hier, 4 NICs", m.hier_time(S, 2, 4, shm, net, nics=4),
      2 * local + 2 * 20e-6 + 2 * 1 / 2 * (S / 4) / 1e9)
# shard of 4 KiB / 4 = 1 KiB takes the small path across hosts
close("2x4 hier, 4 KiB", m.hier_time(4096, 2, 4, shm, net, nics=1),
      2 * (3e-6 + 3 / 4 * 4096 / 10e9) + 20e-6 + 1024 * 4 / 1e9)
close("hier on one host = ring", m.hier_time(S, 1, 4, shm, net), m.ring_time(S, 1, 4, shm, net))

# shaped link: netem delay adds to alpha, the rate bounds beta
sh = m.shaped(m.Link(30 * us, 1 / 1.2e9), 20e-6, 2)
close("shaped alpha", sh.alpha, 50e-6)
close("shaped beta (2 Gbit/s is slower)", sh.beta, 8 / 2e9)

# the latency chain against every window of the host-ordered ring: the
# ring's 2(N-1) hops (T_ring at 0 bytes) and the small path's N-1 (T_small
# at 1 byte, less its byte)
for H, M in ((3, 4), (5, 2), (2, 7), (1, 5), (6, 1)):
    N = H * M
    alphas = [(net.alpha if (i % M == M - 1 and H > 1) else shm.alpha) for i in range(N)]
    bmax = max([shm.beta] * (M > 1) + [net.beta] * (H > 1))
    for L, got in ((2 * N - 2, m.ring_time(0, H, M, shm, net)),
                   (N - 1, m.ring_time(1, H, M, shm, net) - (N - 1) * bmax)):
        brute = max(sum(alphas[(p + j) % N] for j in range(L)) for p in range(N))
        close("chain H=%d M=%d L=%d" % (H, M, L), got, brute, 1e-6)


# calibration from synthetic all_reduce_perf output
def perf_text(n, tr, alpha, beta, noise, rnd):
    lines = ["# all_reduce_perf: brigade 0.1.0  nRanks %d minBytes 4096 maxBytes 67108864 "
             "step: 2(factor) warmup iters: 1 iters: 5 validation: 0 blocking: 1" % n,
             "# transports: %s" % tr, "#",
             "#       size         count      type   redop    root     time   algbw   busbw "
             "#wrong     time   algbw   busbw #wrong"]
    s = 4096
    while s <= 64 << 20:
        t = 2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta
        t *= 1 + noise * (2 * rnd.random() - 1)
        lines.append("%12d %13d %9s %7s %7d %8.2f %7.2f %7.2f %6s %8.2f %7.2f %7.2f %6s" % (
            s, s // 4, "float", "sum", -1, t * 1e6, 0, 0, "N/A", t * 1e6, 0, 0, "N/A"))
        s *= 2
    return "\n".join(lines) + "\n"


truth = {("shm", 2): (0.4e-6, 1 / 5e9), ("shm", 4): (1.5e-6, 1 / 2.8e9),
         ("tcp", 2): (50e-6, 1 / 1.1e9), ("tcp", 3): (25e-6, 1 / 1.2e9)}
rnd = random.Random(7)
with tempfile.TemporaryDirectory() as d:
    # all_reduce_perf prints 0.01 us: 0.3% of shm's T(4K)
    for noise, tol in ((0.0, 1e-2), (0.03, 0.15)):
        files = []
        for (tr, n), (al, be) in truth.items():
            path = os.path.join(d, "%s%d-%g.txt" % (tr, n, noise))
            with open(path, "w") as f:
                f.write(perf_text(n, tr, al, be, noise, rnd))
            files.append(path)
        out = os.path.join(d, "c.json")
        p = subprocess.run([sys.executable, MODEL, "calibrate", "--out", out, "--from-output"] +
                           files, capture_output=True, text=True)
        if p.returncode != 0:
            print("FAIL calibrate exited %d: %s" % (p.returncode, p.stderr))
            fails += 1
            continue
        fits = json.load(open(out))["fits"]
        for (tr, n), (al, be) in truth.items():
            f = fits[tr][str(n)]
            # alpha is 1e-3 of the time at 64 MiB: with noise, judge it
            # by the time it predicts at 4 KiB (where it dominates)
            t4k = lambda a, b: 2 * (n - 1) * a + 2 * (n - 1) / n * 4096 * b
            close("fit %s N=%d noise %g: beta" % (tr, n, noise), f["beta"], be, tol)
            close("fit %s N=%d noise %g: T(4K)" % (tr, n, noise), t4k(f["alpha"], f["beta"]),
                  t4k(al, be), tol)
            if noise == 0:
                close("fit %s N=%d exact: alpha" % (tr, n), f["alpha"], al, tol)

# the commands that print: predict for shaped links, and table
with tempfile.TemporaryDirectory() as d:
    calib = os.path.join(d, "c.json")
    json.dump({"command": "test", "date": "-", "fits": {
        "shm": {"2": {"alpha": 1e-6, "beta": 1e-10}},
        "tcp": {"2": {"alpha": 30e-6, "beta": 1 / 1.2e9}}}}, open(calib, "w"))
    p = subprocess.run([sys.executable, MODEL, "predict", "--calib", calib, "--hosts", "4",
                        "--per-host", "2", "--alpha-net", "20e-6", "--gbit-net", "2",
                        "--sizes", "4K,1M,64M"], capture_output=True, text=True)
    want = m.fmt_time(m.hier_time(1 << 20, 4, 2, m.Link(1e-6, 1e-10),
                                  m.Link(50e-6, 8 / 2e9)))
    if p.returncode != 0 or want not in p.stdout:
        print("FAIL predict (want %s in the 1M row):\n%s%s" % (want, p.stdout, p.stderr))
        fails += 1
    else:
        print("ok   predict 4x2 shaped:\n" + p.stdout)
    p = subprocess.run([sys.executable, MODEL, "table", "--calib", calib, "--nics", "8",
                        "--max-ranks", "64"], capture_output=True, text=True)
    if p.returncode != 0 or len(p.stdout.splitlines()) != 2 + 1 + 6:
        print("FAIL table:\n%s%s" % (p.stdout, p.stderr))
        fails += 1
    else:
        print("ok   table\n" + p.stdout)

# bench/model gpu: every figure from brigade-info --device-model (the C
# model), so a figure changed there shows here; 8 GPUs, 8 B on the LL
# one-shot path: 4 us launch + 0.8 us LL hop (+ 0.3 ns of bytes).
p = subprocess.run([sys.executable, MODEL, "gpu", "--sizes", "8,256M"], capture_output=True,
                   text=True)
runs = [ln for ln in p.stdout.splitlines() if ": the communicator runs" in ln]
if (p.returncode != 0 or len(runs) != 2 or "one-shot LL, 1 block:" not in runs[0]
        or "4.8 us" not in runs[0] or "ring, 18 channels" not in runs[1]):
    print("FAIL gpu:\n%s%s" % (p.stdout, p.stderr))
    fails += 1
else:
    print("ok   gpu\n" + "\n".join(runs))
p = subprocess.run([sys.executable, MODEL, "gpu", "--sizes", "8", "--launch-us", "10"],
                   capture_output=True, text=True)
if p.returncode != 0 or "10.8 us" not in p.stdout:
    print("FAIL gpu --launch-us 10 (want 10.8 us at 8 B):\n%s%s" % (p.stdout, p.stderr))
    fails += 1
else:
    print("ok   gpu --launch-us 10")

print("%d failure(s)" % fails)
sys.exit(1 if fails else 0)
