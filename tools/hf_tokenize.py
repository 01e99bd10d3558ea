#!/usr/bin/env python3
"""Token ids of a text or JSONL file under a Hugging Face tokenizer.json, for `tandem convert`.

Usage: python3 tools/hf_tokenize.py TOKENIZER_JSON INPUT [--json-keys KEY] > IDS

`tandem convert INPUT OUTPUT --tokenizer-model tokenizer.json` runs this script and turns what it
prints into the Megatron pair OUTPUT.bin/OUTPUT.idx; `tandem convert IDS OUTPUT` does the same with
its saved output. Documents are split as tandem splits them
(Note [Documents of a file] in src/data/tokenizer.h): one per line of a text file, one JSON object per line of a .json/.jsonl
file (the string under KEY, default "text"); blank lines are no document. Each document is encoded
with Tokenizer.encode(text) (the tokenizer's post-processor included, as transformers'
tokenizer(text) does).

Output: the line "tandem-ids vocab_size=N eod_id=E" (E: the id of the tokenizer's end-of-text token,
the first of EOD_TOKENS it has, special tokens first; -1 if it has none), then one line of
space-separated ids per document.
Exit status 2 on bad input (the message names the file and line), 3 when the tokenizers package
is missing.
"""
import argparse
import json
import sys

# End-of-text tokens of common tokenizers, in the order they are looked for.
EOD_TOKENS = ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>", "[SEP]"]


def end_of_text_id(tok):
    """The first of EOD_TOKENS that the tokenizer has as a special token, else in its vocabulary."""
    decoder = getattr(tok, "get_added_tokens_decoder", lambda: {})()
    special = {t.content for t in decoder.values() if getattr(t, "special", False)}
    for pool in (special, None):
        for t in EOD_TOKENS:
            if (pool is None or t in pool) and tok.token_to_id(t) is not None:
                return tok.token_to_id(t)
    return -1


def documents(path, key):
    """(line number, text) of each document, as src/data/tokenizer.cc reads them."""
    jsonl = path.endswith(".json") or path.endswith(".jsonl")
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        if raw.strip(b" \t\r") == b"":
            continue
        text = raw.decode("utf-8")
        if not jsonl:
            yield number, text
            continue
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            sys.exit(f"{path} line {number}: not a JSON object")
        if not isinstance(record.get(key), str):
            sys.exit(f"{path} line {number}: the object has no string under the key '{key}'")
        yield number, record[key]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer", help="a Hugging Face tokenizer.json")
    parser.add_argument("input", help="a text file, or a .json/.jsonl file")
    parser.add_argument("--json-keys", default="text", help="the key of the text in a JSON record")
    args = parser.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("hf_tokenize.py: Python's tokenizers package is missing (pip install tokenizers)",
              file=sys.stderr)
        sys.exit(3)
    try:
        tok = Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # the library raises its own exception types
        print(f"hf_tokenize.py: {args.tokenizer}: not a tokenizer.json ({e})", file=sys.stderr)
        sys.exit(2)
    eod = end_of_text_id(tok)
    out = sys.stdout
    out.write(f"tandem-ids vocab_size={tok.get_vocab_size()} eod_id={eod}\n")
    batch = []

    def flush():
        for enc in tok.encode_batch(batch):
            out.write(" ".join(map(str, enc.ids)) + "\n")
        batch.clear()

    try:
        for _, text in documents(args.input, args.json_keys):
            batch.append(text)
            if len(batch) == 1000:
                flush()
        flush()
    except UnicodeDecodeError as e:
        print(f"hf_tokenize.py: {args.input}: not UTF-8 text ({e})", file=sys.stderr)
        sys.exit(2)
    except SystemExit as e:
        print(f"hf_tokenize.py: {e.code}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
