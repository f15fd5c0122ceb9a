#!/usr/bin/python3
"""brigade-trace: merge, summarize and draw the traces of a brigade job.

    brigade-trace trace.*.json                   summary table
    brigade-trace trace.*.json -o timeline.png   and timeline.png + timeline.svg
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

The timeline (-o) has one lane per rank in ring order and one row per
step in each lane: reduce-scatter slices in blue, all-gather in orange
(the shade and "cN" give the chunk), waiting hatched, and an arrow from
each slice a rank sent to where its successor received it.

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
        elif cat == "collective":
            check_fields(path, f"{where} (collective)", a, COLL_ARGS)
            r.colls.append((t0, t1, a, ev["name"]))
    r.colls.sort(key=lambda c: c[0])
    r.slices.sort(key=lambda s: s[0])
    r.waits.sort(key=lambda w: w[0])
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
        lo_hi = [(c[0], c[1]) for c in r.colls]
        r.waits = [w for w in r.waits if any(lo <= w[0] <= hi for lo, hi in lo_hi)]


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
    print("  working: in slices, less their waits; waiting: for a neighbour that was inside "
          "the same collective; late call: for a rank that had not called it yet (its own work "
          "between calls), left out of waiting and wait%")
    total_wait = sum(row[3] for row in rows)
    if stalled_others:
        worst = max(stalled_others.items(), key=lambda kv: kv[1])
        if worst[1] >= 1.0:
            share = 100.0 * worst[1] / total_wait if total_wait > 0 else 0.0
            print(f"most waited for: rank {worst[0]} (the others waited {worst[1] / 1000:.3f} ms "
                  f"for it inside collectives, {share:.0f}% of that waiting)")
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


def phase_of(prim, kind, reduces):
    """'rs' for the reduce-scatter half (and reduce), 'ag' for the
    all-gather half (and broadcast, and the small allreduce's gather)."""
    if prim in REDUCING:
        return "rs"
    if prim == "send":
        return "rs" if reduces and kind in ("allreduce", "reduce_scatter", "reduce") else "ag"
    return "ag"


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
        fail("nothing to draw: the traces hold no collective (see --seq)")
    t0 = min(starts)
    span = max(max(ends) - t0, 1e-3)
    scale, unit = (1000.0, "ms") if span >= 2000 else (1.0, "us")
    # Lanes in ring order, so hand-offs run from one lane to the next.
    ranks = sorted(ranks, key=lambda r: r.meta.get("pos", r.rank))
    n = len(ranks)
    nsteps = max([s[2]["step"] + 1 for r in ranks for s in r.slices] + [1])
    lane = {r.rank: n - 1 - i for i, r in enumerate(ranks)}
    row_h = 0.78 / nsteps

    def row_y(rank, step):  # bottom of step's row; step 0 on top of the lane
        return lane[rank] - 0.42 + (nsteps - 1 - step) * row_h

    fig, ax = plt.subplots(figsize=(12, 1.0 + (0.5 + 0.12 * nsteps) * n))
    blues, oranges = plt.get_cmap("Blues"), plt.get_cmap("Oranges")
    nchunks = max([s[2]["chunk"] + 1 for r in ranks for s in r.slices] + [1])

    def colour(ph, chunk):
        shade = 0.45 + 0.4 * (chunk % nchunks) / max(nchunks - 1, 1)
        return (blues if ph == "rs" else oranges)(shade)

    kind_of = {}
    reduces = {}
    for r in ranks:
        for c in r.colls:
            kind_of[c[2]["seq"]] = c[2]["kind"]
        for s in r.slices:
            if s[2]["prim"] in REDUCING:
                reduces[s[2]["seq"]] = True
    px_per_unit = 12 * 100 / (span / scale)  # roughly: the axis is ~12 in at 100 dpi
    for r in ranks:
        y = lane[r.rank]
        if r.colls:
            ax.broken_barh([((c0 - t0) / scale, (c1 - c0) / scale) for c0, c1, _, _ in r.colls],
                           (y + 0.38, 0.06), facecolors="0.75", edgecolors="0.45",
                           linewidth=0.5)
        bars = {}
        for s0, s1, a in r.slices:
            ph = phase_of(a["prim"], kind_of.get(a["seq"], ""), reduces.get(a["seq"], False))
            work = (s1 - s0 - a["wait_recv_us"] - a["wait_send_us"]) / scale
            bars.setdefault(a["step"], []).append(((s0 - t0) / scale, (s1 - s0) / scale,
                                                   colour(ph, a["chunk"]), a["chunk"], work))
        for step, bs in bars.items():
            ax.broken_barh([(x, w) for x, w, _, _, _ in bs], (row_y(r.rank, step), row_h * 0.9),
                           facecolors=[c for _, _, c, _, _ in bs], edgecolors="none")
            # The chunk's number on the working end of a slice wide enough for it.
            for x, w, _, ch, work in bs:
                if work * px_per_unit > 14 and len(bs) * n < 600:
                    ax.text(x + w - work / 2, row_y(r.rank, step) + row_h * 0.45, f"c{ch}",
                            ha="center", va="center", fontsize=6, color="0.05", zorder=4)
        # Waiting, on the row of the step it happened in.
        ws = {}
        for w0, w1, _, _, seq in r.waits:
            step = r.wait_step.get((w0, w1), 0)
            ws.setdefault(step, []).append(((w0 - t0) / scale, (w1 - w0) / scale))
        for step, iv in ws.items():
            ax.broken_barh(iv, (row_y(r.rank, min(step, nsteps - 1)), row_h * 0.9),
                           facecolors="white", edgecolors="0.25", hatch="////", linewidth=0)
    # Each row's step number, at the left edge of the lane.
    if nsteps > 1:
        for r in ranks:
            for t in range(nsteps):
                ax.text(0.002, row_y(r.rank, t) + row_h * 0.45, str(t), fontsize=5,
                        color="0.45", ha="left", va="center", transform=ax.get_yaxis_transform())
    # Hand-offs: an arrow from where the sender finished a slice to where
    # its successor had it (the end of its wait for it).
    pairs = handoffs(ranks)
    drawn = pairs[:max_arrows]
    for src, s_, dst, q in drawn:
        x0, y0 = (s_[1] - t0) / scale, row_y(src, s_[2]["step"]) + row_h * 0.45
        x1, y1 = (data_in(q) - t0) / scale, row_y(dst, q[2]["step"]) + row_h * 0.45
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="-|>", color="0.15", lw=0.5, alpha=0.6,
                                    shrinkA=0, shrinkB=0, mutation_scale=5))
    ax.set_xlim(0, span / scale * 1.01)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r.rank}\n{r.host[:12]}" for r in reversed(ranks)])
    if stalled:
        worst, t = max(stalled.items(), key=lambda kv: kv[1])
        total = sum(c[1] - c[0] for r in ranks for c in r.colls)
        if worst in lane and total > 0 and t >= 0.1 * total:
            ax.get_yticklabels()[lane[worst]].set_color("red")
            ax.set_title(f"others waited {t / 1000:.2f} ms for rank {worst}", loc="right",
                         color="red", fontsize=9)
    ax.set_xlabel(f"time ({unit}) from the first span; in each rank's lane one row per step "
                  f"(numbered at the left), step 0 on top")
    kinds = sorted({c[2]["kind"] for r in ranks for c in r.colls})
    note = "" if len(drawn) == len(pairs) else f"; arrows: first {len(drawn)} of {len(pairs)}"
    ax.set_title(f"brigade: {', '.join(kinds) or 'collectives'} over {n} ranks in ring order"
                 f"{note}", loc="left", fontsize=10)
    handles = [Patch(facecolor=blues(0.65), label="reduce-scatter\n(reduce, send on)"),
               Patch(facecolor=oranges(0.65), label="all-gather\n(copy, send on)"),
               Patch(facecolor="white", edgecolor="0.15", hatch="////", label="waiting"),
               Patch(facecolor="0.75", edgecolor="0.45", label="collective"),
               Line2D([0], [0], color="0.15", lw=0.8, marker=">", markersize=4,
                      label="slice handed\nto next rank"),
               Patch(facecolor="none", edgecolor="none", label="shade, cN: chunk")]
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
    ap.add_argument("-q", "--quiet", action="store_true", help="no summary")
    args = ap.parse_args(argv)
    try:
        ranks = load_all(args.files)
    except TraceError as e:
        fail(str(e))
    if args.merge:
        merge(ranks, args.merge)
    select(ranks, parse_seqs(args.seq, ranks) if args.seq else None)
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
