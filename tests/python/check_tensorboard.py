#!/usr/bin/env python3
"""Reads the event files `tandem train --tensorboard-dir DIR` wrote with TensorBoard's own reader.

Not run in CI (it needs the tensorboard package). The oracle is TensorBoard's EventAccumulator,
the loader behind its scalar dashboard: every file events.out.tfevents.* in DIR is read as
TensorBoard would read it. Prints each scalar tag with its number of points and its first and
last (step, value), then checks:
  - every step's tags are there (train/loss, train/lm_loss, train/aux_loss, train/lr,
    train/grad_norm, train/tokens_per_s, memory/in_use_bytes, memory/peak_bytes), with --steps
    points each when given;
  - with --valid-steps N, valid/loss and valid/ppl have N points and ppl = exp(loss);
  - with --alltoall, alltoall/busy_s and alltoall/exposed_s are there (expert parallelism);
  - with --log-json FILE (the run's --log-json), each step's train/loss and each validation's
    valid/loss equal the JSON's values as float32.

    build/tandem train --device cuda --train-iters 20 --log-interval 5 --eval-interval 10 \\
        --eval-iters 2 --tensorboard-dir tb-run --log-json tb-run.jsonl
    python3 tests/python/check_tensorboard.py tb-run --steps 20 --valid-steps 2 \\
        --log-json tb-run.jsonl

Exit status: 0 when every check holds, 1 when one does not, 2 on bad input.
"""

import argparse
import glob
import json
import math
import os
import struct
import sys

STEP_TAGS = [
    "train/loss", "train/lm_loss", "train/aux_loss", "train/lr", "train/grad_norm",
    "train/tokens_per_s", "memory/in_use_bytes", "memory/peak_bytes",
]


def fail(message):
    """Bad input: the message on stderr, exit status 2."""
    print(f"check_tensorboard: {message}", file=sys.stderr)
    sys.exit(2)


def as_float32(x):
    """x rounded to float32, as the event files store scalars."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", help="the --tensorboard-dir of a run")
    parser.add_argument("--steps", type=int, help="the points each step tag must have")
    parser.add_argument("--valid-steps", type=int, help="the validations the run made")
    parser.add_argument("--alltoall", action="store_true", help="expect the all-to-all tags")
    parser.add_argument("--log-json", help="the run's --log-json file, to compare values with")
    args = parser.parse_args()
    if not os.path.isdir(args.dir):
        fail(f"{args.dir} is not a directory")
    files = sorted(glob.glob(os.path.join(args.dir, "events.out.tfevents.*")))
    if not files:
        fail(f"{args.dir} holds no events.out.tfevents.* file")
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        fail(f"cannot import tensorboard ({e}); pip install tensorboard")

    acc = EventAccumulator(args.dir, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    tags = acc.Tags()["scalars"]
    scalars = {tag: acc.Scalars(tag) for tag in tags}
    print(f"{len(files)} event file(s) in {args.dir}: {', '.join(os.path.basename(f) for f in files)}")
    for tag in sorted(scalars):
        points = scalars[tag]
        print(f"  {tag:24s} {len(points):6d} points, first (step {points[0].step}, "
              f"{points[0].value:.6g}), last (step {points[-1].step}, {points[-1].value:.6g})")

    problems = []
    for tag in STEP_TAGS:
        if tag not in scalars:
            problems.append(f"tag {tag} is missing")
        elif args.steps is not None and len(scalars[tag]) != args.steps:
            problems.append(f"tag {tag} has {len(scalars[tag])} points, expected {args.steps}")
    if args.alltoall:
        for tag in ("alltoall/busy_s", "alltoall/exposed_s"):
            if tag not in scalars:
                problems.append(f"tag {tag} is missing")
    if args.valid_steps is not None:
        for tag in ("valid/loss", "valid/ppl"):
            count = len(scalars.get(tag, []))
            if count != args.valid_steps:
                problems.append(f"tag {tag} has {count} points, expected {args.valid_steps}")
        loss = {p.step: p.value for p in scalars.get("valid/loss", [])}
        for p in scalars.get("valid/ppl", []):
            if p.step in loss and not math.isclose(p.value, math.exp(loss[p.step]), rel_tol=1e-5):
                problems.append(f"valid/ppl at step {p.step} is {p.value}, "
                                f"not exp(valid/loss) = {math.exp(loss[p.step])}")

    if args.log_json:
        try:
            with open(args.log_json) as f:
                lines = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as e:
            fail(f"--log-json {args.log_json}: {e}")
        train = {p.step: p.value for p in scalars.get("train/loss", [])}
        valid = {p.step: p.value for p in scalars.get("valid/loss", [])}
        for line in lines:
            step = line["iter"]
            if line.get("loss") is not None and train.get(step) != as_float32(line["loss"]):
                problems.append(f"train/loss at step {step} is {train.get(step)}, "
                                f"the log says {line['loss']}")
            if "valid_loss" in line and valid.get(step) != as_float32(line["valid_loss"]):
                problems.append(f"valid/loss at step {step} is {valid.get(step)}, "
                                f"the log says {line['valid_loss']}")

    for p in problems:
        print(f"check_tensorboard: FAIL: {p}")
    if problems:
        sys.exit(1)
    print("check_tensorboard: OK")


if __name__ == "__main__":
    main()
