#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel durations (ncu --csv --metrics gpu__time_duration.sum) by
kernel name: total ms, launches, share. The bf16 rate probe's large product is listed too."""
import csv
import sys
from collections import defaultdict

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name_i, metric_i, value_i = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
total = defaultdict(float)
count = defaultdict(int)
for r in rows[1:]:
    if r[metric_i] != "gpu__time_duration.sum":
        continue
    v = float(r[value_i].replace(",", ""))
    unit = r[head.index("Metric Unit")] if "Metric Unit" in head else "nsecond"
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit, 1e-6)
    k = r[name_i][:110]
    total[k] += v * scale
    count[k] += 1
grand = sum(total.values())
print(f"total {grand:.2f} ms over {sum(count.values())} launches")
for k, v in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{v:9.3f} ms {count[k]:6d}x {100 * v / grand:5.1f}%  {k}")
