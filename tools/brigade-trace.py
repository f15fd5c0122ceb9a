#!/usr/bin/python3
"""brigade-trace: merge, summarize and draw the traces of a brigade job.

    brigade-trace trace.*.json                   summary table
    brigade-trace trace.*.json -o timeline.png   and timeline.png + timeline.svg
    brigade-trace trace.*.json --merge out.json  and one file for Perfetto

The inputs are the per-rank files BRIGADE_TRACE_FILE=trace.%r.json writes
(Chrome trace event JSON). Their timestamps are already on one clock (the
rank at ring position 0's), so merging is a concatenation. The summary says,
per rank, how long it worked and how long it waited and for whom: "waits on"
is the neighbour it waited for, "stalled by" follows that neighbour's own
waits around the ring to the rank that was really late ("self" when the
chain comes back round: no rank was working, the data was on its way or
the ranks were not scheduled). Then per link the
bytes, the achieved bandwidth and the waits, and the slowest link.

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
        self.waits = []   # (t0, t1, peer, for)


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
            r.waits.append((t0, t1, a["peer"], a["for"]))
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


# ------------------------------------------------------------------ summary

def blame(ranks_by_id, peer, a, b, depth, acc):
    """Charges [a, b) of someone's wait for `peer`: the parts during which
    peer itself waited go on to whom it waited for, the rest to peer."""
    r = ranks_by_id.get(peer)
    covered = 0.0
    if r is not None and depth < len(ranks_by_id):
        starts = r.wait_starts
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(r.waits) and r.waits[i][0] < b:
            lo, hi = max(a, r.waits[i][0]), min(b, r.waits[i][1])
            if hi > lo:
                blame(ranks_by_id, r.waits[i][2], lo, hi, depth + 1, acc)
                covered += hi - lo
            i += 1
    acc[peer] = acc.get(peer, 0.0) + (b - a) - covered


def summarize(ranks, show=True):
    by_id = {r.rank: r for r in ranks}
    for r in ranks:
        r.wait_starts = [w[0] for w in r.waits]
    rows = []
    stalled_others = {}
    for r in ranks:
        coll = sum(c[1] - c[0] for c in r.colls)
        busy = sum(s[1] - s[0] for s in r.slices)
        wait = sum(w[1] - w[0] for w in r.waits)
        direct, root = {}, {}
        for t0, t1, peer, _ in r.waits:
            direct[peer] = direct.get(peer, 0.0) + t1 - t0
            blame(by_id, peer, t0, t1, 1, root)
        for p, t in root.items():
            if p != r.rank:
                stalled_others[p] = stalled_others.get(p, 0.0) + t
        rows.append((r, coll, busy - wait, wait, direct, root))

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
          f"{ncoll} collective(s); times in ms")
    print(f"{'rank':>4} {'host':<12} {'in coll':>9} {'working':>9} {'waiting':>9} {'wait%':>6}"
          f"  {'waits on (rank: ms)':<24} stalled by (rank: ms)")
    for r, coll, work, wait, direct, root in rows:
        pct = 100.0 * wait / coll if coll > 0 else 0.0
        print(f"{r.rank:>4} {r.host[:12]:<12} {coll / 1000:>9.3f} {work / 1000:>9.3f} "
              f"{wait / 1000:>9.3f} {pct:>5.1f}%  {who(direct, -1):<24} {who(root, r.rank)}")
    if stalled_others:
        worst = max(stalled_others.items(), key=lambda kv: kv[1])
        total_wait = sum(row[3] for row in rows)
        if worst[1] >= 1.0:
            share = 100.0 * worst[1] / total_wait if total_wait > 0 else 0.0
            print(f"most waited for: rank {worst[0]} (the others waited {worst[1] / 1000:.3f} ms "
                  f"for it, {share:.0f}% of all waiting)")

    # Links: bytes the receiver took from each sender, over the time the
    # receiver spent on those slices, less its waits for the next rank.
    links = {}
    for r in ranks:
        for t0, t1, a in r.slices:
            if a["recv_from"] < 0:
                continue
            key = (a["recv_from"], r.rank)
            l = links.setdefault(key, [0, 0.0, 0.0, 0.0])
            l[0] += a["bytes"]
            l[1] += max((t1 - t0) - a["wait_send_us"], 0.0)
            l[2] += a["wait_recv_us"]
        for t0, t1, peer, what in r.waits:
            if what == "free slot":
                l = links.setdefault((r.rank, peer), [0, 0.0, 0.0, 0.0])
                l[3] += t1 - t0
    if links:
        print(f"{'link':>8} {'MB':>10} {'ms':>9} {'GB/s':>8} {'recv waits':>11} "
              f"{'slot waits':>11}")
        for (src, dst), (nbytes, t, wr, ws) in sorted(links.items()):
            bw = nbytes / (t * 1e3) if t > 0 else float("inf")
            print(f"{src:>3} -> {dst:<2} {nbytes / 1e6:>10.3f} {t / 1000:>9.3f} {bw:>8.3f} "
                  f"{wr / 1000:>11.3f} {ws / 1000:>11.3f}")
        moving = {k: v for k, v in links.items() if v[0] > 0 and v[1] > 0}
        if moving:
            (src, dst), l = min(moving.items(), key=lambda kv: kv[1][0] / kv[1][1])
            print(f"slowest link: {src} -> {dst} ({l[0] / (l[1] * 1e3):.3f} GB/s, receiver "
                  f"waited {l[2] / 1000:.3f} ms for data)")
    return rows, stalled_others


# ------------------------------------------------------------------ drawing

def draw(ranks, out, stalled):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
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
    n = len(ranks)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.55 * n))
    cmap = plt.get_cmap("tab10")
    chunks = set()
    # One collection per kind of span and rank: thousands of slices draw in
    # a second, where a patch each takes minutes.
    for row, r in enumerate(ranks):
        y = n - 1 - row
        if r.colls:
            ax.broken_barh([((c0 - t0) / scale, (c1 - c0) / scale) for c0, c1, _, _ in r.colls],
                           (y + 0.30, 0.12), facecolors="0.8", edgecolors="0.45",
                           linewidth=0.5)
        if r.slices:
            chunks.update(a["chunk"] for _, _, a in r.slices)
            ax.broken_barh([((s0 - t0) / scale, (s1 - s0) / scale) for s0, s1, _ in r.slices],
                           (y - 0.35, 0.62),
                           facecolors=[cmap(a["chunk"] % 10) for _, _, a in r.slices],
                           edgecolors="none")
        if r.waits:
            ax.broken_barh([((w0 - t0) / scale, (w1 - w0) / scale) for w0, w1, _, _ in r.waits],
                           (y - 0.35, 0.62), facecolors="white", edgecolors="0.3",
                           hatch="////", linewidth=0)
    ax.set_xlim(0, span / scale * 1.01)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r.rank}\n{r.host[:12]}" for r in reversed(ranks)])
    # The rank the others waited for most, if that is a good part of the
    # time, in red with the figure.
    if stalled:
        worst, t = max(stalled.items(), key=lambda kv: kv[1])
        total = sum(c[1] - c[0] for r in ranks for c in r.colls)
        if worst in [r.rank for r in ranks] and total > 0 and t >= 0.1 * total:
            row = [r.rank for r in ranks].index(worst)
            ax.get_yticklabels()[n - 1 - row].set_color("red")
            ax.set_title(f"others waited {t / 1000:.2f} ms for rank {worst}", loc="right",
                         color="red", fontsize=9)
    ax.set_xlabel(f"time ({unit}) from the first span")
    kinds = sorted({c[2]["kind"] for r in ranks for c in r.colls})
    ax.set_title(f"brigade: {', '.join(kinds) or 'collectives'} over {n} ranks "
                 f"(grey bar: collective; colour: chunk; hatched: waiting)", loc="left",
                 fontsize=10)
    handles = [Patch(facecolor=cmap(c % 10), label=f"chunk {c}") for c in sorted(chunks)[:10]]
    handles.append(Patch(facecolor="white", edgecolor="0.15", hatch="////", label="waiting"))
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
