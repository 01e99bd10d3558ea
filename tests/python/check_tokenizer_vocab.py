#!/usr/bin/env python3
"""`tandem train --tokenizer-type T --tokenizer-model M` against Megatron-LM's figures, computed here
with the tokenizers' own Python libraries: the vocabulary's size and end-of-document id (Note
[Megatron-LM's tokenizer vocabulary] in src/data/tokenizer.h).

  - HuggingFaceTokenizer: a byte-level BPE tokenizer.json trained here by Python's tokenizers, with
    added special tokens (one of them already in the vocabulary), saved through transformers'
    PreTrainedTokenizerFast.save_pretrained with an eos_token; Megatron-LM's figures are
    len(AutoTokenizer.from_pretrained(dir)) and its eos_token_id.
  - GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer: the committed fixture
    model; the figures from SentencePieceProcessor as Megatron-LM's classes form them.
tandem prints its figures in the message that refuses a --vocab-size of 1 ("(N tokens, M rows
padded, end-of-document id E)"). Prints OK or MISMATCH per case; exit status 1 on any mismatch.

Usage: python3 tests/python/check_tokenizer_vocab.py --tandem devrun/bin/tandem --work /tmp/vocab
"""
import argparse
import os
import re
import subprocess
import sys


def tandem_figures(tandem, kind, model):
    r = subprocess.run([tandem, "train", "--tokenizer-type", kind, "--tokenizer-model", model,
                        "--vocab-size", "1", "--mock-data", "--train-iters", "1"],
                       capture_output=True, text=True)
    m = re.search(r"\((\d+) tokens, \d+ rows padded, end-of-document id (-?\d+)\)", r.stderr)
    if not m:
        return None, r.stderr.strip()[-400:]
    return (int(m.group(1)), int(m.group(2))), ""


def sentencepiece_figures(kind, path):
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    n = sp.get_piece_size()
    if kind != "SentencePieceTokenizer":
        return n, sp.eos_id()
    vocab = {sp.id_to_piece(i): i for i in range(n)}

    def add(t):
        if t not in vocab:
            vocab[t] = len(vocab)
        return vocab[t]

    def named(i, fallback):
        return sp.id_to_piece(i) if 0 <= i < n else fallback

    add("<CLS>")
    add("<SEP>")
    eod = add("<EOD>")
    add("<MASK>")
    for i, fallback in ((sp.pad_id(), "<PAD>"), (sp.bos_id(), "<BOS>"), (sp.eos_id(), "<EOS>")):
        add(named(i, fallback))
    return len(vocab), eod


def hf_tokenizer(work):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    corpus = []
    for root in ("/usr/share/common-licenses",):
        for name in sorted(os.listdir(root)):
            p = os.path.join(root, name)
            if os.path.isfile(p):
                corpus += open(p, errors="replace").read().splitlines()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus or ["hello world"] * 100,
                            trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"]))
    tok.add_special_tokens(["<|begin|>", "<|end|>", "<|endoftext|>"])
    d = os.path.join(work, "hf")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>",
                            bos_token="<|begin|>").save_pretrained(d)
    auto = AutoTokenizer.from_pretrained(d)
    return d, (len(auto), auto.eos_token_id)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--spm", default=os.path.join(os.path.dirname(__file__),
                                                  "../fixtures/tokenizers/spm.model"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    cases = []
    for kind in ("GPTSentencePieceTokenizer", "Llama2Tokenizer", "SentencePieceTokenizer"):
        cases.append((kind, a.spm, sentencepiece_figures(kind, a.spm)))
    d, want = hf_tokenizer(a.work)
    cases.append(("HuggingFaceTokenizer", d, want))
    bad = 0
    for kind, model, want in cases:
        got, err = tandem_figures(a.tandem, kind, model)
        ok = got == tuple(want)
        bad += not ok
        print(f"{kind}: Megatron-LM's (vocabulary, eod) {tuple(want)}, tandem's {got} "
              f"{'OK' if ok else 'MISMATCH ' + err}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
