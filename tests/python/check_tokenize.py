#!/usr/bin/env python3
"""`tandem convert` with a tokenizer against the tokenizer's own Python library, every id.

Builds at least 1 MB of real text from files every Debian/Ubuntu machine has (the licenses under
/usr/share/common-licenses, Python's LICENSE.txt, the docstrings of Python's standard library),
as a text file (one document per line) and a JSONL file (one paragraph per record, under the key
"body"). Then:
  - sentencepiece: the committed fixture model (tests/fixtures/tokenizers/spm.model) and a
    unigram model with NFKC normalization trained here by Python's sentencepiece; tandem's
    libsentencepiece ids against SentencePieceProcessor.encode;
  - Hugging Face tokenizers: a byte-level BPE tokenizer.json trained here by Python's tokenizers
    (saved to OUT/tokenizer.json, to commit as a fixture); tandem convert (which runs
    tools/hf_tokenize.py) against Tokenizer.encode.
The Megatron .bin/.idx pair tandem writes is read here from Megatron's index layout with Python's
struct and array modules (not tandem's reader). Each conversion prints its documents and ids
and OK or MISMATCH (with the first differing document); the exit status is 1 on any mismatch.

Usage: python3 tests/python/check_tokenize.py --tandem devrun/bin/tandem --work /tmp/tok --out OUT
"""
import argparse
import ast
import array
import glob
import json
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIN_BYTES = 1 << 20


def python_docstrings():
    """Docstrings of the standard library's modules, classes and functions."""
    stdlib = os.path.dirname(os.__file__)
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))) + sorted(
            glob.glob(os.path.join(stdlib, "*", "*.py"))):
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                try:
                    if doc:
                        doc.encode("utf-8")  # a lone surrogate (an escape in the source) is no text
                        yield doc
                except UnicodeEncodeError:
                    pass


def real_text():
    """Paragraphs of real English text and code comments, at least MIN_BYTES of them."""
    paragraphs = []
    sources = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(
        glob.glob("/usr/lib/python3*/LICENSE.txt"))
    for path in sources:
        if os.path.isfile(path):
            text = open(path, encoding="utf-8", errors="replace").read()
            paragraphs += [p for p in text.split("\n\n") if p.strip()]
    size = sum(len(p.encode()) for p in paragraphs)
    for doc in python_docstrings():
        if size >= MIN_BYTES * 3 // 2:
            break
        paragraphs.append(doc)
        size += len(doc.encode())
    return paragraphs, size


def read_megatron(prefix):
    """Documents of a Megatron pair, from the index layout of Megatron's _IndexWriter."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "not a Megatron index"
    version, code, seqs, docs = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    typecode = {1: "B", 8: "H", 4: "i"}[code]
    width = array.array(typecode).itemsize
    off = 9 + 8 + 1 + 8 + 8
    lengths = struct.unpack_from(f"<{seqs}i", idx, off)
    pointers = struct.unpack_from(f"<{seqs}q", idx, off + 4 * seqs)
    doc_idx = struct.unpack_from(f"<{docs}q", idx, off + 12 * seqs)
    tokens = array.array(typecode)
    tokens.frombytes(open(prefix + ".bin", "rb").read())
    out = []
    for d in range(docs - 1):
        ids = []
        for s in range(doc_idx[d], doc_idx[d + 1]):
            start = pointers[s] // width
            ids += tokens[start:start + lengths[s]].tolist()
        out.append(ids)
    return out


def compare(name, got, expected):
    ids = sum(len(e) for e in expected)
    if got == expected:
        print(f"{name}: {len(expected)} documents, {ids} ids: OK")
        return True
    first = next((d for d in range(min(len(got), len(expected))) if got[d] != expected[d]),
                 min(len(got), len(expected)))
    print(f"{name}: {len(expected)} documents, {ids} ids: MISMATCH: tandem wrote "
          f"{len(got)} documents; first difference in document {first}")
    if first < min(len(got), len(expected)):
        print(f"  tandem {got[first][:20]}\n  python {expected[first][:20]}")
    return False


def convert(tandem, args, env=None):
    r = subprocess.run([tandem, "convert"] + args, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(f"tandem convert {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    return r.returncode == 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    paragraphs, size = real_text()
    if size < MIN_BYTES:
        print(f"corpus: only {size} bytes of text found; the check needs {MIN_BYTES}")
        sys.exit(1)
    text_path = os.path.join(a.work, "corpus.txt")
    jsonl_path = os.path.join(a.work, "corpus.jsonl")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write("\n".join(paragraphs) + "\n")
    with open(jsonl_path, "w", encoding="utf-8") as f:
        for p in paragraphs:
            f.write(json.dumps({"id": len(p), "body": p}) + "\n")
    lines = [l for l in open(text_path, encoding="utf-8", newline="").read().split("\n")
             if l.strip(" \t\r")]
    print(f"corpus: {size} bytes of text, {len(paragraphs)} paragraphs, {len(lines)} non-blank "
          f"lines")
    ok = True

    import sentencepiece as spm
    trained = os.path.join(a.work, "nfkc")
    spm.SentencePieceTrainer.train(input=text_path, model_prefix=trained, vocab_size=8000,
                                   model_type="unigram", normalization_rule_name="nmt_nfkc",
                                   character_coverage=1.0, num_threads=4,
                                   hard_vocab_limit=False)
    for name, model in [("sentencepiece fixture (BPE, byte fallback)",
                         os.path.join(ROOT, "tests/fixtures/tokenizers/spm.model")),
                        ("sentencepiece trained here (unigram, NFKC)", trained + ".model")]:
        sp = spm.SentencePieceProcessor(model_file=model)
        prefix = os.path.join(a.work, "sp")
        if not convert(a.tandem, [text_path, prefix, "--tokenizer-model", model, "--append-eod"]):
            ok = False
            continue
        expected = [ids + [sp.eos_id()] for ids in (sp.encode(l) for l in lines) if ids]
        ok &= compare(name + ", text lines", read_megatron(prefix), expected)
        if not convert(a.tandem, [jsonl_path, prefix, "--tokenizer-model", model,
                                  "--json-keys", "body"]):
            ok = False
            continue
        expected = [ids for ids in (sp.encode(p) for p in paragraphs) if ids]
        ok &= compare(name + ", JSONL records", read_megatron(prefix), expected)

    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([text_path], trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    tok_path = os.path.join(a.out, "tokenizer.json")
    tok.save(tok_path)
    eod = tok.token_to_id("<|endoftext|>")
    env = dict(os.environ, TANDEM_HF_TOKENIZE=os.path.join(ROOT, "tools/hf_tokenize.py"))
    prefix = os.path.join(a.work, "hf")
    name = "tokenizers trained here (byte-level BPE)"
    if convert(a.tandem, [text_path, prefix, "--tokenizer-model", tok_path, "--append-eod"], env):
        expected = [e.ids + [eod] for e in tok.encode_batch(lines) if e.ids]
        ok &= compare(name + ", text lines", read_megatron(prefix), expected)
    else:
        ok = False
    if convert(a.tandem, [jsonl_path, prefix, "--tokenizer-model", tok_path, "--json-keys",
                          "body"], env):
        expected = [e.ids for e in tok.encode_batch(paragraphs) if e.ids]
        ok &= compare(name + ", JSONL records", read_megatron(prefix), expected)
    else:
        ok = False
    shutil.copy(os.path.join(ROOT, "tests/fixtures/tokenizers/sample.txt"), a.out)
    print("tok: OK" if ok else "tok: MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
