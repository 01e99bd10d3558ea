#!/usr/bin/env python3
"""Writes tests/fixtures/hf: small models of every family tandem reads, saved by transformers.

Each fixture is a directory that transformers' own save_pretrained wrote (config.json and
model.safetensors, as the installed version writes them), with weights drawn wide enough that a
misread changes the loss (unit-gain matrices, norm gains and biases away from their init), plus:

  tokens.txt          one window of token ids (one row a line)
  expected.json       transformers' fp32 loss on that window (eager attention), the version that
                      wrote it, and the loss of the transformers-4.x form of the same model
  config.v4.json      the same model's config as transformers 4.x writes it (rope_theta at the top,
                      rope_scaling beside it), read back by this transformers to the same loss
  model.v4.safetensors  the weights under 4.x names, where they differ from what was saved
  expected.safetensors  transformers' hidden states after each layer and logits (for debugging)

Run where torch and transformers are installed (the GPU machine has both):
    python3 tools/hf_fixtures.py OUTDIR [--only NAME,...]
The fixtures are committed so that every CI run checks tandem's loading on the CPU
(tests/model/test_hf_families.cc).
"""

import argparse
import inspect
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

VOCAB = 128
WINDOW = 128

COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=WINDOW, rms_norm_eps=1e-6, tie_word_embeddings=False)


def rope(cls, theta, **scaling):
    """The RoPE settings in the form the config class takes: rope_parameters (5.x) or
    rope_theta + rope_scaling (4.x)."""
    params = inspect.signature(cls.__init__).parameters
    if "rope_parameters" in params:
        rp = {"rope_type": scaling.pop("rope_type", "default"), "rope_theta": theta}
        rp.update(scaling)
        return {"rope_parameters": rp}
    out = {"rope_theta": theta}
    if scaling:
        out["rope_scaling"] = scaling
    return out


def families():
    C = transformers
    llama3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=256)
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32, beta_fast=32.0,
                beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    q3 = dict(COMMON, num_hidden_layers=2, head_dim=16, intermediate_size=48,
              moe_intermediate_size=24, num_experts=16, num_experts_per_tok=4,
              decoder_sparse_step=1, mlp_only_layers=[])
    ds = dict(COMMON, num_hidden_layers=3, num_key_value_heads=4, intermediate_size=64,
              moe_intermediate_size=24, n_shared_experts=1, n_routed_experts=8,
              num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
              kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16,
              v_head_dim=12, first_k_dense_replace=1, norm_topk_prob=True)
    L = C.LlamaConfig
    M = C.MixtralConfig
    Q3 = C.Qwen3MoeConfig
    Q2 = C.Qwen2MoeConfig
    D = C.DeepseekV3Config
    return {
        "llama": (L, dict(COMMON, num_hidden_layers=2, intermediate_size=48, **rope(L, 50000.0))),
        "llama3_rope": (L, dict(COMMON, num_hidden_layers=2, intermediate_size=48, head_dim=16,
                                **rope(L, 10000.0, **llama3))),
        "mixtral_top1": (M, dict(COMMON, num_hidden_layers=2, intermediate_size=24,
                                 num_local_experts=4, num_experts_per_tok=1,
                                 **rope(M, 10000.0))),
        "mixtral_top2": (M, dict(COMMON, num_hidden_layers=2, intermediate_size=24,
                                 num_local_experts=8, num_experts_per_tok=2,
                                 **rope(M, 1e6))),
        "qwen3_moe": (Q3, dict(q3, norm_topk_prob=True, **rope(Q3, 1e6))),
        "qwen3_moe_nonorm": (Q3, dict(q3, norm_topk_prob=False, **rope(Q3, 1e6))),
        "qwen3_moe_dense": (Q3, dict(q3, num_hidden_layers=4, norm_topk_prob=True,
                                     mlp_only_layers=[0, 2], **rope(Q3, 1e6))),
        "qwen2_moe": (Q2, dict(COMMON, num_hidden_layers=3, intermediate_size=48,
                               moe_intermediate_size=24, shared_expert_intermediate_size=40,
                               num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                               decoder_sparse_step=2, mlp_only_layers=[], **rope(Q2, 1e6))),
        "deepseek_v3": (D, dict(ds, **rope(D, 10000.0))),
        "deepseek_v3_noq": (D, dict(ds, q_lora_rank=None, **rope(D, 10000.0))),
        "deepseek_v3_yarn": (D, dict(ds, **rope(D, 10000.0, **yarn))),
    }


