#!/usr/bin/python3
"""brigade-trace: merge, summarize and draw the traces of a brigade job.

    brigade-trace trace.*.json                   summary table
    brigade-trace trace.*.json -o timeline.png   the last allreduce of the largest
                                                 size: timeline.png + timeline.svg
    brigade-trace trace.*.json -c 8 -o t.png     collective #8
    brigade-trace trace.*.json --merge out.json  and one file for Perfetto

The inputs are the per-rank files BRIGADE_TRACE_FILE=trace.%r.json writes
(Chrome trace event JSON). Their timestamps are already on one clock (the
rank at ring position 0's), so merging is a concatenation.

The summary counts only time inside collectives. Per rank: how long it
worked and how long it waited and for whom: "waits on" is the neighbour it
waited for, "stalled by" follows that neighbour's own waits around the ring
to the rank that was really late ("self" when the chain comes back round:
no rank was working, the data was on its way or the ranks were not
scheduled). A wait for a rank that had not yet called the collective (a
benchmark's pause between calls, a rank slow in its own work) is "late
call", apart from the waiting on the ring. Per link: the bytes, the time
data flowed (a slice between sender and receiver, both at it), the
bandwidth over that time, and the waits; then the slowest link.

The timeline (-o) shows one collective (the last allreduce of the largest
size, or --collective N) on its own time axis: one lane per rank in ring
order and one row per step in each lane, reduce-scatter slices in blue and
all-gather in orange ("cN": chunk N), a dashed line between the two
phases, waiting hatched, and an arrow from each slice a rank sent to
where its successor had it. Stretches in which no rank worked are drawn
narrow (a grey band, the time left out written under it). Tree and rhd
allreduces are drawn from their messages: a row per tree and direction
or per rhd round, an arrow from each send to its receipt.

Drawing needs matplotlib (Debian: python3-matplotlib); the summary and
--merge need only Python 3. Exit status: 0, or 2 for a bad input.
"""

import argparse
import bisect
import json
import os
import sys

PROG = "brigade-trace"


class TraceError(Exception):
    """A problem with an input, said in one sentence naming the file."""


def fail(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ------------------------------------------------------------------ reading

SLICE_ARGS = {"seq": int, "step": int, "chunk": int, "slice": int, "bytes": int,
              "recv_from": int, "send_to": int, "wait_recv_us": (int, float),
              "wait_send_us": (int, float), "prim": str}
WAIT_ARGS = {"seq": int, "step": int, "peer": int, "for": str}
COLL_ARGS = {"seq": int, "kind": str, "count": int, "bytes": int}
MSG_ARGS = {"seq": int, "what": str, "peer": int, "bytes": int, "phase": str, "round": int,
            "tree": int, "data_us": (int, float)}
META_KEYS = {"brigade_trace": int, "rank": int, "nranks": int, "host": str,
             "comm_id": str, "ring": list}


TYPE_NAMES = {int: "an integer", str: "a string", dict: "an object", list: "a list"}


def _typed(v, t):
    # bool is an int in Python; a JSON true is not a number here
    return isinstance(v, t) and not isinstance(v, bool)


def check_fields(path, where, obj, spec):
    for key, t in spec.items():
        if key not in obj:
            raise TraceError(f"{path}: {where} has no \"{key}\"")
        if not _typed(obj[key], t):
            raise TraceError(f"{path}: {where}: \"{key}\" is {json.dumps(obj[key])[:40]}, "
                             f"not {TYPE_NAMES.get(t, 'a number')}")


class Rank:
    def __init__(self, path, meta):
        self.path = path
        self.meta = meta
        self.rank = meta["rank"]
        self.host = meta["host"]
        self.events = []  # as read, for --merge
        self.colls = []   # (t0, t1, args, name)
        self.slices = []  # (t0, t1, args)
        self.waits = []   # (t0, t1, peer, for, seq)
        self.msgs = []    # (t0, t1, args): tree and rhd's sends, receives, reductions
        self.wait_step = {}  # (t0, t1) of a wait: its step


def load(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}")
    if not raw.strip():
        raise TraceError(f"{path}: empty file (a rank writes its trace at brg_comm_destroy "
                         "or when a collective fails; did it get there?)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text (byte {e.start}): not a trace file")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        at_end = e.pos >= len(text.rstrip()) - 1 or e.msg.startswith("Unterminated string")
        hint = " (the file ends early: truncated?)" if at_end else ""
        raise TraceError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: "
                         f"{e.msg}{hint}")
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply: not a trace file")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: no \"traceEvents\" list: not a Chrome trace file")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or "brigade_trace" not in meta:
        raise TraceError(f"{path}: no brigade \"metadata\": not written by BRIGADE_TRACE_FILE "
                         "(a file merged by brigade-trace is not an input)")
    check_fields(path, "metadata", meta, META_KEYS)
    if not 0 <= meta["rank"] < meta["nranks"]:
        raise TraceError(f"{path}: metadata: rank {meta['rank']} is not in "
                         f"[0, {meta['nranks']})")
    r = Rank(path, meta)
    for i, ev in enumerate(doc["traceEvents"]):
        where = f"event {i}"
        if not isinstance(ev, dict) or not isinstance(ev.get("ph"), str):
            raise TraceError(f"{path}: {where} is not an object with a \"ph\"")
        r.events.append(ev)
        if ev["ph"] == "M":
            continue
        check_fields(path, where, ev, {"ts": (int, float), "pid": int, "name": str,
                                       "cat": str})
        if ev["pid"] != r.rank:
            raise TraceError(f"{path}: {where}: pid {ev['pid']} in the file of rank {r.rank}")
        if ev["ph"] != "X":
            continue
        check_fields(path, where, ev, {"dur": (int, float), "args": dict})
        if ev["dur"] < 0:
            raise TraceError(f"{path}: {where}: negative duration {ev['dur']}")
        t0, t1, a = ev["ts"], ev["ts"] + ev["dur"], ev["args"]
        cat = ev["cat"]
        if cat == "slice":
            check_fields(path, f"{where} (slice)", a, SLICE_ARGS)
            r.slices.append((t0, t1, a))
        elif cat == "wait":
            check_fields(path, f"{where} (wait)", a, WAIT_ARGS)
            r.waits.append((t0, t1, a["peer"], a["for"], a["seq"]))
            r.wait_step[(t0, t1)] = a["step"]
        elif cat == "msg":
            check_fields(path, f"{where} (msg)", a, MSG_ARGS)
            r.msgs.append((t0, t1, a))
            if a["what"] == "recv" and t1 > t0:
                # waiting for a message: a wait like the ring's, for blame
                r.waits.append((t0, t1, a["peer"], "data", a["seq"]))
                r.wait_step[(t0, t1)] = a["round"]
        elif cat == "collective":
            check_fields(path, f"{where} (collective)", a, COLL_ARGS)
            r.colls.append((t0, t1, a, ev["name"]))
    r.colls.sort(key=lambda c: c[0])
    r.slices.sort(key=lambda s: s[0])
    r.waits.sort(key=lambda w: w[0])
    r.msgs.sort(key=lambda m: m[0])
    return r


