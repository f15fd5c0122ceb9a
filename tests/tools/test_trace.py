#!/usr/bin/env python3
"""Tests of BRIGADE_TRACE_FILE and brigade-trace, on real ranks.

    test_trace.py spans N  BRIGADE_RUN TRACE_RING BRIGADE_TRACE
    test_trace.py stall    BRIGADE_RUN TRACE_RING BRIGADE_TRACE
    test_trace.py bad      BRIGADE_RUN TRACE_RING BRIGADE_TRACE

spans: N ranks run two allreduces; each rank's trace must hold exactly the
spans the ring schedule (as docs/ring-allreduce.md states it, written out
again here) predicts: the collectives, every slice in order with its
primitive, step, chunk, bytes and neighbours, one step span per step, and
waits nested in their slices adding up to the slices' wait times.
stall: rank 1 of 3 stops itself (SIGSTOP) for 200 ms before the second
allreduce; brigade-trace's summary must name it as the late caller the
others waited for, count that wait apart from the waiting on the ring,
and leave the stop out of every link's flow time.
bad: malformed and truncated files give one clear line from brigade-trace
and exit status 2, never a traceback; a BRIGADE_TRACE_FILE without %r
still gives one file per rank, and one that cannot be written fails at init
naming the path.
error: 3 ranks, the last allreduce mismatched (one rank passes another
count); every rank fails and exits without brg_comm_destroy: the traces
written when the collective failed must hold it, with its error.
perfetto: 4 ranks run three allreduces; their traces merged by brigade-trace
are read as Perfetto's JSON importer reads async spans ("b"/"e"): a plain
"id" names one track for the whole file, an "id2" {"local": ...} one track
per process, and an "e" closes the innermost open span of its track. Every
track must hold the steps of one rank only, each begin paired with its own
end, one track per step and rank.
hosts: 4 ranks on two network namespaces (tests/multihost/run.sh, tcp
between them): the ranks of the second "host" measure their clock offset at
init; the namespaces share one kernel clock, so the true offset is 0 and
the estimate must lie within the error bound it reports.

    test_trace.py hosts RUN_SH TRACE_RING BRIGADE_TRACE
"""

import json
import os
import re
import subprocess
import sys
import tempfile

FLOAT = 4
SLICE_BYTES = 4096
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, file=sys.stderr)
    return cond


