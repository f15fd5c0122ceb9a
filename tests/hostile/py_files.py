#!/usr/bin/env python3
"""The files brigade writes for the user (BRIGADE_TRACE_FILE, BRIGADE_DEBUG_FILE)
cannot be turned against anyone: a planted symbolic link is never followed,
a FIFO does not hang init, a directory is an error (also as "adir/", and
for two ranks, whose paths would otherwise take a rank suffix), a
file of another user's is refused (checked when run as root), and the trace
replaces its file with the mode it was made with.

Each case runs one rank in a child interpreter (brigade.Communicator.from_env
with no launcher) in a fresh temporary directory; a "victim" file beside it
must keep its content. As in py_lifetimes.py, BRIGADE_PRELOAD names the
sanitizer runtime to preload.

    py_files.py [CASE...]
"""
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap

RUN = """
import brigade
try:
    c = brigade.Communicator.from_env()
    c.allreduce(bytearray(8), dtype="float32")
    c.close()
    print("INIT OK")
except brigade.Error as e:
    print("INIT FAILED:", e)
"""

VICTIM = "precious content\n"


def run(env_extra, d):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "BRIGADE_TRACE_FILE",
              "BRIGADE_DEBUG_FILE", "BRIGADE_DEBUG"):
        env.pop(k, None)
    pre = env.pop("BRIGADE_PRELOAD", "")
    if pre:
        env["LD_PRELOAD"] = pre
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True,
                       timeout=30, cwd=d)
    return p.returncode, p.stdout + p.stderr


def run_ranks(env_extra, d, n=2):
    """run() for n ranks of one job (torchrun's variables), all at once."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for k in ("BRIGADE_TRACE_FILE", "BRIGADE_DEBUG_FILE", "BRIGADE_DEBUG"):
        env.pop(k, None)
    pre = env.pop("BRIGADE_PRELOAD", "")
    if pre:
        env["LD_PRELOAD"] = pre
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    env.update(env_extra, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
    procs = [subprocess.Popen([sys.executable, "-c", RUN], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=d)
             for r in range(n)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=60)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(killed after 60 s)")
    return outs


def victim(d):
    v = os.path.join(d, "victim")
    with open(v, "w") as f:
        f.write(VICTIM)
    return v


def untouched(v):
    with open(v) as f:
        got = f.read()
    assert got == VICTIM, f"the victim file was changed: {got[:200]!r}"


def case_trace_symlink(d):
    v = victim(d)
    os.symlink(v, os.path.join(d, "t.json"))
    rc, out = run({"BRIGADE_TRACE_FILE": os.path.join(d, "t.json")}, d)
    assert "INIT FAILED" in out and "symbolic link" in out, out
    untouched(v)


def case_trace_tmp_symlink(d):
    v = victim(d)
    os.symlink(v, os.path.join(d, "t.json.tmp"))
    rc, out = run({"BRIGADE_TRACE_FILE": os.path.join(d, "t.json")}, d)
    assert "INIT OK" in out, out
    untouched(v)
    with open(os.path.join(d, "t.json")) as f:
        json.load(f)  # the trace itself, whole
    left = sorted(os.listdir(d))
    assert left == ["t.json", "t.json.tmp", "victim"], f"files left: {left}"


def case_trace_mode(d):
    old = os.umask(0o022)
    try:
        rc, out = run({"BRIGADE_TRACE_FILE": os.path.join(d, "t.json")}, d)
    finally:
        os.umask(old)
    assert "INIT OK" in out, out
    mode = stat.S_IMODE(os.stat(os.path.join(d, "t.json")).st_mode)
    assert mode == 0o644, f"mode {mode:o}"


def case_trace_dir(d):
    os.mkdir(os.path.join(d, "adir"))
    for path in ("adir", "adir/"):
        rc, out = run({"BRIGADE_TRACE_FILE": os.path.join(d, path)}, d)
        assert "INIT FAILED" in out and "directory" in out, (path, out)
    assert os.listdir(os.path.join(d, "adir")) == [], os.listdir(os.path.join(d, "adir"))


def case_dir_two_ranks(d):
    """A directory as the path of two ranks' trace or log, "%r" or not: an
    error for the trace, the log on stderr, and nothing written into it."""
    adir = os.path.join(d, "adir")
    os.mkdir(adir)
    for path in ("adir", "adir/", "adir/%r/"):
        outs = run_ranks({"BRIGADE_TRACE_FILE": os.path.join(d, path)}, d)
        for r, out in enumerate(outs):
            assert "INIT FAILED" in out and "directory" in out, (path, r, out)
        outs = run_ranks({"BRIGADE_DEBUG": "INFO", "BRIGADE_DEBUG_FILE": os.path.join(d, path)},
                         d)
        for r, out in enumerate(outs):
            assert "INIT OK" in out and "directory" in out, (path, r, out)
        assert os.listdir(adir) == [], (path, os.listdir(adir))


def case_trace_fifo(d):
    os.mkfifo(os.path.join(d, "t.json"))
    rc, out = run({"BRIGADE_TRACE_FILE": os.path.join(d, "t.json")}, d)
    assert "INIT FAILED" in out and ("FIFO" in out), out


def case_debug_symlink(d):
    v = victim(d)
    os.symlink(v, os.path.join(d, "log"))
    rc, out = run({"BRIGADE_DEBUG": "INFO", "BRIGADE_DEBUG_FILE": os.path.join(d, "log")}, d)
    assert "INIT OK" in out, out
    assert "symbolic link" in out, out  # said on stderr, which gets the log instead
    untouched(v)


def case_debug_rank(d):
    rc, out = run({"BRIGADE_DEBUG": "INFO", "BRIGADE_DEBUG_FILE": os.path.join(d, "log.%r")}, d)
    assert "INIT OK" in out, out
    left = sorted(os.listdir(d))
    assert left == ["log.0"], f"files: {left}"
    with open(os.path.join(d, "log.0")) as f:
        assert ":0 brigade INFO" in f.read()


def case_foreign_owner(d):
    if os.geteuid() != 0:
        print("    (not root: another user's file cannot be made; skipped)")
        return
    os.chmod(d, 0o777)
    for var in ("BRIGADE_TRACE_FILE", "BRIGADE_DEBUG_FILE"):
        v = victim(d)
        os.chown(v, 65534, 65534)
        rc, out = run({var: v, "BRIGADE_DEBUG": "INFO"}, d)
        assert "belongs to uid 65534" in out, (var, out)
        untouched(v)


def main() -> int:
    cases = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}
    names = sys.argv[1:] or list(cases)
    failed = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="brigade-hostile-") as d:
            try:
                cases[name](d)
                print(f"ok   {name}")
            except Exception as e:  # AssertionError, or a timeout: a failed case
                failed.append(name)
                print(f"FAIL {name}:")
                print(textwrap.indent(str(e)[-3000:], "    "))
    print(f"{len(names) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
