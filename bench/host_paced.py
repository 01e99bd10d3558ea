#!/usr/bin/env python3
"""The host's issuing time beside the GPU's time per node kind, from a `tandem train --trace`
file of a GPU run (docs/parallel.md, "Measured timeline and exposed all-to-all").

The trace's compute thread holds each node's GPU span (between events the host records as it
starts and ends issuing the node), its host thread the host's issuing of the node. Per node kind
(micro-batch and layer dropped): how often it ran, its GPU and host milliseconds in all and for
each. Issuing a node takes the host a few microseconds a launch; a node whose host time is far
above that (the experts' forward at 0.6-0.9 ms for six launches, say) waits for the GPU
somewhere inside, and where the GPU has nothing else queued (right after the routing counts are
read, Note [Routing counts on the host] in src/model/nodes.h) that wait is the GPU's idle time.
Nodes that read values back (dispatch) wait by design. The two clocks are not aligned: compare
durations, not start times.

  python3 bench/host_paced.py trace.json [--rank R]
"""
import argparse
import collections
import json
import re


def kind_of(name):
    """'F3 experts' -> 'F experts' (the micro-batch dropped)."""
    m = re.match(r"^\d*([A-Z]+)\d+\s*(.*)$", name)
    return f"{m.group(1)} {m.group(2)}".strip() if m else name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] == args.rank}
    gpu, host, count = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") != "X" or e["pid"] != args.rank:
            continue
        track, kind, ms = tracks.get(e["tid"]), kind_of(e["name"]), e["dur"] / 1e3
        if track == "compute" and not e["name"].startswith("wait"):
            gpu[kind] += ms
            count[kind] += 1
        elif track == "host":
            host[kind] += ms
    if not host:
        raise SystemExit(f"{args.trace}: rank {args.rank} has no host spans (a CPU run?)")
    print(f"{'node':24s} {'count':>5s} {'GPU ms':>8s} {'host ms':>8s} {'GPU/each':>8s} {'host/each':>9s}")
    for k in sorted(count, key=lambda k: -host[k]):
        c = count[k]
        print(f"{k:24s} {c:5d} {gpu[k]:8.2f} {host[k]:8.2f} {gpu[k] / c:8.3f} {host[k] / c:9.3f}")
    print(f"all nodes: GPU {sum(gpu.values()):.2f} ms, host {sum(host.values()):.2f} ms")


if __name__ == "__main__":
    main()
