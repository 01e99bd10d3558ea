#!/usr/bin/env python3
"""Loads a tandem checkpoint in Hugging Face transformers and checks its loss against tandem's.

Not run in CI (it needs torch and transformers). The oracle is transformers' own model code, in
fp32: the class config.json names (docs/model.md "Families"), built by AutoModelForCausalLM.

    build/tandem train --train-iters 50 --save run/ckpt
    python3 -c "print(' '.join(str(b) for b in b'12+34=64\\n'))" > tokens.txt   # or any ids
    build/tandem generate --load run/ckpt --eval-tokens tokens.txt   # prints "loss: X ..."
    python3 tests/python/check_hf_load.py run/ckpt tokens.txt X

tokens.txt holds one sequence per line (token ids separated by white space, every line the same
length): the batch. The loss is the mean next-token cross-entropy over every row and position,
which is what transformers returns with labels = input ids (the router aux loss is left out,
as transformers does unless output_router_logits is set). Exit status: 0 when the two losses
agree within --rtol (default 1e-4, relative), 1 when they do not, 2 on bad input.
"""

import argparse
import json
import math
import os
import sys


def fail(message):
    """Bad input: the message on stderr, exit status 2."""
    print(f"check_hf_load: {message}", file=sys.stderr)
    sys.exit(2)


def resolve_checkpoint(path):
    """A --save directory resolves to the iteration directory its `latest` names."""
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip())
    return path


def read_tokens(path):
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split()
            if not words:
                continue
            try:
                rows.append([int(w) for w in words])
            except ValueError:
                fail(f"{path} line {number}: not a list of integer token ids")
            if len(rows[-1]) < 2 or len(rows[-1]) != len(rows[0]):
                fail(f"{path} line {number} has {len(rows[-1])} tokens; every line needs the "
                     f"same length (the first has {len(rows[0])}), at least 2")
    if not rows:
        fail(f"{path} holds no token ids")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a tandem --save directory or one iter_NNNNNNN directory")
    parser.add_argument("tokens", help="token ids, one sequence per line")
    parser.add_argument("tandem_loss", type=float,
                        help="the loss `tandem generate --eval-tokens` printed for the same file")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (1e-4)")
    args = parser.parse_args()

    directory = resolve_checkpoint(args.checkpoint)
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        fail(f"{directory} has no config.json: give a tandem --save or iter_NNNNNNN directory")
    with open(config_path) as f:
        config = json.load(f)
    names = config.get("architectures") or []
    if len(names) != 1:
        fail(f"{config_path} names {names!r} as architectures; expected one class")
    expected = names[0]
    if not os.path.isfile(args.tokens):
        fail(f"{args.tokens}: no such file")
    rows = read_tokens(args.tokens)
    vocab = config["vocab_size"]
    if any(not 0 <= t < vocab for row in rows for t in row):
        fail(f"{args.tokens} has token ids outside [0, {vocab}) (the model's vocab_size)")

    import torch  # only now: bad input is reported without them
    from transformers import AutoModelForCausalLM

    try:  # the reference attention, not a fused kernel
        model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32,
                                                     attn_implementation="eager")
    except TypeError:  # transformers before 4.36
        model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)
    if type(model).__name__ != expected:
        print(f"check_hf_load: transformers built {type(model).__name__}, expected {expected}")
        return 1
    model.config.output_router_logits = False
    model.eval()
    ids = torch.tensor(rows, dtype=torch.long)
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)

    rel = abs(loss - args.tandem_loss) / max(abs(args.tandem_loss), 1e-30)
    ok = math.isfinite(loss) and rel <= args.rtol
    print(f"{expected} from {directory}: transformers loss {loss:.9f}, tandem loss "
          f"{args.tandem_loss:.9f}, relative difference {rel:.3e} "
          f"({'within' if ok else 'OUTSIDE'} {args.rtol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