def load_all(paths):
    ranks = {}
    for p in paths:
        r = load(p)
        if r.rank in ranks:
            raise TraceError(f"{p}: rank {r.rank} again (also in {ranks[r.rank].path})")
        ranks[r.rank] = r
    first = next(iter(ranks.values()))
    for r in ranks.values():
        for key in ("nranks", "comm_id"):
            if r.meta[key] != first.meta[key]:
                raise TraceError(f"{r.path}: {key} {r.meta[key]} but {first.path} has "
                                 f"{first.meta[key]}: not one communicator's traces")
    missing = sorted(set(range(first.meta["nranks"])) - set(ranks))
    if missing:
        print(f"{PROG}: warning: no trace of rank(s) {', '.join(map(str, missing))}",
              file=sys.stderr)
    return [ranks[k] for k in sorted(ranks)]


def select(ranks, seqs):
    """Keeps the events of the collectives numbered in seqs (None: all)."""
    if seqs is None:
        return
    for r in ranks:
        r.colls = [c for c in r.colls if c[2]["seq"] in seqs]
        r.slices = [s for s in r.slices if s[2]["seq"] in seqs]
        r.msgs = [m for m in r.msgs if m[2]["seq"] in seqs]
        lo_hi = [(c[0], c[1]) for c in r.colls]
        r.waits = [w for w in r.waits if any(lo <= w[0] <= hi for lo, hi in lo_hi)]


def default_collective(ranks):
    """The collective a timeline shows unless told: the last allreduce of
    the largest size (a benchmark's measured call; its setup, barriers and
    the small allreduces it shares its timings with are left out), else
    the last of the largest collectives."""
    colls = [c for r in ranks for c in r.colls]
    if not colls:
        return None
    pool = [c for c in colls if c[2]["kind"] == "allreduce"] or colls
    most = max(c[2]["bytes"] for c in pool)
    return max(c[2]["seq"] for c in pool if c[2]["bytes"] == most)


def parse_seqs(text, ranks):
    if text == "largest":
        # The first of the collectives that moved the most bytes.
        colls = [c for r in ranks for c in r.colls]
        if not colls:
            return set()
        most = max(c[2]["bytes"] for c in colls)
        return {min(c[2]["seq"] for c in colls if c[2]["bytes"] == most)}
    out = set()
    try:
        for part in text.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                out.update(range(int(a), int(b) + 1))
            else:
                out.add(int(part))
    except ValueError:
        fail(f"--seq {text!r}: expected numbers like 3, 2-5 or 1,4, or largest")
    return out


# ------------------------------------------------------------------ merging

