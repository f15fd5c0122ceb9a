#!/usr/bin/python3
"""BRIGADE_MODEL_FILE and brigade-info --calibrate on real ranks.

  test_model_file.py BRIGADE_INFO BRIGADE_RUN ALL_REDUCE_PERF

- --calibrate (2 ranks, short) writes a file with every link, each a
  positive number, that --model --model-file reads;
- a model file whose shm is slow (1 ms a hop) moves auto off the ring on
  4 ranks over shm, which the built-in links keep on the ring: the INFO
  line of the run says which;
- the fit round trip: times made by the model from known links (every
  probe of --calibrate at its shape, on 2 cores so that the wake probe
  counts) and given back with --times come back as those links;
- a file that differs between ranks fails init on every rank with
  BRG_ERR_MISMATCH, naming both ranks; a malformed one names its line.
"""
import os
import re
import subprocess
import sys
import tempfile

INFO, RUN, PERF = sys.argv[1:4]
FIELDS = ["net_alpha", "net_beta", "shm_alpha", "shm_beta", "tcp_alpha", "tcp_beta",
          "p2p_alpha", "p2p_beta", "xchg_beta", "wake_alpha", "p2p_tcp_alpha", "p2p_tcp_beta",
          "xchg_tcp_beta"]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def perf(env_extra, n=4, wrapper=None):
    env = dict(os.environ, BRIGADE_TRANSPORTS="shm", BRIGADE_DEBUG="INFO",
               BRIGADE_DEBUG_SUBSYS="coll,init", BRIGADE_TIMEOUT_MS="20000")
    env.update(env_extra)
    cmd = [RUN, "-n", str(n)] + (wrapper or []) + [PERF, "-b", "8", "-e", "8", "-n", "2", "-w",
                                                   "1", "-R", "0"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


with tempfile.TemporaryDirectory() as d:
    # --calibrate writes every link
    out = os.path.join(d, "calib.txt")
    p = subprocess.run([INFO, "--calibrate", "--out", out, "--ranks", "2", "--iters", "3",
                        "--batches", "2"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "too busy" in p.stderr:
        print("calibrate: the machine was too busy for a fit; once more")
        p = subprocess.run([INFO, "--calibrate", "--out", out, "--ranks", "2", "--iters", "3",
                            "--batches", "2"], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "brigade-info --calibrate failed: %s" % p.stderr[-500:])
    if p.returncode == 0:
        vals = {}
        for line in open(out):
            line = line.split("#")[0].split()
            if line:
                vals[line[0]] = float(line[1])
        check(sorted(vals) == sorted(FIELDS), "the file's names: %s" % sorted(vals))
        check(all(v > 0 for v in vals.values()), "a link not positive: %s" % vals)
        q = subprocess.run([INFO, "--model", "--model-file", out, "--hosts", "1", "--per-host",
                            "8", "--sizes", "8", "--tsv"], capture_output=True, text=True)
        check(q.returncode == 0 and "\tauto\t" in q.stdout,
              "--model --model-file: %s %s" % (q.stdout, q.stderr))

    # the fit round trip: --calibrate's probes (plan, over tcp, bytes, ranks;
    # --ranks 4 on 2 cores: the wake probe on 16), timed by the model from
    # known links, fitted back
    known = {"shm_alpha": 2e-6, "shm_beta": 3e-10, "tcp_alpha": 12e-6, "tcp_beta": 5e-10,
             "p2p_alpha": 3e-6, "p2p_beta": 2e-10, "xchg_beta": 4e-10, "wake_alpha": 1.5e-6,
             "p2p_tcp_alpha": 9e-6, "p2p_tcp_beta": 2.5e-10, "xchg_tcp_beta": 6e-10}
    kfile = os.path.join(d, "known.txt")
    with open(kfile, "w") as f:
        f.write("".join("%s %r\n" % kv for kv in known.items()))
    probes = [("ring", 0, 4096, 4), ("ring", 0, 262144, 4), ("ring", 1, 4096, 4),
              ("ring", 1, 262144, 4), ("tree", 0, 8, 4), ("tree", 0, 262144, 4),
              ("rhd", 0, 262144, 4), ("tree", 1, 8, 4), ("tree", 1, 262144, 4),
              ("rhd", 1, 262144, 4), ("ring", 0, 4096, 16)]
    times = []
    for plan, tcp, size, n in probes:
        q = subprocess.run([INFO, "--model", "--model-file", kfile, "--hosts", "1", "--per-host",
                            str(n), "--cores", "2", "--small", "0", "--slice", "131072",
                            "--sizes", str(size), "--tsv"] + (["--tcp"] if tcp else []),
                           capture_output=True, text=True)
        rows = [line.split("\t") for line in q.stdout.splitlines()]
        times += [float(r[4]) * 1e6 for r in rows if len(r) > 4 and r[3] == plan]
    check(len(times) == len(probes), "the model timed %d of %d probes" % (len(times), len(probes)))
    fitted = os.path.join(d, "fitted.txt")
    env = dict(os.environ)
    env.pop("BRIGADE_MODEL_FILE", None)
    p = subprocess.run([INFO, "--calibrate", "--out", fitted, "--ranks", "4", "--cores", "2",
                        "--times", ",".join(repr(t) for t in times)], capture_output=True,
                       text=True, env=env, timeout=60)
    check(p.returncode == 0, "--calibrate --times failed: %s" % p.stderr[-500:])
    if p.returncode == 0:
        got = {}
        for line in open(fitted):
            line = line.split("#")[0].split()
            if line:
                got[line[0]] = float(line[1])
        for k, v in known.items():
            check(abs(got.get(k, 0) / v - 1) < 1e-6, "round trip: %s %r came back %r" %
                  (k, v, got.get(k)))
    p = subprocess.run([INFO, "--calibrate", "--out", fitted, "--times", "1,2,3"],
                       capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 2 and "--times takes 11 times" in p.stderr,
          "--times with 3 times: %d %s" % (p.returncode, p.stderr))

    # a slow shm moves auto off the ring
    slow = os.path.join(d, "slow.txt")
    with open(slow, "w") as f:
        f.write("# shm as slow as a network\nshm_alpha 1e-3\n")
    base = perf({})
    check(base.returncode == 0, "the run with the built-in links failed: %s" % base.stderr[-500:])
    check("allreduce algorithm: ring (BRIGADE_ALGO=auto" in base.stderr,
          "built-in links: auto did not take the ring on 4 ranks over shm")
    moved = perf({"BRIGADE_MODEL_FILE": slow})
    check(moved.returncode == 0, "the run with the slow shm failed: %s" % moved.stderr[-500:])
    m = re.search(r"allreduce algorithm: (\w+) \(BRIGADE_ALGO=auto", moved.stderr)
    check(m and m.group(1) in ("tree", "rhd"),
          "slow shm: auto took %s" % (m.group(1) if m else "nothing"))
    check(slow in moved.stderr, "the INFO line does not name the model file")

    # ranks that load different files
    wrap = ["/bin/sh", "-c",
            'if [ "$RANK" = 1 ]; then export BRIGADE_MODEL_FILE=%s; fi; exec "$@"' % slow, "sh"]
    mix = perf({}, n=3, wrapper=wrap)
    check(mix.returncode != 0, "ranks with different model files were not stopped")
    check("collective mismatch" in mix.stdout + mix.stderr and
          "the cost model's links differ between rank" in mix.stdout + mix.stderr,
          "the mismatch is not named: %s" % (mix.stdout + mix.stderr)[-800:])

    # a malformed file
    bad = os.path.join(d, "bad.txt")
    with open(bad, "w") as f:
        f.write("shm_alpha 5e-6\nshm_beta fast\n")
    b = perf({"BRIGADE_MODEL_FILE": bad}, n=2)
    text = b.stdout + b.stderr
    check(b.returncode != 0 and "line 2" in text and bad in text,
          "a malformed model file: %s" % text[-600:])

print("FAIL: %d" % len(failures) if failures else "ok")
sys.exit(1 if failures else 0)