def run_ranks(run, prog, n, args, tmp, env_extra=None, timeout=120):
    env = dict(os.environ)
    env.update({"BRIGADE_TRACE_FILE": os.path.join(tmp, "trace.%r.json"),
                "BRIGADE_SLICE_BYTES": str(SLICE_BYTES), "BRIGADE_SMALL_BYTES": "0",
                "BRIGADE_TIMEOUT_MS": env.get("BRIGADE_TIMEOUT_MS", "30000")})
    env.update(env_extra or {})
    p = subprocess.run([run, "-n", str(n), prog] + [str(a) for a in args], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        print(p.stdout, file=sys.stderr)
        sys.exit(f"FAIL: {n} ranks of {prog} exited with {p.returncode}")
    files = [os.path.join(tmp, f"trace.{r}.json") for r in range(n)]
    for f in files:
        if not os.path.exists(f):
            print(p.stdout, file=sys.stderr)
            sys.exit(f"FAIL: no trace file {f} (BRIGADE_TRACE_FILE={env['BRIGADE_TRACE_FILE']})")
    return p.stdout, files


# ---------------------------------------------------------- the schedule
# Chunk c of `count` elements over n ranks: balanced, the first count % n
# chunks one element longer. At step t the rank at position p works on
# chunk (p - 1 - t) mod n; slices of SLICE_BYTES run slice by slice, each
# slice through every step.

def part_count(count, n, i):
    return count // n + (1 if i < count % n else 0)


def part_offset(count, n, i):
    base, extra = divmod(count, n)
    return base * i + min(i, extra)


def prim_at(n, t):
    if t == 0:
        return "send"
    if t < n - 1:
        return "recv_reduce_send"
    if t == n - 1:
        return "recv_reduce_copy_send"
    if t < 2 * n - 2:
        return "recv_copy_send"
    return "recv"


def expected_slices(p, n, count):
    se = SLICE_BYTES // FLOAT
    nslices = lambda cnt: 1 if cnt == 0 else -(-cnt // se)
    most = max(nslices(part_count(count, n, c)) for c in range(n))
    out = []
    for sl in range(most):
        for t in range(2 * n - 1):
            c = (p - 1 - t) % n
            cnt = part_count(count, n, c)
            if sl >= nslices(cnt):
                continue
            m = min(se, cnt - sl * se)
            prim = prim_at(n, t)
            out.append({"prim": prim, "step": t, "chunk": c, "slice": sl, "bytes": m * FLOAT,
                        "elem": part_offset(count, n, c) + sl * se,
                        "recv_from": -1 if prim == "send" else (p - 1) % n,
                        "send_to": -1 if prim == "recv" else (p + 1) % n})
    return out


def near(a, b, tol=0.005):
    return abs(a - b) <= tol


def check_drawing(bt, ranks, pairs, n):
    """What the timeline draws: every slice on its step's row in its rank's
    lane, reduce-scatter slices blue and all-gather ones orange, and one
    arrow per hand-off. Skipped where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        return
    with tempfile.TemporaryDirectory(prefix="brigade-draw-") as d:
        fig = bt.draw(ranks, os.path.join(d, "t.png"), {})
    ax = fig.axes[0]
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    check(len(arrows) == min(len(pairs), 400), f"N={n}: {len(arrows)} arrows for "
          f"{len(pairs)} hand-offs")
    want_rs = sum(1 for r in ranks for s in r.slices
                  if s[2]["prim"] in ("send", "recv_reduce_send", "recv_reduce_copy_send"))
    want_ag = sum(1 for r in ranks for s in r.slices) - want_rs
    rs = ag = 0
    for coll in ax.collections:
        for fc in coll.get_facecolors():
            r_, g_, b_ = fc[:3]
            if b_ > r_ + 0.1:
                rs += 1
            elif r_ > b_ + 0.1 and g_ < r_:
                ag += 1
    check(rs == want_rs and ag == want_ag, f"N={n}: {rs} blue and {ag} orange bars for "
          f"{want_rs} reduce-scatter and {want_ag} all-gather slices")
    rows = {round(y, 6) for coll in ax.collections for p in coll.get_paths()
            for y in [p.vertices[:, 1].min()]}
    check(len(rows) >= n * (2 * n - 1), f"N={n}: bars on {len(rows)} distinct rows, expected "
          f"at least one per step and rank ({n * (2 * n - 1)})")


def check_handoffs(tool, files, n):
    """brigade-trace's matching of sent slices to received ones (its
    timeline's arrows and its link figures): every slice a rank sent is
    paired with one its successor received, of the same collective, chunk,
    slice and size, one step later in the schedule."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("brigade_trace", tool)
    spec = importlib.util.spec_from_loader("brigade_trace", loader)
    bt = importlib.util.module_from_spec(spec)
    loader.exec_module(bt)
    ranks = bt.load_all(files)
    pairs = bt.handoffs(ranks)
    sent = sum(1 for r in ranks for s in r.slices if s[2]["send_to"] >= 0)
    check(len(pairs) == sent, f"N={n}: {len(pairs)} hand-offs for {sent} slices sent")
    for src, s_, dst, q in pairs:
        a, b = s_[2], q[2]
        ok = (dst == (src + 1) % n and a["send_to"] == dst and b["recv_from"] == src and
              a["seq"] == b["seq"] and a["chunk"] == b["chunk"] and a["slice"] == b["slice"] and
              a["bytes"] == b["bytes"] and b["step"] == a["step"] + 1)
        if not check(ok, f"N={n}: rank {src} {a} handed to rank {dst} {b}"):
            break
    check_drawing(bt, ranks, pairs, n)
    links = bt.link_table(ranks)
    for (src, dst), (nbytes, flow, _, _) in links.items():
        busy = sum(c[1] - c[0] for c in ranks[dst].colls)
        check(0 < flow <= busy, f"N={n}: link {src} -> {dst} flowed {flow} us, outside the "
              f"{busy} us its receiver spent in collectives")


def test_spans(run, prog, tool, n, tmp):
    count, calls = 5 * 1024 + 3, 2
    _, files = run_ranks(run, prog, n, [count, calls], tmp)
    for r, path in enumerate(files):
        with open(path) as f:
            doc = json.load(f)
        meta, evs = doc["metadata"], doc["traceEvents"]
        tag = f"N={n} rank {r}"
        check(meta["rank"] == r and meta["nranks"] == n, f"{tag}: metadata {meta}")
        check(meta["ring"] == list(range(n)), f"{tag}: ring {meta['ring']} on one host")
        check(meta["clock_offset_ns"] == 0, f"{tag}: clock offset {meta['clock_offset_ns']} "
              "between ranks of one host")
        check(meta["events_dropped"] == 0, f"{tag}: events dropped")
        check(all(e["pid"] == r for e in evs), f"{tag}: an event of another pid")
        colls = sorted((e for e in evs if e.get("cat") == "collective"), key=lambda e: e["ts"])
        slices = sorted((e for e in evs if e.get("cat") == "slice"), key=lambda e: e["ts"])
        waits = [e for e in evs if e.get("cat") == "wait"]
        steps = [e for e in evs if e.get("cat") == "step"]
        check([c["name"] for c in colls] == [f"allreduce #{s}" for s in range(1, calls + 1)],
              f"{tag}: collectives {[c['name'] for c in colls]}")
        for c in colls:
            a = c["args"]
            check(a["count"] == count and a["bytes"] == count * FLOAT and a["dtype"] == "float32"
                  and a["op"] == "sum" and a["status"] == "success", f"{tag}: collective {a}")
        want = expected_slices(r, n, count)
        for seq, c in enumerate(colls, 1):
            got = [s for s in slices if s["args"]["seq"] == seq]
            keys = list(want[0].keys())
            got_rows = [{k: s["args"][k] for k in keys} for s in got]
            if not check(got_rows == want, f"{tag} #{seq}: {len(got_rows)} slices, expected "
                         f"{len(want)}; first difference: " +
                         str(next(((g, w) for g, w in zip(got_rows, want) if g != w),
                                  (len(got_rows), len(want))))):
                continue
            check(all(s["name"] == s["args"]["prim"] for s in got), f"{tag}: slice names")
            c0, c1 = c["ts"], c["ts"] + c["dur"]
            check(all(c0 - 0.002 <= s["ts"] and s["ts"] + s["dur"] <= c1 + 0.002 for s in got),
                  f"{tag} #{seq}: a slice outside its collective")
            sent = sum(s["args"]["bytes"] for s in got if s["args"]["send_to"] >= 0)
            ideal = 2 * (n - 1) / n * count * FLOAT
            check(abs(sent - ideal) <= 2 * n * FLOAT,
                  f"{tag} #{seq}: sent {sent} bytes, 2(N-1)/N S = {ideal:.0f}")
            # Waits: inside a slice of this collective, for the right neighbour,
            # adding up to the slice's own wait times.
            for s in got:
                s0, s1 = s["ts"], s["ts"] + s["dur"]
                inside = [w for w in waits
                          if w["args"]["seq"] == seq and s0 - 0.002 <= w["ts"] and
                          w["ts"] + w["dur"] <= s1 + 0.002]
                wr = sum(w["dur"] for w in inside if w["args"]["for"] == "data")
                ws = sum(w["dur"] for w in inside if w["args"]["for"] == "free slot")
                a = s["args"]
                check(near(wr, a["wait_recv_us"], 0.01) and near(ws, a["wait_send_us"], 0.01),
                      f"{tag} #{seq}: slice at {s0} waits {wr}/{ws} us, args say "
                      f"{a['wait_recv_us']}/{a['wait_send_us']}")
                check(all(w["args"]["peer"] == (a["recv_from"] if w["args"]["for"] == "data"
                                                else a["send_to"]) for w in inside),
                      f"{tag} #{seq}: a wait names the wrong neighbour")
            # One step span per step, from its first slice to its last.
            for t in range(2 * n - 1):
                mine = [s for s in got if s["args"]["step"] == t]
                mine_ts = (mine[0]["ts"] - 0.002, mine[-1]["ts"] + mine[-1]["dur"] + 0.002)
                b = [e for e in steps if e["ph"] == "b" and e["args"]["seq"] == seq and
                     e["args"]["step"] == t]
                e_ = [e for e in steps if e["ph"] == "e" and e["id2"] == {"local": f"step {t}"}
                      and mine_ts[0] <= e["ts"] <= mine_ts[1]]
                if not check(len(b) == 1 and len(e_) == 1, f"{tag} #{seq}: step {t} has "
                             f"{len(b)} begins and {len(e_)} ends"):
                    continue
                ba = b[0]["args"]
                check(ba["slices"] == len(mine) and ba["bytes"] ==
                      sum(s["args"]["bytes"] for s in mine) and ba["prim"] == prim_at(n, t),
                      f"{tag} #{seq}: step {t} args {ba}")
                check(near(b[0]["ts"], mine[0]["ts"]) and
                      near(e_[0]["ts"], mine[-1]["ts"] + mine[-1]["dur"]),
                      f"{tag} #{seq}: step {t} span is not its slices'")
        check(len(steps) == 2 * calls * (2 * n - 1), f"{tag}: {len(steps)} step events")
        check(len(waits) + len(slices) + len(colls) + len(steps) ==
              sum(1 for e in evs if e["ph"] != "M"), f"{tag}: events of unknown kinds")

    check_handoffs(tool, files, n)
    merged = os.path.join(tmp, "merged.json")
    png = os.path.join(tmp, "timeline.png")
    p = subprocess.run([tool] + files + ["--merge", merged, "-o", png], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    no_mpl = "needs matplotlib" in p.stderr
    check(p.returncode == 0 or no_mpl, f"brigade-trace failed: {p.stderr}")
    print(p.stdout)
    with open(merged) as f:
        m = json.load(f)
    total = 0
    for path in files:
        with open(path) as f:
            total += len(json.load(f)["traceEvents"])
    check(len(m["traceEvents"]) == total, f"merged {len(m['traceEvents'])} events of {total}")
    check(sorted({e["pid"] for e in m["traceEvents"]}) == list(range(n)), "merged pids")
    check(re.search(r"^\s+0 -> 1\s", p.stdout, re.M) is not None, "no link 0 -> 1 in the summary")
    # -o without --collective: the last of the largest allreduces, alone.
    check(f"allreduce #{calls} ({count * FLOAT} bytes), the last of the largest" in p.stdout
          and "1 collective(s)" in p.stdout, f"-o did not pick allreduce #{calls} alone")
    q = subprocess.run([tool, "--collective", str(calls + 5)] + files, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    check(q.returncode == 2 and f"no such collective in the traces (they hold #1 to #{calls})"
          in q.stderr, f"--collective {calls + 5}: exit {q.returncode}, {q.stderr}")
    check_axis(load_tool(tool))
    if no_mpl:
        return "no matplotlib: the timeline was not drawn"
    with open(png, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", "timeline.png is not a PNG")
    with open(os.path.join(tmp, "timeline.svg")) as f:
        check("<svg" in f.read(4096), "timeline.svg is not an SVG")
    return None


def perfetto_tracks(events):
    """The async spans of a trace as Perfetto's JSON importer builds them
    (src/trace_processor/importers/json: phases "b"/"e"): events in time
    order; the track of an event is (cat, id) for a plain "id" or an
    "id2" {"global": ...}, for the whole trace, and (pid, cat, id) for an
    "id2" {"local": ...}; an "e" ends the innermost open span of its track
    (stack order). Returns ({track: [(begin, end)]}, problems)."""
    tracks, open_, problems = {}, {}, []
    asyncs = [e for e in events if e.get("ph") in ("b", "e")]
    for e in sorted(asyncs, key=lambda e: e["ts"]):  # stable, as the importer's sort
        id2 = e.get("id2") or {}
        if "id" in e or "global" in id2:
            key = ("global", e.get("cat"), str(e.get("id", id2.get("global"))))
        elif "local" in id2:
            key = ("process", e["pid"], e.get("cat"), str(id2["local"]))
        else:
            problems.append(f"an async event with no id: {e}")
            continue
        stack = open_.setdefault(key, [])
        if e["ph"] == "b":
            stack.append(e)
        elif not stack:
            problems.append(f"an end with no begin on track {key}")
        else:
            tracks.setdefault(key, []).append((stack.pop(), e))
    problems += [f"{len(v)} span(s) never ended on track {k}" for k, v in open_.items() if v]
    return tracks, problems


def test_perfetto(run, prog, tool, tmp):
    n, calls = 4, 3
    _, files = run_ranks(run, prog, n, [3 * 1024 + 1, calls], tmp)
    merged = os.path.join(tmp, "merged.json")
    p = subprocess.run([tool, "-q", "--merge", merged] + files, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    check(p.returncode == 0, f"brigade-trace --merge: {p.stderr}")
    with open(merged) as f:
        events = json.load(f)["traceEvents"]
    tracks, problems = perfetto_tracks(events)
    for msg in problems:
        check(False, msg)
    per_rank = {}
    for key, spans in sorted(tracks.items(), key=str):
        pids = sorted({ev["pid"] for pair in spans for ev in pair})
        if not check(len(pids) == 1, f"track {key} holds the steps of ranks {pids}"):
            continue
        per_rank.setdefault(pids[0], []).append(key)
        for b, e in spans:
            check(b["name"] == e["name"], f"track {key}: {b['name']!r} ended by {e['name']!r}")
        steps = {b["args"]["step"] for b, _ in spans}
        seqs = sorted(b["args"]["seq"] for b, _ in spans)
        check(len(steps) == 1 and seqs == list(range(1, calls + 1)),
              f"track {key}: steps {sorted(steps)} of collectives {seqs}, expected one step "
              f"of each of {calls} collectives")
    for r in range(n):
        got = len(per_rank.get(r, []))
        check(got == 2 * n - 1, f"rank {r} has {got} step tracks, expected 2N-1 = {2 * n - 1}")
    print(f"{len(tracks)} step tracks for {n} ranks, {sum(len(v) for v in tracks.values())} spans")


def test_stall(run, prog, tool, tmp):
    n, stop_ms = 3, 200
    out, files = run_ranks(run, prog, n, [256 * 1024, 2, 1, stop_ms], tmp)
    m = re.search(r"rank 1 stopped for ([0-9.]+) ms", out)
    check(m and float(m.group(1)) >= stop_ms - 5, f"rank 1 did not stop for {stop_ms} ms: {out}")
    p = subprocess.run([tool, "--seq", "2"] + files, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    print(p.stdout, p.stderr)
    check(p.returncode == 0, f"brigade-trace exited {p.returncode}")
    # Rank 1 stopped before it called #2: the others' waits for it are time
    # outside the collective (a late call), not waiting on the ring.
    m = re.search(r"called late: rank (\d+) \(the others waited ([0-9.]+) ms", p.stdout)
    if check(m is not None, "no 'called late' line"):
        check(m.group(1) == "1", f"called late: rank {m.group(1)}, not the stopped rank 1")
        # Ranks 0 and 2 both wait about stop_ms, directly or through each other.
        check(float(m.group(2)) >= 2 * 0.75 * stop_ms, f"the others waited {m.group(2)} ms")
    for r in (0, 2):
        row = re.search(rf"^\s+{r} \S+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)%\s+"
                        rf"([0-9.]+)\s", p.stdout, re.M)
        if not check(row is not None, f"no summary row for rank {r}"):
            continue
        in_coll, waited, late = float(row.group(1)), float(row.group(3)), float(row.group(5))
        check(late >= 0.75 * stop_ms, f"rank {r}: late call {late} ms, stopped {stop_ms} ms")
        check(waited < 0.5 * stop_ms, f"rank {r}: {waited} ms of waiting on the ring, which "
              "should leave out the wait for rank 1's late call")
        check(in_coll >= late, f"rank {r}: late call {late} ms beyond its {in_coll} ms in #2")
    # Links: measured while data flowed, so the stop does not show as a slow link.
    for m in re.finditer(r"^\s+(\d) -> (\d)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", p.stdout,
                         re.M):
        check(float(m.group(4)) < 0.5 * stop_ms, f"link {m.group(1)} -> {m.group(2)}: "
              f"{m.group(4)} ms of flow, counting the {stop_ms} ms stop")


def bad_settings(run, prog, tmp):
    """BRIGADE_TRACE_FILE without %r still gives one file per rank; one that
    cannot be written fails brg_comm_init_env with the path named."""
    env = dict(os.environ, BRIGADE_TRACE_FILE=os.path.join(tmp, "one.json"))
    p = subprocess.run([run, "-n", "2", prog, "300", "1"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    check(p.returncode == 0, f"ranks with BRIGADE_TRACE_FILE without %r: {p.stdout}")
    for r in range(2):
        check(os.path.getsize(os.path.join(tmp, f"one.json.{r}")) > 0,
              f"no one.json.{r} for rank {r}")
    # A small ring buffer keeps the newest events and says how many it dropped.
    env["BRIGADE_TRACE_FILE"] = os.path.join(tmp, "small.%r.json")
    p = subprocess.run([run, "-n", "2", prog, "300", "20"], env=dict(env, BRIGADE_TRACE_EVENTS="64"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    check(p.returncode == 0, f"ranks with BRIGADE_TRACE_EVENTS=64: {p.stdout}")
    with open(os.path.join(tmp, "small.0.json")) as f:
        d = json.load(f)
    m = d["metadata"]
    names = {e["name"] for e in d["traceEvents"] if e.get("cat") == "collective"}
    check(m["events_kept"] == 64 and m["events_dropped"] == m["events"] - 64 > 0 and
          sum(1 for e in d["traceEvents"] if e["ph"] in "Xb") == 64,
          f"BRIGADE_TRACE_EVENTS=64: metadata {m}")
    check("allreduce #20" in names and "allreduce #1" not in names,
          f"BRIGADE_TRACE_EVENTS=64 kept {sorted(names)}, not the newest")
    env["BRIGADE_TRACE_FILE"] = os.path.join(tmp, "no", "such", "dir", "t.%r.json")
    p = subprocess.run([run, "-n", "2", prog, "300", "1"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    check(p.returncode != 0 and "cannot write the trace " + os.path.join(tmp, "no") in p.stdout,
          f"an unwritable BRIGADE_TRACE_FILE: exit {p.returncode}: {p.stdout}")


def test_bad(run, prog, tool, tmp):
    bad_settings(run, prog, tmp)
    _, files = run_ranks(run, prog, 2, [300, 1], tmp)
    good = files[0]
    with open(good, "rb") as f:
        raw = f.read()
    doc = json.loads(raw)

    def variant(name, data):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else json.dumps(data).encode())
        return path

    def edited(fn):
        d = json.loads(raw)
        fn(d)
        return d

    def first(d, cat):
        return next(e for e in d["traceEvents"] if e.get("cat") == cat)

    other = json.loads(raw)
    other["metadata"]["comm_id"] = "0123456789abcdef"
    other["metadata"]["rank"] = 1
    for e in other["traceEvents"]:
        e["pid"] = 1
    merged = os.path.join(tmp, "m.json")
    subprocess.run([tool, "-q", "--merge", merged] + files, check=True, timeout=60)
    cases = [
        ([variant("empty.json", b"")], "empty file"),
        ([variant("half.json", raw[:len(raw) // 2])], "truncated"),
        ([variant("cut.json", raw[:raw.rfind(b"\n],")])], "truncated"),
        ([variant("garbage.json", bytes(range(256)) * 4)], "not UTF-8"),
        ([variant("text.json", b"allreduce #1 took 3 ms\n")], "not valid JSON"),
        ([variant("list.json", [])], "traceEvents"),
        ([variant("nometa.json", edited(lambda d: d.pop("metadata")))], "metadata"),
        ([merged], "merged"),
        ([variant("nobytes.json", edited(lambda d: first(d, "slice")["args"].pop("bytes")))],
         "\"bytes\""),
        ([variant("strbytes.json",
                  edited(lambda d: first(d, "slice")["args"].update(bytes="64")))], "\"bytes\""),
        ([variant("negdur.json", edited(lambda d: first(d, "slice").update(dur=-1)))],
         "negative duration"),
        ([variant("rank9.json", edited(lambda d: d["metadata"].update(rank=9)))], "rank 9"),
        ([variant("nots.json", edited(lambda d: first(d, "wait" if any(
            e.get("cat") == "wait" for e in d["traceEvents"]) else "slice").pop("ts")))],
         "\"ts\""),
        ([good, good], "rank 0 again"),
        ([good, variant("other.json", other)], "not one communicator"),
        ([os.path.join(tmp, "absent.json")], "cannot read"),
    ]
    p = subprocess.run([tool] + files, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    check(p.returncode == 0, f"brigade-trace on good files: {p.returncode} {p.stderr}")
    for paths, word in cases:
        p = subprocess.run([tool] + paths, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=60)
        lines = p.stderr.strip().splitlines()
        bad = paths[-1] if word != "rank 0 again" else paths[0]
        ok = (p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr and
              lines[0].startswith("brigade-trace: error: ") and word in lines[0] and
              os.path.basename(bad) in lines[0])
        check(ok, f"{os.path.basename(paths[-1])}: exit {p.returncode}, expected 2 and one "
              f"line naming the file with '{word}': {p.stderr.strip()!r}")
        if ok:
            print(f"ok: {lines[0]}")


def test_error(run, prog, tool, tmp):
    n, count, calls = 3, 5000, 3
    out, files = run_ranks(run, prog, n, [count, calls, "mismatch", 1], tmp)
    print(out)
    for r, path in enumerate(files):
        with open(path) as f:
            evs = json.load(f)["traceEvents"]
        colls = sorted((e for e in evs if e.get("cat") == "collective"), key=lambda e: e["ts"])
        got = [(c["args"]["seq"], c["args"]["status"]) for c in colls]
        want_ok = [(s, "success") for s in range(1, calls)]
        check(got[:-1] == want_ok and len(got) == calls and got[-1][0] == calls and
              got[-1][1] != "success", f"rank {r}: collectives {got}, expected {want_ok} and "
              f"#{calls} failed")
        last = [s for s in evs if s.get("cat") == "slice" and s["args"]["seq"] == calls]
        check(any(s["args"]["status"] != "success" for s in last),
              f"rank {r}: no failed slice in #{calls}")
    p = subprocess.run([tool] + files, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    check(p.returncode == 0, f"brigade-trace on the traces of a failed run: {p.stderr}")


def test_hosts(run_sh, prog, tool, tmp):
    env = dict(os.environ, BRIGADE_TRACE_FILE=os.path.join(tmp, "trace.%r.json"))
    p = subprocess.run([run_sh, prog, "exec", "tcp", "70000", "2"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    print(p.stdout)
    if p.returncode == 77:
        return "network namespaces unavailable"
    if not check(p.returncode == 0, f"run.sh exited {p.returncode}"):
        return None
    files = [os.path.join(tmp, f"trace.{r}.json") for r in range(4)]
    metas = []
    for path in files:
        with open(path) as f:
            metas.append(json.load(f)["metadata"])
    for m in metas:
        r, off, err = m["rank"], m["clock_offset_ns"], m["clock_offset_err_ns"]
        print(f"rank {r} on {m['host_hash']}: clock offset {off} ns +- {err} ns")
        check(m["ring"] == [0, 2, 1, 3], f"ring {m['ring']}")
        if r % 2 == 0:
            check(off == 0 and err == 0, f"rank {r} on the reference host: {off} +- {err}")
        else:
            check(0 < err < 50_000_000 and abs(off) <= err,
                  f"rank {r}: offset {off} ns outside its bound {err} ns (true offset 0)")
    check(metas[1]["clock_offset_ns"] == metas[3]["clock_offset_ns"],
          "ranks 1 and 3 share a host but not an offset")
    q = subprocess.run([tool] + files, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    print(q.stdout, q.stderr)
    check(q.returncode == 0, f"brigade-trace exited {q.returncode}")
    return None


def check_axis(bt):
    """The timeline's time axis: a stretch of more than two `gap`s in which
    no rank worked is drawn `gap` wide; work keeps its length."""
    ax = bt.Axis(0.0, 1000.0, [[0.0, 10.0], [500.0, 510.0], [990.0, 1000.0]], 20.0)
    # pauses 10..500 and 510..990 keep 10 us on each side: 470 and 460 us go
    want = {0: 0, 10: 10, 20: 20, 500: 500 - 470, 510: 40, 990: 990 - 930, 1000: 70}
    got = {t: ax.x(t) for t in want}
    check(all(abs(got[t] - want[t]) < 1e-9 for t in want) and abs(ax.end - 70) < 1e-9
          and len(ax.cuts) == 2, f"axis: {got}, end {ax.end}, cuts {ax.cuts}")
    short = bt.Axis(0.0, 100.0, [[0.0, 10.0], [40.0, 100.0]], 20.0)
    check(short.cuts == [] and short.end == 100.0, f"a 30 us pause was cut: {short.cuts}")


def load_tool(tool):
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("brigade_trace", tool)
    spec = importlib.util.spec_from_loader("brigade_trace", loader)
    bt = importlib.util.module_from_spec(spec)
    loader.exec_module(bt)
    return bt


def test_lat(run, prog, tool, n, algo, tmp):
    """BRIGADE_ALGO=tree or rhd: every message a rank sends is in its trace,
    paired with its receipt at the peer (same phase, round, tree and size),
    and the bytes add up to what docs/ring-allreduce.md's cost table says:
    the double tree moves each half of S up and down its N-1 edges, 2(N-1)S
    in all; rhd moves 2(P-1)/P*S per rank of the P = 2^floor(log2 N) that
    halve and double (log2(P) swaps of S each where rhd doubles alone), and
    S each way between a folded rank and its partner.
    Then the timeline draws one arrow per message."""
    count, calls = 8 * 1024, 2  # floats: 32 KiB, slices of 4 KiB
    # rhd swaps whole buffers where BRIGADE_RHD_DOUBLING_BYTES (the
    # test's meson entry) says every call does, halves where it says none
    swapping = algo == "rhd" and os.environ.get("BRIGADE_RHD_DOUBLING_BYTES") == "1G"
    _, files = run_ranks(run, prog, n, [count, calls], tmp, {"BRIGADE_ALGO": algo})
    bt = load_tool(tool)
    ranks = bt.load_all(files)
    S = count * FLOAT
    P = 1 << (n.bit_length() - 1)
    for seq in range(1, calls + 1):
        msgs = [(r.rank, m) for r in ranks for m in r.msgs if m[2]["seq"] == seq]
        sends = [(r, m) for r, m in msgs if m[2]["what"] == "send"]
        recvs = [(r, m) for r, m in msgs if m[2]["what"] == "recv"]
        tag = f"{algo} N={n} #{seq}"
        check(len(sends) > 0 and len(sends) == len(recvs),
              f"{tag}: {len(sends)} sends and {len(recvs)} receives traced")
        pairs = [p for p in bt.lat_handoffs(ranks) if p[1][2]["seq"] == seq]
        check(len(pairs) == len(sends), f"{tag}: {len(pairs)} sends paired of {len(sends)}")
        for src, s_, dst, q in pairs:
            a, b = s_[2], q[2]
            if not check(a["peer"] == dst and b["peer"] == src and a["bytes"] == b["bytes"]
                         and (a["phase"], a["round"], a["tree"]) ==
                         (b["phase"], b["round"], b["tree"]) and q[2]["data_us"] >= s_[0] - 1,
                         f"{tag}: rank {src} sent {a}, rank {dst} received {b}"):
                break
        total = sum(m[2]["bytes"] for _, m in sends)
        if algo == "tree":
            want = 2 * (n - 1) * S
            phases = {m[2]["phase"] for _, m in sends}
            check(phases == {"up", "down"}, f"{tag}: phases {phases}")
        elif swapping:  # recursive doubling alone: log2(P) swaps of S a rank
            rounds = P.bit_length() - 1
            want = P * rounds * S + 2 * (n - P) * S
            for r in ranks:
                mine = [m for m in r.msgs if m[2]["seq"] == seq and m[2]["what"] == "send"]
                swaps = [m for m in mine if m[2]["phase"] == "swap"]
                check(len(swaps) in (0, rounds) and all(m[2]["bytes"] == S for m in swaps),
                      f"{tag}: rank {r.rank} sent {[m[2]['bytes'] for m in swaps]} B in swaps, "
                      f"not {rounds} of {S}")
                check(not any(m[2]["phase"] in ("halving", "doubling") for m in mine),
                      f"{tag}: rank {r.rank} halved with BRIGADE_RHD_DOUBLING_BYTES=1G")
        else:
            want = 2 * (P - 1) * S + 2 * (n - P) * S
            for r in ranks:
                mine = [m for m in r.msgs if m[2]["seq"] == seq and m[2]["what"] == "send"]
                halving = [m for m in mine if m[2]["phase"] in ("halving", "doubling")]
                check(len(halving) in (0, 2 * (P.bit_length() - 1)),
                      f"{tag}: rank {r.rank} sent {len(halving)} halving/doubling messages, "
                      f"not 2*log2({P})")
                if n == P:
                    got = sum(m[2]["bytes"] for m in mine)
                    check(got == 2 * (P - 1) * S // P, f"{tag}: rank {r.rank} sent {got} B, "
                          f"not 2(N-1)/N*S = {2 * (P - 1) * S // P}")
        check(total == want, f"{tag}: {total} bytes sent in all, the formula says {want}")
    # The reductions: the tree's inner nodes add their children's slices,
    # rhd adds in the fold and the halvings; none in the other phases.
    red = {m[2]["phase"] for r in ranks for m in r.msgs if m[2]["what"] == "reduce"}
    check(red <= set(bt.LAT_REDUCING) and red, f"{algo} N={n}: reductions in phases {red}")
    p = subprocess.run([tool] + files, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    check(p.returncode == 0 and "waiting" in p.stdout, f"summary: {p.returncode} {p.stderr}")
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        print("no matplotlib: the timeline was not drawn (the rest was checked)")
        return None
    bt.select(ranks, {calls})
    with tempfile.TemporaryDirectory(prefix="brigade-draw-") as d:
        fig = bt.draw(ranks, os.path.join(d, "t.png"), {})
    ax = fig.axes[0]
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    npairs = len(bt.lat_handoffs(ranks))
    check(len(arrows) == npairs, f"{algo} N={n}: {len(arrows)} arrows for {npairs} messages")
    return None


def main():
    mode = sys.argv[1]
    rest = sys.argv[2:]
    if mode == "spans":
        n, (run, prog, tool) = int(rest[0]), rest[1:4]
    elif mode == "lat":
        n, algo, (run, prog, tool) = int(rest[0]), rest[1], rest[2:5]
    else:
        run, prog, tool = rest[0:3]
    note = None
    with tempfile.TemporaryDirectory(prefix="brigade-trace-") as tmp:
        if mode == "spans":
            note = test_spans(run, prog, tool, n, tmp)
        elif mode == "lat":
            note = test_lat(run, prog, tool, n, algo, tmp)
        elif mode == "stall":
            test_stall(run, prog, tool, tmp)
        elif mode == "bad":
            test_bad(run, prog, tool, tmp)
        elif mode == "error":
            test_error(run, prog, tool, tmp)
        elif mode == "perfetto":
            test_perfetto(run, prog, tool, tmp)
        elif mode == "hosts":
            note = test_hosts(run, prog, tool, tmp)
        else:
            sys.exit(f"unknown mode {mode}")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    if note:
        print("SKIP:", note)
        sys.exit(77)
    print("all checks passed")


if __name__ == "__main__":
    main()