def widen(model, seed):
    """Draws every weight wide: unit-gain matrices, gains near 1, biases and the expert score
    bias of the order of the values they shift."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        for name, p in tensors:
            if not p.is_floating_point() or "rotary" in name or "inv_freq" in name:
                continue
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.ndim == 1 and "norm" in name:
                p.copy_(1 + 0.3 * r)
            elif p.ndim == 1:
                p.copy_((0.2 if "correction_bias" in name else 0.5) * r)
            elif "embed_tokens" in name:
                p.copy_(r)
            else:
                p.copy_(r / math.sqrt(p.shape[-1]) * (2.0 if "lm_head" in name else 1.0))


def v4_config(cfg):
    """The 4.x form of a 5.x config dict: rope_theta at the top, the rest as rope_scaling
    (null for plain RoPE; DeepSeek-V3's yarn under the old key "type", as its hub config)."""
    c = dict(cfg)
    rp = c.pop("rope_parameters", None)
    if rp is not None:
        rp = dict(rp)
        c["rope_theta"] = rp.pop("rope_theta")
        kind = rp.pop("rope_type", "default")
        if kind == "default" and not {k for k in rp if k != "partial_rotary_factor"}:
            c["rope_scaling"] = None
            if "partial_rotary_factor" in rp:
                c["partial_rotary_factor"] = rp["partial_rotary_factor"]
        else:
            rp["type" if c.get("model_type") == "deepseek_v3" else "rope_type"] = kind
            c["rope_scaling"] = rp
    c["transformers_version"] = "4.57.1"
    return c


def v4_weights(state, model_type):
    """4.x weight names where the saved ones differ: one matrix per expert (gate, up, down as
    [out, in]) instead of stacked experts; Mixtral's block_sparse_moe and w1/w3/w2."""
    out, changed = {}, False
    for name, t in state.items():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            changed = True
            prefix = name.rsplit(".", 1)[0]
            for e in range(t.shape[0]):
                m = t[e]
                if name.endswith("gate_up_proj"):
                    f = m.shape[0] // 2
                    out[f"{prefix}.{e}.gate_proj.weight"] = m[:f].contiguous()
                    out[f"{prefix}.{e}.up_proj.weight"] = m[f:].contiguous()
                else:
                    out[f"{prefix}.{e}.down_proj.weight"] = m.contiguous()
        else:
            out[name] = t
    if model_type == "mixtral":
        renamed = {}
        for name, t in out.items():
            n = name.replace(".mlp.", ".block_sparse_moe.")
            n = n.replace(".gate_proj.", ".w1.").replace(".up_proj.", ".w3.")
            n = n.replace(".down_proj.", ".w2.")
            changed |= n != name
            renamed[n] = t
        out = renamed
    return out if changed else None


def loss_of(directory, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids, output_hidden_states=True)
    return model, out


def write(name, cls, kwargs, root, log):
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(0)
    config = cls(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    widen(model, seed=sum(map(ord, name)))
    model.save_pretrained(d)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (1, WINDOW), generator=g)
    with open(os.path.join(d, "tokens.txt"), "w") as f:
        for row in ids.tolist():
            f.write(" ".join(map(str, row)) + "\n")
    reloaded, out = loss_of(d, ids)
    loss = float(out.loss)
    tensors = {f"hidden.{i}": h[0].contiguous() for i, h in enumerate(out.hidden_states)}
    tensors["logits"] = out.logits[0].contiguous()
    save_file(tensors, os.path.join(d, "expected.safetensors"))

    saved = load_file(os.path.join(d, "model.safetensors"))
    print(f"== {name}: {type(reloaded).__name__} loss {loss:.9f}", file=log)
    for k, t in sorted(saved.items()):
        print(f"   saved {k} {list(t.shape)}", file=log)
    for k, t in reloaded.state_dict().items():
        if k not in saved:
            print(f"   in-memory only {k} {list(t.shape)}", file=log)

    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    c4 = v4_config(cfg)
    w4 = v4_weights(saved, cfg["model_type"])
    with tempfile.TemporaryDirectory() as t:
        with open(os.path.join(t, "config.json"), "w") as f:
            json.dump(c4, f, indent=2)
        save_file(w4 if w4 is not None else saved, os.path.join(t, "model.safetensors"),
                  metadata={"format": "pt"})
        try:
            _, out4 = loss_of(t, ids)
            loss4 = float(out4.loss)
        except Exception as e:  # noqa: BLE001: reported, not fatal
            print(f"   4.x form does not load: {e!r}", file=log)
            loss4 = None
    with open(os.path.join(d, "config.v4.json"), "w") as f:
        json.dump(c4, f, indent=2)
        f.write("\n")
    if w4 is not None:
        save_file(w4, os.path.join(d, "model.v4.safetensors"), metadata={"format": "pt"})
    expected = {"loss": loss, "loss_v4": loss4, "transformers": transformers.__version__,
                "torch": torch.__version__, "class": type(reloaded).__name__,
                "window": WINDOW, "note": "fp32, eager attention, labels = input ids"}
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print(f"   4.x form loss {loss4} ({'same' if loss4 == loss else 'DIFFERENT'})", file=log)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    log = sys.stdout
    for name, (cls, kwargs) in families().items():
        if only and name not in only:
            continue
        try:
            write(name, cls, kwargs, args.out, log)
        except Exception as e:  # noqa: BLE001: one family's failure must not hide the others
            import traceback
            print(f"== {name}: FAILED {e!r}", file=log)
            traceback.print_exc(file=log)
        log.flush()


if __name__ == "__main__":
    main()
