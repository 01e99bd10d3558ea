// Tiny model configurations and deterministic batches shared by the model tests.
#pragma once

#include <string>

#include "core/config.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace tandem::testing {

// The LM head a weight of its own; tied_config ties it (Note [Tied embeddings]).
inline ModelConfig tiny_config(bool moe) {
  ModelConfig c;
  c.untie_embeddings_and_output_weights = true;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_layers = 2;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  c.ffn_hidden_size = 12;
  c.num_experts = moe ? 4 : 0;
  c.moe_router_topk = 2;
  c.moe_aux_loss_coeff = 0.05;
  c.seq_length = 5;
  return c;
}

inline ModelConfig tied_config(ModelConfig c) {
  c.untie_embeddings_and_output_weights = false;
  return c;
}

// Qwen3-MoE's options: q/k norms, a head dim of its own, narrower experts, routing weights from
// the full softmax (norm_topk_prob false) and the dense layers `moe_layer_freq` says.
inline ModelConfig with_qwen3_options(ModelConfig c, const std::string& moe_layer_freq) {
  c.qk_layernorm = true;
  c.kv_channels = 6;
  c.moe_ffn_hidden_size = 5;
  c.moe_router_pre_softmax = true;
  c.moe_layer_freq = moe_layer_freq;
  return c;
}

// Qwen2-MoE's: q/k/v biases and a gated shared expert beside the routed ones.
inline ModelConfig with_qwen2_options(ModelConfig c) {
  c.add_qkv_bias = true;
  c.moe_ffn_hidden_size = 5;
  c.moe_shared_expert_intermediate_size = 7;
  c.moe_shared_expert_gate = true;
  c.moe_router_pre_softmax = true;
  return c;
}

// The tiny MoE model with them: three layers for Qwen3 (the first dense).
inline ModelConfig tiny_qwen3_config() {
  ModelConfig c = tiny_config(true);
  c.num_layers = 3;
  return with_qwen3_options(c, "[0,1,1]");
}
inline ModelConfig tiny_qwen2_config() { return with_qwen2_options(tiny_config(true)); }

// DeepSeek-V3's: multi-head latent attention (q through a latent when q_lora_rank > 0), values
// narrower than q and k, interleaved RoPE; the sigmoid router with its expert bias, groups and
// scaling; shared experts of twice the experts' width; the dense layers first.
inline ModelConfig with_deepseek_v3_options(ModelConfig c, int64_t q_lora_rank) {
  c.num_query_groups = c.num_attention_heads;
  c.multi_latent_attention = true;
  c.q_lora_rank = q_lora_rank;
  c.kv_lora_rank = 6;
  c.qk_head_dim = 4;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 3;
  c.rotary_interleaved = true;
  c.moe_ffn_hidden_size = 5;
  c.moe_shared_expert_intermediate_size = 10;
  c.moe_router_score_function = "sigmoid";
  c.moe_router_enable_expert_bias = true;
  c.moe_router_num_groups = 2;
  c.moe_router_group_topk = 1;
  c.moe_router_topk_scaling_factor = 2.5;
  c.moe_aux_loss_coeff = 0;
  return c;
}
inline ModelConfig tiny_deepseek_v3_config(int64_t q_lora_rank = 5) {
  ModelConfig c = tiny_config(true);
  c.num_layers = 3;
  c.moe_layer_freq = "[0,1,1]";
  return with_deepseek_v3_options(c, q_lora_rank);
}

// The memory tests' models (tests/cuda/test_cuda_memory.cc measures them on the GPU,
// tests/planner/test_workspace.cc holds the plan to those figures): 2 layers of hidden 128, 4
// heads in 2 groups, 4 experts top-2 (MoE) or an MLP of 256, sequence 64.
inline ModelConfig memory_config(bool moe) {
  ModelConfig c;
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 256;
  c.num_experts = moe ? 4 : 0;
  c.moe_aux_loss_coeff = 0.01;  // the load-balancing loss, as the measured peaks had it
  c.moe_router_topk = moe ? 2 : 1;
  c.seq_length = 64;
  c.untie_embeddings_and_output_weights = true;  // the model the recorded peaks were measured on
  return c;
}

// Qwen3-MoE's options (q/k norms, head dim 64, narrower experts, pre-softmax routing, a dense
// first layer) and Qwen2-MoE's (q/k/v biases, a gated shared expert) on the MoE one.
inline ModelConfig memory_qwen3_config() {
  ModelConfig c = memory_config(true);
  c.qk_layernorm = true;
  c.kv_channels = 64;
  c.moe_ffn_hidden_size = 96;
  c.moe_router_pre_softmax = true;
  c.moe_layer_freq = "[0,1]";
  return c;
}
inline ModelConfig memory_qwen2_config() {
  ModelConfig c = memory_config(true);
  c.add_qkv_bias = true;
  c.moe_ffn_hidden_size = 96;
  c.moe_shared_expert_intermediate_size = 192;
  c.moe_shared_expert_gate = true;
  c.moe_router_pre_softmax = true;
  return c;
}

// DeepSeek-V3's options on the MoE one at its head widths (q/k 128 + 64, v 128: the GPU's
// tensor-core attention), q through a latent of 96, kv's of 64, experts and a shared expert of
// width 96, the first layer dense.
inline ModelConfig memory_deepseek_v3_config() {
  ModelConfig c = with_deepseek_v3_options(memory_config(true), 96);
  c.kv_lora_rank = 64;
  c.qk_head_dim = 128;
  c.qk_pos_emb_head_dim = 64;
  c.v_head_dim = 128;
  c.moe_ffn_hidden_size = 96;
  c.moe_shared_expert_intermediate_size = 96;
  c.moe_layer_freq = "[0,1]";
  return c;
}

// Random token ids in [0, vocab), [n] i32, from stream `key`.
inline Tensor random_ids(int64_t n, int64_t vocab, uint64_t key) {
  Tensor t = Tensor::empty({n}, DType::kI32, MemCategory::kOther, "ids");
  for (int64_t i = 0; i < n; ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(uniform01(key, static_cast<uint64_t>(i)) * vocab);
  }
  return t;
}

}  // namespace tandem::testing