def merge(ranks, out):
    doc = {"traceEvents": [ev for r in ranks for ev in r.events],
           "displayTimeUnit": "ns",
           "metadata": {"brigade_merged": 1, "ranks": [r.meta for r in ranks]}}
    try:
        with open(out, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
    except OSError as e:
        fail(f"{out}: cannot write: {e.strerror}")


# ------------------------------------------------------------------ matching

def handoffs(ranks):
    """Each slice a rank sent, with the slice its successor received it as:
    [(src, send slice, dst, recv slice)]. Within one collective both ends
    walk the same schedule and the FIFO between them keeps order, so the
    k-th slice that src sent to dst is the k-th that dst took from src."""
    sends, recvs = {}, {}
    for r in ranks:
        for sl in r.slices:
            a = sl[2]
            if a["send_to"] >= 0:
                sends.setdefault((a["seq"], r.rank, a["send_to"]), []).append(sl)
            if a["recv_from"] >= 0:
                recvs.setdefault((a["seq"], a["recv_from"], r.rank), []).append(sl)
    out = []
    for (seq, src, dst), ss in sorted(sends.items()):
        for s_, q in zip(ss, recvs.get((seq, src, dst), [])):
            out.append((src, s_, dst, q))
    return out


def write_start(sl):
    """When a slice's data began to move: after the rank's waits for its
    predecessor's data and for a free slot at its successor (prim_body
    takes both before its one pass over the data)."""
    t0, t1, a = sl
    return min(t0 + a["wait_recv_us"] + a["wait_send_us"], t1)


def data_in(sl):
    """When the receiving slice had its data: the end of its wait for it."""
    t0, t1, a = sl
    return min(t0 + a["wait_recv_us"], t1)


def union_len(intervals, minus=()):
    """Length of the union of intervals, less what the union of `minus`
    covers of it."""
    def merged(iv):
        out = []
        for lo, hi in sorted(iv):
            if hi <= lo:
                continue
            if out and lo <= out[-1][1]:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        return out
    a, b = merged(intervals), merged(minus)
    total, j = 0.0, 0
    for lo, hi in a:
        total += hi - lo
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            total -= min(hi, b[k][1]) - max(lo, b[k][0])
            k += 1
    return total


# ------------------------------------------------------------------ summary

def blame(ranks_by_id, peer, seq, a, b, depth, acc, late):
    """Charges [a, b) of someone's wait for `peer` in collective `seq`: the
    part before peer had called that collective goes to late[peer] (time
    outside collectives: the caller's own work between calls); the parts
    during which peer itself waited go on to whom it waited for, the rest
    to peer."""
    r = ranks_by_id.get(peer)
    if r is not None:
        start = r.coll_start.get(seq)
        if start is not None and a < start:
            cut = min(b, start)
            late[peer] = late.get(peer, 0.0) + cut - a
            a = cut
    if b <= a:
        return
    covered = 0.0
    if r is not None and depth < len(ranks_by_id):
        starts = r.wait_starts
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(r.waits) and r.waits[i][0] < b:
            lo, hi = max(a, r.waits[i][0]), min(b, r.waits[i][1])
            if hi > lo:
                blame(ranks_by_id, r.waits[i][2], r.waits[i][4], lo, hi, depth + 1, acc, late)
                covered += hi - lo
            i += 1
    acc[peer] = acc.get(peer, 0.0) + (b - a) - covered


def link_table(ranks):
    """{(src, dst): [bytes, flow us, receiver's data waits us, sender's slot
    waits us]}. Flow: the time a slice was on its way from src to dst, from
    src starting to write it (or dst starting on it, if later) to dst
    finishing with it, overlaps counted once, dst's own waits for a free
    slot at its successor left out."""
    flows, links = {}, {}
    by_id = {r.rank: r for r in ranks}
    for src, s_, dst, q in handoffs(ranks):
        l = links.setdefault((src, dst), [0, 0.0, 0.0, 0.0])
        l[0] += q[2]["bytes"]
        l[2] += q[2]["wait_recv_us"]
        l[3] += s_[2]["wait_send_us"]
        # From when both ends were at it: data written before the receiver
        # got to the slice sat in the FIFO, it did not flow.
        flows.setdefault((src, dst), []).append((max(write_start(s_), q[0]), q[1]))
    for key, iv in flows.items():
        dst = by_id[key[1]]
        slot_waits = [(w[0], w[1]) for w in dst.waits if w[3] == "free slot"]
        links[key][1] = union_len(iv, slot_waits)
    return links


def summarize(ranks, show=True):
    by_id = {r.rank: r for r in ranks}
    for r in ranks:
        r.wait_starts = [w[0] for w in r.waits]
        r.coll_start = {c[2]["seq"]: c[0] for c in r.colls}
    rows = []
    stalled_others, late_others = {}, {}
    for r in ranks:
        coll = sum(c[1] - c[0] for c in r.colls)
        busy = sum(s[1] - s[0] for s in r.slices)
        # tree and rhd have no slices: their time in the collective, less
        # the waits for messages below, is work
        lat_seqs = {m[2]["seq"] for m in r.msgs}
        busy += sum(c[1] - c[0] for c in r.colls if c[2]["seq"] in lat_seqs)
        wait = sum(w[1] - w[0] for w in r.waits)
        direct, root, late = {}, {}, {}
        for t0, t1, peer, _, seq in r.waits:
            direct[peer] = direct.get(peer, 0.0) + t1 - t0
            blame(by_id, peer, seq, t0, t1, 1, root, late)
        for p, t in root.items():
            if p != r.rank:
                stalled_others[p] = stalled_others.get(p, 0.0) + t
        for p, t in late.items():
            late_others[p] = late_others.get(p, 0.0) + t
        lt = sum(late.values())
        rows.append((r, coll, busy - wait, wait - lt, lt, direct, root))

    def who(d, me):
        # "self": the chain of waits came back round to this rank, so no
        # rank was working: data in flight, or ranks not scheduled.
        items = sorted(((t, p) for p, t in d.items() if t >= 0.5), reverse=True)
        return ", ".join(f"{'self' if p == me else p}: {t / 1000:.2f}"
                         for t, p in items[:3]) or "-"

    if not show:
        return rows, stalled_others
    ncoll = max((len(r.colls) for r in ranks), default=0)
    print(f"brigade trace: {len(ranks)} rank(s) of {ranks[0].meta['nranks']}, "
          f"{ncoll} collective(s); times in ms, from each rank's collectives only")
    print(f"{'rank':>4} {'host':<12} {'in coll':>9} {'working':>9} {'waiting':>9} {'wait%':>6} "
          f"{'late call':>9}  {'waits on (rank: ms)':<24} stalled by (rank: ms)")
    for r, coll, work, wait, lt, direct, root in rows:
        ring_time = coll - lt
        pct = 100.0 * wait / ring_time if ring_time > 0 else 0.0
        print(f"{r.rank:>4} {r.host[:12]:<12} {coll / 1000:>9.3f} {work / 1000:>9.3f} "
              f"{wait / 1000:>9.3f} {pct:>5.1f}% {lt / 1000:>9.3f}  {who(direct, -1):<24} "
              f"{who(root, r.rank)}")
    print("  working: in slices (tree, rhd: in the collective), less their waits; waiting: for a "
          "neighbour that was inside "
          "the same collective; late call: for a rank that had not called it yet (its own work "
          "between calls), left out of waiting and wait%")
    total_wait = sum(row[3] for row in rows)
    if stalled_others:
        worst = max(stalled_others.items(), key=lambda kv: kv[1])
        share = 100.0 * worst[1] / total_wait if total_wait > 0 else 0.0
        if worst[1] >= 1.0 and share >= 50:
            print(f"most waited for: rank {worst[0]} (the others waited {worst[1] / 1000:.3f} ms "
                  f"for it inside collectives, {share:.0f}% of that waiting)")
        elif worst[1] >= 1.0:
            print(f"no rank held the others up: the waits end at every rank (rank {worst[0]}, "
                  f"the most, {share:.0f}%), or at none (\"self\"): ranks waiting to be "
                  "scheduled or data on its way, the machine rather than one rank")
    if late_others:
        worst = max(late_others.items(), key=lambda kv: kv[1])
        if worst[1] >= 1.0:
            print(f"called late: rank {worst[0]} (the others waited {worst[1] / 1000:.3f} ms for "
                  f"it to call collectives they had begun: time outside the collectives, not "
                  f"counted above)")

    links = link_table(ranks)
    if links:
        print(f"{'link':>8} {'MB':>10} {'flow ms':>9} {'GB/s':>8} {'recv waits':>11} "
              f"{'slot waits':>11}")
        for (src, dst), (nbytes, t, wr, ws) in sorted(links.items()):
            bw = nbytes / (t * 1e3) if t > 0 else float("inf")
            print(f"{src:>3} -> {dst:<2} {nbytes / 1e6:>10.3f} {t / 1000:>9.3f} {bw:>8.3f} "
                  f"{wr / 1000:>11.3f} {ws / 1000:>11.3f}")
        print("  flow: time a slice was on its way on the link (from the later of the sender "
              "starting to write it and the receiver starting on it, to the receiver done with "
              "it; overlaps once; time outside collectives and the receiver's waits for its own "
              "successor left out); GB/s = MB / flow")
        moving = {k: v for k, v in links.items() if v[0] > 0 and v[1] > 0}
        if moving:
            (src, dst), l = min(moving.items(), key=lambda kv: kv[1][0] / kv[1][1])
            print(f"slowest link: {src} -> {dst} ({l[0] / (l[1] * 1e3):.3f} GB/s while data "
                  f"flowed; receiver waited {l[2] / 1000:.3f} ms for data)")
    return rows, stalled_others


# ------------------------------------------------------------------ drawing

REDUCING = {"recv_reduce_send", "recv_reduce_copy_send", "recv_reduce_copy"}
# Tree and rhd: the phases that reduce (blue), and those that hand the
# result out (orange), in the order a rank runs them.
LAT_REDUCING = ("up", "fold", "halving", "swap")
LAT_ORDER = ("fold", "swap", "halving", "doubling", "unfold")


def phase_of(prim, kind, reduces):
    """'rs' for the reduce-scatter half (and reduce), 'ag' for the
    all-gather half (and broadcast, and the small allreduce's gather)."""
    if prim in REDUCING:
        return "rs"
    if prim == "send":
        return "rs" if reduces and kind in ("allreduce", "reduce_scatter", "reduce") else "ag"
    return "ag"


def lat_handoffs(ranks):
    """Each message of a tree or rhd allreduce with its receipt:
    [(src, send, dst, recv)]. Both ends tag a message alike (collective,
    phase, round, tree), and a pair's messages of one tag go in order."""
    sends, recvs = {}, {}
    for r in ranks:
        for m in r.msgs:
            a = m[2]
            key = (a["seq"], a["phase"], a["round"], a["tree"])
            if a["what"] == "send":
                sends.setdefault((r.rank, a["peer"]) + key, []).append(m)
            elif a["what"] == "recv":
                recvs.setdefault((a["peer"], r.rank) + key, []).append(m)
    out = []
    for key, ss in sorted(sends.items()):
        for s_, q in zip(ss, recvs.get(key, [])):
            out.append((key[0], s_, key[1], q))
    return out


def work_intervals(ranks):
    """When some rank did something (a slice less its waits, a send's bytes
    leaving, a reduction): the rest of a collective is every rank waiting."""
    iv = []
    for r in ranks:
        waits = sorted((w[0], w[1]) for w in r.waits)
        for s0, s1, _ in r.slices:
            at = s0
            for w0, w1 in waits:
                if w1 <= s0 or w0 >= s1:
                    continue
                if w0 > at:
                    iv.append((at, w0))
                at = max(at, w1)
            if s1 > at:
                iv.append((at, s1))
        for m0, m1, a in r.msgs:
            if a["what"] != "recv":
                iv.append((m0, max(m1, m0 + 1.0)))
    iv.sort()
    out = []
    for lo, hi in iv:
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


class Axis:
    """Real time to the drawing's x: stretches where every rank waited
    longer than `gap` us are drawn `gap` wide, so that the work is not a
    sliver beside the scheduler's pauses; each is marked with the time
    left out."""

    def __init__(self, t0, t1, busy, gap):
        # x(t) = t - t0 - the pauses' hidden time before t
        self.t0 = t0
        self.cuts = []
        hidden, at = 0.0, t0
        for lo, hi in busy + [[t1, t1]]:
            lo, hi = max(lo, t0), min(max(hi, lo), t1)
            if lo - at > 2 * gap:
                a, b = at + gap / 2, lo - gap / 2
                self.cuts.append((a, b, a - t0 - hidden))
                hidden += b - a
            at = max(at, hi)
        self.end = t1 - t0 - hidden

    def x(self, t):
        hidden = 0.0
        for a, b, _ in self.cuts:
            if t >= b:
                hidden += b - a
            elif t > a:
                return a - self.t0 - hidden
        return t - self.t0 - hidden

    def hidden(self):
        return sum(b - a for a, b, _ in self.cuts)


def nice_step(span):
    """A round tick step giving at most 8 ticks over span."""
    for st in sorted(m * 10.0 ** e for m in (1, 2, 5) for e in range(-3, 8)):
        if span / st <= 8:
            return st
    return span


def draw(ranks, out, stalled, max_arrows=400):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.lines import Line2D
    except ImportError:
        fail("drawing needs matplotlib (Debian: apt-get install python3-matplotlib); "
             "the summary and --merge work without it")
    starts = [c[0] for r in ranks for c in r.colls] + [s[0] for r in ranks for s in r.slices]
    ends = [c[1] for r in ranks for c in r.colls] + [s[1] for r in ranks for s in r.slices]
    if not starts:
        fail("nothing to draw: the traces hold no collective (see --collective)")
    t0, t1 = min(starts), max(ends)
    busy = work_intervals(ranks)
    pieces = sorted(b - a for a, b in busy) or [1.0]
    # Pauses longer than a few slices' work are the scheduler's, not the ring's.
    gap = max(4 * pieces[len(pieces) // 2], 0.02 * (t1 - t0) / max(len(busy), 1), 5.0)
    ax_t = Axis(t0, t1, busy, gap)
    span = max(ax_t.end, 1e-3)
    scale, unit = (1000.0, "ms") if span >= 2000 else (1.0, "µs")

    def X(t):
        return ax_t.x(t) / scale

    # Lanes in ring order, so hand-offs run from one lane to the next.
    ranks = sorted(ranks, key=lambda r: r.meta.get("pos", r.rank))
    n = len(ranks)
    lat = any(r.msgs for r in ranks)
    if lat and any(r.slices for r in ranks):
        print(f"{PROG}: warning: the collectives drawn mix ring slices and tree or rhd "
              "messages; only the messages are drawn (pick one with --collective N)",
              file=sys.stderr)
    kinds = sorted({c[2]["kind"] for r in ranks for c in r.colls})
    if lat:
        trees = sorted({m[2]["tree"] for r in ranks for m in r.msgs})
        if trees != [-1]:  # the double tree: a row per tree and direction
            rows = [(ph, t) for ph in ("up", "down") for t in trees]
            row_name = {(ph, t): f"tree {t} {ph}" for ph, t in rows}
        else:  # rhd: a row per round, in the order a rank runs them
            seen = {(m[2]["phase"], m[2]["round"]) for r in ranks for m in r.msgs}
            rows = sorted(seen, key=lambda pr: (LAT_ORDER.index(pr[0]) if pr[0] in LAT_ORDER
                                                else 9, -pr[1] if pr[0] in ("doubling", "swap")
                                                else pr[1]))
            row_name = {pr: (pr[0] if pr[0] in ("fold", "unfold") else f"{pr[0]} {pr[1]}")
                        for pr in rows}
        row_of = {pr: i for i, pr in enumerate(rows)}
        nrows = len(rows)
    else:
        nrows = max([s[2]["step"] + 1 for r in ranks for s in r.slices] + [1])
    lane = {r.rank: n - 1 - i for i, r in enumerate(ranks)}
    row_h = 0.80 / nrows

    def row_y(rank, row):  # bottom of a row; row 0 on top of the lane
        return lane[rank] - 0.44 + (nrows - 1 - row) * row_h

    fig_h = 1.6 + (0.35 + 0.24 * nrows) * n
    fig, ax = plt.subplots(figsize=(13, fig_h))
    blues, oranges = plt.get_cmap("Blues"), plt.get_cmap("Oranges")
    px_per_unit = 9.6 * 100 / (span / scale)  # the axis is about 9.6 in at 100 dpi
    label_fs = 7

    def label(x, w, y, text):
        # inside a bar wide enough for it, else just after it
        if w * px_per_unit >= 6 * len(text) + 4:
            ax.text(x + w / 2, y + row_h * 0.5, text, ha="center", va="center",
                    fontsize=label_fs, zorder=4)
        else:
            ax.text(x + w + 2 / px_per_unit, y + row_h * 0.5, text, ha="left", va="center",
                    fontsize=label_fs, zorder=4, color="0.1")

    def colour(ph, shade=0.6):
        return (blues if ph == "rs" else oranges)(shade)

    # The collective itself: a grey band above each lane.
    for r in ranks:
        y = lane[r.rank]
        if r.colls:
            ax.broken_barh([(X(c0), X(c1) - X(c0)) for c0, c1, _, _ in r.colls],
                           (y + 0.38, 0.05), facecolors="0.75", edgecolors="0.45",
                           linewidth=0.5)
    # Waiting, hatched, on the row it happened in.
    for r in ranks:
        ws = {}
        for w0, w1, _, _, seq in r.waits:
            if lat:
                m = next((m for m in r.msgs if m[0] == w0 and m[1] == w1), None)
                if m is None:
                    continue
                row = row_of.get((m[2]["phase"], m[2]["tree"]) if m[2]["tree"] >= 0
                                 else (m[2]["phase"], m[2]["round"]))
            else:
                row = min(r.wait_step.get((w0, w1), 0), nrows - 1)
            if row is None:
                continue
            ws.setdefault(row, []).append((X(w0), X(w1) - X(w0)))
        for row, iv in ws.items():
            ax.broken_barh(iv, (row_y(r.rank, row) + row_h * 0.1, row_h * 0.8),
                           facecolors="white", edgecolors="0.55", hatch="////", linewidth=0)
    boundaries = {}
    if not lat:
        kind_of = {c[2]["seq"]: c[2]["kind"] for r in ranks for c in r.colls}
        reduces = {s[2]["seq"] for r in ranks for s in r.slices if s[2]["prim"] in REDUCING}
        for r in ranks:
            bars = {}
            last_rs = None
            first_ag = None
            for s0, s1, a in r.slices:
                ph = phase_of(a["prim"], kind_of.get(a["seq"], ""), a["seq"] in reduces)
                work0 = min(s0 + a["wait_recv_us"] + a["wait_send_us"], s1)
                bars.setdefault(a["step"], []).append((X(work0), X(s1) - X(work0), ph, a))
                if ph == "rs":
                    last_rs = max(last_rs or s1, s1)
                elif first_ag is None or work0 < first_ag:
                    first_ag = work0
            if last_rs is not None and first_ag is not None and first_ag >= last_rs - 1:
                boundaries[r.rank] = (last_rs + first_ag) / 2
            for step, bs in bars.items():
                y = row_y(r.rank, step)
                ax.broken_barh([(x, max(w, span / scale * 1e-3)) for x, w, _, _ in bs],
                               (y + row_h * 0.05, row_h * 0.9),
                               facecolors=[colour(ph, 0.45 + 0.1 * (a["chunk"] % 3))
                                           for _, _, ph, a in bs],
                               edgecolors="0.2", linewidth=0.4)
                for x, w, ph, a in bs:
                    label(x, w, y, f"c{a['chunk']}")
        pairs = handoffs(ranks)
        ends = [(src, (s_[1], s_[2]["step"]), dst, (data_in(q), q[2]["step"]),
                 phase_of(s_[2]["prim"], kind_of.get(s_[2]["seq"], ""),
                          s_[2]["seq"] in reduces)) for src, s_, dst, q in pairs]
    else:
        for r in ranks:
            last_red = first_out = None
            labelled = set()
            for m0, m1, a in r.msgs:
                ph = "rs" if a["phase"] in LAT_REDUCING else "ag"
                if a["what"] != "recv":
                    if ph == "rs":
                        last_red = max(last_red or m1, m1)
                    elif first_out is None or m0 < first_out:
                        first_out = m0
                if a["what"] == "recv":
                    continue
                row = row_of[(a["phase"], a["tree"]) if a["tree"] >= 0
                             else (a["phase"], a["round"])]
                y = row_y(r.rank, row)
                x, w = X(m0), max(X(m1) - X(m0), span / scale * 2e-3)
                if a["what"] == "reduce":
                    ax.broken_barh([(x, w)], (y + row_h * 0.05, row_h * 0.9),
                                   facecolors=colour(ph, 0.75), edgecolors="0.2", linewidth=0.4)
                else:
                    ax.broken_barh([(x, w)], (y + row_h * 0.25, row_h * 0.5),
                                   facecolors=colour(ph, 0.4), edgecolors="0.2", linewidth=0.4)
                tag = f"s{a['round']}" if a["tree"] >= 0 else f"{a['bytes'] // 1024}K"
                if a["what"] == "send" and (row, tag) not in labelled:
                    labelled.add((row, tag))  # a parent's two sends of one slice: once
                    label(x, w, y, tag)
            if last_red is not None and first_out is not None and first_out >= last_red - 1:
                boundaries[r.rank] = (last_red + first_out) / 2
        pairs = lat_handoffs(ranks)

        def row_at(m):
            a = m[2]
            return row_of[(a["phase"], a["tree"]) if a["tree"] >= 0 else (a["phase"], a["round"])]
        ends = [(src, (s_[0], row_at(s_)), dst, (min(q[2]["data_us"], q[1]), row_at(q)),
                 "rs" if s_[2]["phase"] in LAT_REDUCING else "ag")
                for src, s_, dst, q in pairs]
    # The phase boundary: between the rows that reduce (the ring's steps 0
    # to N-1, the tree's ups, rhd's fold and halvings or swaps) and those that hand
    # the result out; and, where a rank's phases do not overlap in time,
    # when it went from one to the other.
    if lat:
        split = sum(1 for pr in rows if pr[0] in LAT_REDUCING)
        words = ("up", "down") if rows[0][0] == "up" else ("halving", "doubling")
    else:
        split = min(n, nrows)
        words = ("reduce-scatter", "all-gather")
    if 0 < split < nrows:
        for r in ranks:
            yb = row_y(r.rank, split - 1)
            ax.axhline(yb, color="crimson", lw=0.8, ls="--", zorder=1)
    for rk, tb in boundaries.items():
        xb = X(tb)
        ax.plot([xb, xb], [lane[rk] - 0.46, lane[rk] + 0.36], color="crimson", lw=1.2, ls="--",
                zorder=5)
    if boundaries:
        top = ranks[0].rank
        if top in boundaries:
            xb = X(boundaries[top])
            ax.text(xb, lane[top] + 0.44, f"{words[0]} | {words[1]}", ha="center",
                    va="bottom", fontsize=label_fs, color="crimson")
    # Hand-offs: one arrow per message, curved so that consecutive ones
    # (rank 0 to 1, then 1 to 2) never line up into one; the hop from the
    # last lane back to the first is a short stub at each end.
    drawn = ends[:max_arrows]
    pos_of = {r.rank: i for i, r in enumerate(ranks)}
    for src, (ts, rs_), dst, (td, rd), ph in drawn:
        x0, y0 = X(ts), row_y(src, rs_) + row_h * 0.5
        x1, y1 = X(td), row_y(dst, rd) + row_h * 0.5
        c = colour(ph, 0.9)
        if not lat and pos_of[dst] == 0 and pos_of[src] == n - 1 and n > 2:
            ax.plot([x0, x0 + (x1 - x0) * 0.15], [y0, lane[src] - 0.5], color=c, lw=0.8, ls=":")
            ax.annotate("", xy=(x1, y1), xytext=(x1 - (x1 - x0) * 0.15, lane[dst] + 0.47),
                        arrowprops=dict(arrowstyle="-|>", color=c, lw=0.8, shrinkA=0, shrinkB=0,
                                        mutation_scale=6, linestyle=":"))
            continue
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="-|>", color=c, lw=0.8, shrinkA=0, shrinkB=0,
                                    mutation_scale=7, connectionstyle="arc3,rad=-0.12"))
    # Pauses left out of the axis: a grey band with how long each was.
    for a, b, xa in ax_t.cuts:
        xg = xa / scale
        ax.axvspan(xg - 0.1 * gap / scale, xg + 0.1 * gap / scale, color="0.85", zorder=0)
        ax.text(xg, -0.55, f"+{(b - a) / 1000:.2f} ms" if b - a >= 100 else f"+{b - a:.0f} µs",
                ha="center", va="top", fontsize=label_fs - 1, color="0.35", rotation=90)
    ax.set_xlim(-span / scale * 0.01, span / scale * 1.01)
    ax.set_ylim(-0.75, n - 0.5)
    # Row names on the y axis, the rank's name beside them.
    yt, yl = [], []
    for r in ranks:
        for i in range(nrows):
            yt.append(row_y(r.rank, i) + row_h * 0.5)
            yl.append(row_name[rows[i]] if lat else f"step {i}")
        ax.text(-0.085 if lat else -0.06, lane[r.rank], f"rank {r.rank}\n{r.host[:12]}",
                transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=9,
                fontweight="bold")
    ax.set_yticks(yt)
    ax.set_yticklabels(yl, fontsize=label_fs)
    for k in range(1, n):
        ax.axhline(k - 0.5, color="0.6", lw=0.6)
    # Ticks in real time from the start, jumping where a pause is left out.
    st = nice_step(span / scale)
    ticks, labels = [], []
    marks = [(0.0, t0)] + [(xa, b) for a, b, xa in ax_t.cuts]
    room = 0.03 * span / scale  # no tick this close to a pause's mark
    for i, (xs, ts) in enumerate(marks):
        xs /= scale
        xe = marks[i + 1][0] / scale - room if i + 1 < len(marks) else span / scale
        real0 = (ts - t0) / scale
        k = int(real0 / st) + 1 if i else 0
        while True:
            rv = k * st
            xv = xs + (rv - real0)
            if xv > xe + 1e-9:
                break
            if xv >= xs + (room if i else 0) - 1e-9:
                ticks.append(xv)
                labels.append(f"{rv:.4g}")
            k += 1
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=8)
    hid = ax_t.hidden()
    ax.set_xlabel(f"time ({unit}) from the collective's start"
                  + (f"; {len(ax_t.cuts)} pause(s) when no rank worked, "
                     f"{hid / 1000:.2f} ms in all, drawn narrow (grey, +time below)"
                     if ax_t.cuts else ""), fontsize=8)
    seqs = sorted({c[2]["seq"] for r in ranks for c in r.colls})
    what = (f"{', '.join(kinds)} #{seqs[0]}" if len(seqs) == 1 else
            f"{len(seqs)} collectives ({', '.join(kinds)})")
    algo = ("double binary tree" if lat and row_name and "tree" in row_name[rows[0]] else
            "recursive halving/doubling" if lat else "ring")
    nbytes = max((c[2]["bytes"] for r in ranks for c in r.colls), default=0)
    note = "" if len(drawn) == len(ends) else f"; arrows: first {len(drawn)} of {len(ends)}"
    sub = ""
    if lat and algo == "double binary tree":
        # each tree's edges, from the partial sums sent up: child -> parent
        parts = []
        for t in trees:
            ed = sorted({(r.rank, m[2]["peer"]) for r in ranks for m in r.msgs
                         if m[2]["what"] == "send" and m[2]["phase"] == "up"
                         and m[2]["tree"] == t})
            kids = {a for a, _ in ed}
            roots = sorted({b for _, b in ed} - kids)
            parts.append(f"tree {t}: " + ", ".join(f"{a}\u2192{b}" for a, b in ed)
                         + (f" (root {roots[0]})" if roots else ""))
        sub = "\n" + "; ".join(parts) + "; each tree carries half the buffer in slices sN"
    elif lat:
        sub = ("\nhalving: a rank sends its partner half of what it holds and adds the half it "
               "gets; doubling: the finished parts go back (labels: bytes)")
    ax.set_title(f"brigade: {what}, {nbytes / 1048576:g} MiB, {algo} over {n} ranks"
                 f"{note}{sub}", loc="left", fontsize=11 if not sub else 10)
    if stalled:
        worst, t = max(stalled.items(), key=lambda kv: kv[1])
        total = sum(w[1] - w[0] for r in ranks for w in r.waits)
        # Name a rank only when most of the waiting ends at it; waits spread
        # over the ranks are the machine's (a rank not scheduled), not one's.
        if worst in lane and total > 0 and t >= 0.5 * total:
            ax.text(1.01, 0.0, f"others waited\n{t / 1000:.2f} ms for\nrank {worst}",
                    transform=ax.transAxes, ha="left", va="bottom", color="red", fontsize=9)
            for txt in ax.texts:
                if txt.get_text().startswith(f"rank {worst}\n"):
                    txt.set_color("red")
    if lat:
        handles = [Patch(facecolor=colour("rs", 0.75), edgecolor="0.2",
                         label="reduction (up, fold,\nhalving)"),
                   Patch(facecolor=colour("rs", 0.4), edgecolor="0.2",
                         label="send of partial sums\n(sN: slice N)"),
                   Patch(facecolor=colour("ag", 0.4), edgecolor="0.2",
                         label="send of the result\n(down, doubling)")]
    else:
        handles = [Patch(facecolor=colour("rs", 0.5), edgecolor="0.2",
                         label="reduce-scatter slice\n(cN: chunk N; add, send on)"),
                   Patch(facecolor=colour("ag", 0.5), edgecolor="0.2",
                         label="all-gather slice\n(cN: chunk N; copy, send on)")]
    handles += [Patch(facecolor="white", edgecolor="0.55", hatch="////",
                      label="waiting for data\n(or a free slot)"),
                Patch(facecolor="0.75", edgecolor="0.45", label="the collective"),
                Line2D([0], [0], color=colour("rs", 0.9), lw=1, marker=">", markersize=4,
                       label="hand-off: sent ->\nreceived"),
                Line2D([0], [0], color="crimson", lw=1.2, ls="--",
                       label=f"phase boundary:\n{words[0]} above,\n{words[1]} below")]
    if not lat:
        handles.append(Line2D([0], [0], color=colour("ag", 0.9), lw=0.8, ls=":",
                              label="hand-off from the\nlast lane to the first"))
    handles.append(Patch(facecolor="0.85", label="pause, drawn narrow"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              frameon=False)
    fig.tight_layout()
    base, ext = os.path.splitext(out)
    outs = [out] if ext.lower() in (".png", ".svg") else [out + ".png"]
    if ext.lower() == ".png":
        outs.append(base + ".svg")
    elif ext.lower() == ".svg":
        outs.append(base + ".png")
    try:
        for o in outs:
            fig.savefig(o, dpi=100)
    except OSError as e:
        fail(f"{e.filename}: cannot write: {e.strerror}")
    print(f"wrote {' and '.join(outs)}")
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="per-rank traces (BRIGADE_TRACE_FILE=trace.%%r.json)")
    ap.add_argument("--merge", metavar="OUT.json", help="write one file for Perfetto")
    ap.add_argument("-o", "--output", metavar="TIMELINE.png",
                    help="draw the timeline (PNG, and SVG beside it)")
    ap.add_argument("--seq", metavar="N[-M][,..]",
                    help="only these collectives (numbers as in the trace: 1 is the first), "
                    "or 'largest': the first of those that moved the most bytes")
    ap.add_argument("-c", "--collective", metavar="N", type=int,
                    help="only collective N (as --seq N); with -o and neither option, the "
                    "last allreduce of the largest size is drawn and summarized")
    ap.add_argument("-q", "--quiet", action="store_true", help="no summary")
    args = ap.parse_args(argv)
    try:
        ranks = load_all(args.files)
    except TraceError as e:
        fail(str(e))
    if args.merge:
        merge(ranks, args.merge)
    if args.collective is not None:
        seqs = {args.collective}
        if not any(c[2]["seq"] == args.collective for r in ranks for c in r.colls):
            fail(f"--collective {args.collective}: no such collective in the traces "
                 f"(they hold #{min(c[2]['seq'] for r in ranks for c in r.colls)} to "
                 f"#{max(c[2]['seq'] for r in ranks for c in r.colls)})"
                 if any(r.colls for r in ranks) else
                 f"--collective {args.collective}: the traces hold no collective")
    elif args.seq:
        seqs = parse_seqs(args.seq, ranks)
    elif args.output:
        seqs = {default_collective(ranks)} if any(r.colls for r in ranks) else None
        if seqs:
            c = next(c for r in ranks for c in r.colls if c[2]["seq"] in seqs)
            n_all = len({c[2]["seq"] for r in ranks for c in r.colls})
            print(f"{PROG}: {c[3]} ({c[2]['bytes']} bytes), the last of the largest "
                  f"allreduces, of {n_all} collective(s) in the traces; --collective N "
                  "for another")
    else:
        seqs = None
    select(ranks, seqs)
    _, stalled = summarize(ranks, show=not args.quiet)
    if args.output:
        draw(ranks, args.output, stalled)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
