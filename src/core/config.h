// Run configuration: the model (docs/model.md), training and parallel layout. Plain data with
// validation that names the bad value and what is valid. It lives in core, not model, because
// the planner (src/schedule) needs it and must not depend on the model's code.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace tandem {

// What a training step does when its loss or gradient norm is NaN or Inf (--nan-policy): stop
// with an error naming the iteration, or skip the update (no weight or optimizer change).
enum class NonFinitePolicy : uint8_t { kStop, kSkip };

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 256;
  int64_t num_layers = 4;
  int64_t num_attention_heads = 8;
  int64_t num_query_groups = 8;
  int64_t ffn_hidden_size = 512;
  int64_t num_experts = 8;  // 0: dense (Llama)
  int64_t moe_router_topk = 2;
  double moe_aux_loss_coeff = 0.01;
  double rotary_base = 10000.0;
  double norm_epsilon = 1e-5;
  int64_t seq_length = 128;

  bool is_moe() const { return num_experts > 0; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t q_width() const { return num_attention_heads * head_dim(); }
  int64_t kv_width() const { return num_query_groups * head_dim(); }
  // Throws tandem::Error naming the first value that does not fit.
  void validate() const;
};

struct TrainConfig {
  int64_t micro_batch_size = 8;
  int64_t global_batch_size = 16;
  int64_t train_iters = 300;
  double lr = 3e-3;
  double min_lr = 3e-4;
  int64_t lr_warmup_iters = 30;
  int64_t lr_decay_iters = 0;  // 0: decay over train_iters
  double weight_decay = 0.1;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;
  uint64_t seed = 1234;
  int64_t log_interval = 10;
  NonFinitePolicy non_finite_policy = NonFinitePolicy::kStop;
  Device device = Device::kCPU;  // --device cpu | cuda (one GPU per process)
  // --recompute-experts: the experts keep only their input rows from forward to backward and
  // form gate, up and the SwiGLU again there (Note [Recomputed experts] in model/ffn_nodes.cc).
  bool recompute_experts = false;
  // --moe-router-force-load-balancing (benchmarks only, as Megatron-LM's flag of that name): each
  // token goes to k experts picked round-robin, every expert receives the same rows, so the
  // expert ranks' work is equal and the all-to-all waits for no straggler. The router still
  // weights the chosen experts by its softmax (Note [Balanced routing] in attention_node.cc).
  bool moe_router_force_balance = false;
  // --rebalance-experts N: every N steps, lay each MoE layer's experts out anew over the
  // expert-parallel ranks from the rows they received (Note [Rebalancing experts] in
  // runtime/distributed.h); 0: never. The results do not change, only which rank runs which.
  int64_t rebalance_experts = 0;
  // --defer-optimizer (pipeline trainer): each step's AdamW update runs layer by layer inside
  // the next step's first forward, just before that forward reads each layer's weights (Note
  // [Deferred update] in runtime/optimizer.cc); the values are those of updating at the step's
  // end.
  bool defer_optimizer = false;
  // --overlap-grad-reduce (pipeline trainer, data-parallel or expert-data-parallel groups of more
  // than one rank): each unit's gradients (a layer, the embedding, the head) are all-reduced as
  // soon as the step's last weight gradient of that unit is issued, beside the rest of the
  // backward, instead of all at the step's end (Note [Gradients reduced beside the backward] in
  // runtime/grad_reduce.cc).
  bool overlap_grad_reduce = true;

  // Micro-batches per data-parallel rank in one step.
  int64_t num_microbatches(int64_t data_parallel_size = 1) const {
    return global_batch_size / (micro_batch_size * data_parallel_size);
  }
  void validate(int64_t data_parallel_size = 1) const;
};

struct ParallelConfig {
  int64_t pipeline_model_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  int64_t virtual_pipeline_model_parallel_size = 1;
  std::string schedule = "1f1b";
  bool pair_first_forwards = false;  // combined-1f1b, one stage: (0F0;0F1) first
};

}  // namespace tandem
