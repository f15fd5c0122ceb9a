#!/usr/bin/python3
"""BRIGADE_MODEL_FILE and brigade-info --calibrate on real ranks.

  test_model_file.py BRIGADE_INFO BRIGADE_RUN ALL_REDUCE_PERF

- --calibrate (2 ranks, short) writes a file with every link, each a
  positive number, that --model --model-file reads;
- a model file whose shm is slow (1 ms a hop) moves auto off the ring on
  4 ranks over shm, which the built-in links keep on the ring: the INFO
  line of the run says which;
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
          "p2p_alpha", "p2p_beta", "xchg_beta", "wake_alpha"]
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
