// Tiny model configurations and deterministic batches shared by the model tests.
#pragma once

#include "core/config.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace tandem::testing {

inline ModelConfig tiny_config(bool moe) {
  ModelConfig c;
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

// Random token ids in [0, vocab), [n] i32, from stream `key`.
inline Tensor random_ids(int64_t n, int64_t vocab, uint64_t key) {
  Tensor t = Tensor::empty({n}, DType::kI32, MemCategory::kOther, "ids");
  for (int64_t i = 0; i < n; ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(uniform01(key, static_cast<uint64_t>(i)) * vocab);
  }
  return t;
}

}  // namespace tandem::testing
