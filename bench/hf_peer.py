#!/usr/bin/env python3
"""transformers' own DeepseekV3ForCausalLM trained on one GPU, the peer of tandem's shape (d).

The model as transformers builds it from a DeepseekV3Config (multi-head latent attention, the
sigmoid router with its expert bias, shared experts, dense first layers), fp32 parameters with
the products under torch.autocast(bfloat16) as tandem's (bf16 compute copy, fp32 master), the
experts on transformers' grouped_mm implementation where it has one, each decoder layer
torch.compile'd (--compile), AdamW (fused) after --num-microbatches micro-batches of mock tokens.
Prints one line 'RESULT {json}': tokens/s over the timed steps, peak memory, and the FLOPs a token
takes with the model FLOP utilisation against the chip's measured bf16 matrix rate and against
the H200's datasheet rate (989 TFLOP/s dense bf16).

FLOPs per token (training: 3x the forward; bench/gpu_suite.sh's suite d applies the same function
to tandem's run):
  6 x (the products' weights a token meets: attention's q (or its low-rank pair), kv_a, kv_b and
       o; the router; top-k routed experts and the shared experts (3 H F each), or the dense
       SwiGLU; the LM head)
  + 6 x heads x (seq / 2) x (qk_dim + v_dim)    (causal attention: each token sees seq/2 keys
                                                 on average; 2 FLOPs a multiply-add, x3)
Usage: python3 hf_peer.py --compile [--steps 6 --warmup-steps 3] (shape (d) by default)
"""
import argparse, json, time

H200_DENSE_BF16_TFLOPS = 989.0


def flops_per_token(a):
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    h, heads = a.hidden_size, a.num_attention_heads
    q = h * a.q_lora_rank + a.q_lora_rank * heads * qk if a.q_lora_rank else h * heads * qk
    attn = q + h * (a.kv_lora_rank + a.qk_rope_head_dim) \
        + a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim) + heads * a.v_head_dim * h
    moe = h * a.n_routed_experts + 3 * h * a.moe_intermediate_size * (a.num_experts_per_tok + a.n_shared_experts)
    dense = 3 * h * a.intermediate_size
    layers = a.num_hidden_layers
    first = min(a.first_k_dense_replace, layers)
    weights = layers * attn + first * dense + (layers - first) * moe + h * a.vocab_size
    core = layers * heads * (a.seq_length / 2) * (qk + a.v_head_dim) * 2
    return 6 * weights + 3 * core


def matmul_tflops():
    import torch

    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    t = time.time()
    for _ in range(20):
        x @ y
    torch.cuda.synchronize()
    return 20 * 2 * 8192 ** 3 / (time.time() - t) / 1e12


def parse_args(argv=None):
    """The options; parse_args([]) is shape (d) itself (bench/gpu_suite.sh reads it for tandem's MFU)."""
    ap = argparse.ArgumentParser()
    arg = ap.add_argument
    arg("--num-hidden-layers", type=int, default=4)
    arg("--hidden-size", type=int, default=2048)
    arg("--num-attention-heads", type=int, default=16)
    arg("--q-lora-rank", type=int, default=0)
    arg("--kv-lora-rank", type=int, default=512)
    arg("--qk-nope-head-dim", type=int, default=128)
    arg("--qk-rope-head-dim", type=int, default=64)
    arg("--v-head-dim", type=int, default=128)
    arg("--n-routed-experts", type=int, default=64)
    arg("--num-experts-per-tok", type=int, default=6)
    arg("--n-shared-experts", type=int, default=2)
    arg("--moe-intermediate-size", type=int, default=1408)
    arg("--intermediate-size", type=int, default=11264)
    arg("--first-k-dense-replace", type=int, default=1)
    arg("--routed-scaling-factor", type=float, default=2.446)
    arg("--vocab-size", type=int, default=163840)
    arg("--seq-length", type=int, default=4096)
    arg("--micro-batch-size", type=int, default=1)
    arg("--num-microbatches", type=int, default=8)
    arg("--steps", type=int, default=6)
    arg("--warmup-steps", type=int, default=3)
    arg("--compile", action="store_true")
    arg("--experts-implementation", default="grouped_mm")
    return ap.parse_args(argv)


def main():
    a = parse_args()

    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    import transformers

    cfg = DeepseekV3Config(
        vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
        moe_intermediate_size=a.moe_intermediate_size, num_hidden_layers=a.num_hidden_layers,
        num_attention_heads=a.num_attention_heads, num_key_value_heads=a.num_attention_heads,
        n_shared_experts=a.n_shared_experts, n_routed_experts=a.n_routed_experts,
        routed_scaling_factor=a.routed_scaling_factor, kv_lora_rank=a.kv_lora_rank,
        q_lora_rank=a.q_lora_rank or None, qk_rope_head_dim=a.qk_rope_head_dim,
        v_head_dim=a.v_head_dim, qk_nope_head_dim=a.qk_nope_head_dim, n_group=1, topk_group=1,
        num_experts_per_tok=a.num_experts_per_tok, first_k_dense_replace=a.first_k_dense_replace,
        norm_topk_prob=True, max_position_embeddings=a.seq_length, tie_word_embeddings=False,
        use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(cfg).cuda()
    experts = "default"
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation(a.experts_implementation)
            experts = a.experts_implementation
        except Exception as e:  # an implementation this transformers lacks: say so, go on
            experts = "default (%s refused: %s)" % (a.experts_implementation, str(e)[:80])
    model.train()
    if a.compile:
        for layer in model.model.layers:
            layer.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        total = 0.0
        for _ in range(a.num_microbatches):
            ids = torch.randint(0, a.vocab_size, (a.micro_batch_size, a.seq_length), device="cuda",
                                generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss / a.num_microbatches
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(total)

    peak = matmul_tflops()
    for i in range(a.warmup_steps):
        print("warm-up step", i + 1, "loss %.4f" % step(), flush=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for i in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.time() - t0
    tokens = a.steps * a.num_microbatches * a.micro_batch_size * a.seq_length
    fpt = flops_per_token(a)
    tps = tokens / dt
    print("RESULT " + json.dumps({
        "impl": "transformers DeepseekV3ForCausalLM" + (" + torch.compile" if a.compile else ""),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "experts_implementation": experts, "tokens_per_s": tps, "step_ms": 1e3 * dt / a.steps,
        "flops_per_token": fpt, "matmul_peak_tflops": peak,
        "mfu_measured_peak": fpt * tps / 1e12 / peak,
        "mfu_datasheet": fpt * tps / 1e12 / H200_DENSE_BF16_TFLOPS,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30, "loss": loss}), flush=True)


if __name__ == "__main__":
    main()
