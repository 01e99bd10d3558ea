#!/usr/bin/env python3
"""Where a measured step's exposed all-to-all lies (Note [Exposed all-to-all] in
src/runtime/device_streams.h), from a `tandem train --trace` file of a GPU run.

For each rank: the stretches in which some dispatch or combine is in flight and no compute
stream runs a node (an "update" span of --defer-optimizer counts as compute; "wait" spans do
not), each put down to the all-to-all in flight and to the compute node that ends it, then
summed by the micro-batch phase of that all-to-all: the first forward (F0, alone in combined
1F1B unless --pair-first-forwards), the last backward, and everything between (the pairs).
With --defer-optimizer it also says how much of the update ran beside an all-to-all, and with
data parallelism how much of the gradient all-reduce ran beside the backward.

  python3 bench/exposed_gaps.py trace.json [--top N]

With one expert rank dispatch and combine only hand tensors over: the figures mean nothing there.
"""
import argparse
import collections
import json
import sys


def merge(intervals):
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def uncovered(a2a, compute):
    """Stretches of the merged a2a intervals that no merged compute interval covers."""
    gaps = []
    j = 0
    for b, e in a2a:
        at = b
        while j < len(compute) and compute[j][1] <= at:
            j += 1
        k = j
        while at < e:
            if k < len(compute) and compute[k][0] <= at:
                at = max(at, compute[k][1])
                k += 1
                continue
            nxt = compute[k][0] if k < len(compute) else e
            end = min(nxt, e)
            if end > at:
                gaps.append((at, end))
            at = end
    return gaps


def ranks_of(events):
    """{pid: {"name": ..., "tracks": {tid: name}, "spans": [(track, name, start, end)]}}"""
    ranks = collections.defaultdict(lambda: {"name": "", "tracks": {}, "spans": []})
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            ranks[e["pid"]]["name"] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            ranks[e["pid"]]["tracks"][e["tid"]] = e["args"]["name"]
    for e in events:
        if e.get("ph") != "X":
            continue
        r = ranks[e["pid"]]
        track = r["tracks"].get(e.get("tid"), str(e.get("tid")))
        r["spans"].append((track, e["name"], e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
    return ranks


def is_a2a(name):
    return name.split(" ")[-1] in ("dispatch", "combine") or name.endswith("dispatch counts")


def analyse(rank, top):
    spans = rank["spans"]
    a2a = [s for s in spans if s[0].startswith("comm") and is_a2a(s[1])]
    # An all-to-all run in order on the compute stream is exposed in full.
    a2a += [s for s in spans if s[0].startswith("compute") and is_a2a(s[1])]
    compute = [s for s in spans if s[0].startswith("compute") and not is_a2a(s[1])
               and not s[1].startswith("wait ")]
    if not a2a:
        return None
    busy = sum(e - b for _, _, b, e in a2a)
    gaps = uncovered(merge([(b, e) for _, _, b, e in a2a]),
                     merge([(b, e) for _, _, b, e in compute]))
    fwd_mbs = sorted({int(n[1:].split(" ")[0]) for _, n, _, _ in spans
                      if n[:1] == "F" and n[1:2].isdigit()})
    bwd_mbs = sorted({int(n[1:].split(" ")[0]) for _, n, _, _ in spans
                      if n[:1] == "B" and n[1:2].isdigit()})

    def phase(name):
        mb = int(name[1:].split(" ")[0]) if name[1:2].isdigit() else -1
        if name.startswith("F") and mb == (fwd_mbs[0] if fwd_mbs else -2):
            return "first forward"
        if name.startswith("B") and mb == (bwd_mbs[-1] if bwd_mbs else -2):
            return "last backward"
        return "pairs"

    by_phase = collections.Counter()
    by_a2a = collections.Counter()
    by_next = collections.Counter()
    rows = []
    starts = sorted((b, n) for _, n, b, _ in compute)
    for b, e in gaps:
        flying = [s for s in a2a if s[2] <= b and s[3] >= e]
        name = min(flying, key=lambda s: s[2])[1] if flying else "?"
        nxt = next((n for t, n in starts if t >= e - 1e-9), "end of step")
        by_phase[phase(name)] += e - b
        by_a2a[name] += e - b
        by_next[nxt] += e - b
        rows.append((e - b, b, name, nxt))
    exposed = sum(e - b for b, e in gaps)
    print(f"{rank['name']}: all-to-all {busy:.2f} ms, exposed {exposed:.2f} ms "
          f"({100 * exposed / busy:.1f}%)")
    updates = merge([(b, e) for t, n, b, e in spans if t.startswith("compute")
                     and n.startswith("update ")])
    if updates:  # --defer-optimizer: how much of the update ran beside an all-to-all
        total = sum(e - b for b, e in updates)
        alone = sum(e - b for b, e in uncovered(updates, merge([(b, e) for _, _, b, e in a2a])))
        print(f"  update {total:.2f} ms, {total - alone:.2f} ms of it beside an all-to-all")
    for p, ms in by_phase.most_common():
        print(f"  {p:14s} {ms:7.2f} ms")
    print("  largest stretches (ms, at ms, all-to-all in flight, the node that ends it):")
    for ms, at, name, nxt in sorted(rows, reverse=True)[:top]:
        print(f"    {ms:6.3f} at {at:8.2f}  {name:24s} -> {nxt}")
    print("  by all-to-all:", ", ".join(f"{n} {ms:.2f}" for n, ms in by_a2a.most_common(top)))
    return busy, exposed


def reduce_summary(rank):
    """The gradient all-reduces beside the backward (the reduce track,
    Note [Gradients reduced beside the backward]): their time, and how much of it ran after the
    last compute node."""
    spans = rank["spans"]
    reduces = merge([(b, e) for t, _, b, e in spans if t == "reduce"])
    if not reduces:
        return False
    end = max((e for t, n, b, e in spans if t.startswith("compute") and not n.startswith("wait ")),
              default=0.0)
    total = sum(e - b for b, e in reduces)
    tail = sum(e - max(b, end) for b, e in reduces if e > end)
    print(f"{rank['name']}: gradient all-reduce {total:.2f} ms on the reduce track, "
          f"{total - tail:.2f} ms beside the backward, {tail:.2f} ms after its last node")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=8, help="stretches and all-to-alls listed")
    args = ap.parse_args()
    with open(args.trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    found = False
    for pid, rank in sorted(ranks_of(events).items()):
        if "measured" not in rank["name"]:
            continue  # a planned timeline beside the measured one
        found = analyse(rank, args.top) is not None or found
        found = reduce_summary(rank) or found
    if not found:
        sys.exit(f"{args.trace}: no measured all-to-all or reduce spans (a GPU run with EP > 1, "
                 "or with data parallelism, writes them)")


if __name__ == "__main__":
    main()
