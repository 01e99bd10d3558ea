#!/usr/bin/env python3
"""Compares the per-iteration losses of tandem --log-json files against a reference file.

Usage: compare_losses.py REFERENCE.jsonl RUN.jsonl [RUN.jsonl ...]
Prints, per run, the largest relative loss difference over the iterations both files have, and
exits 1 when any exceeds --rtol (default 2e-2: bf16 activations in another reduction order).
"""
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                out[r["iter"]] = r["loss"]
    return out


def main(argv):
    rtol = 2e-2
    args = [a for a in argv if not a.startswith("--rtol=")]
    for a in argv:
        if a.startswith("--rtol="):
            rtol = float(a.split("=", 1)[1])
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    ref = losses(args[0])
    bad = False
    for path in args[1:]:
        try:
            run = losses(path)
        except OSError as e:
            print(f"{path}: {e}")
            bad = True
            continue
        common = sorted(set(ref) & set(run))
        if not common:
            print(f"{path}: no iterations in common with {args[0]}")
            bad = True
            continue
        worst = max(abs(run[i] - ref[i]) / abs(ref[i]) for i in common)
        ok = worst <= rtol
        bad |= not ok
        print(f"{path}: {len(common)} iterations, max relative loss difference {worst:.2e} "
              f"({'ok' if ok else 'over'} rtol {rtol})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
