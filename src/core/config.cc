// Validation of the run configuration; each message names the value and what would be valid.
#include "core/config.h"

#include "core/error.h"

namespace tandem {

void ModelConfig::validate() const {
  TANDEM_CHECK(vocab_size >= 2, "--vocab-size ", vocab_size, " is invalid: need at least 2");
  TANDEM_CHECK(hidden_size >= 1, "--hidden-size ", hidden_size, " is invalid: need at least 1");
  TANDEM_CHECK(num_layers >= 1, "--num-layers ", num_layers, " is invalid: need at least 1");
  TANDEM_CHECK(num_attention_heads >= 1, "--num-attention-heads ", num_attention_heads,
               " is invalid: need at least 1");
  TANDEM_CHECK(hidden_size % num_attention_heads == 0, "--num-attention-heads ",
               num_attention_heads, " does not divide --hidden-size ", hidden_size,
               ": choose a number of heads that divides the hidden size");
  TANDEM_CHECK(head_dim() % 2 == 0, "head dimension ", head_dim(), " (--hidden-size ",
               hidden_size, " / --num-attention-heads ", num_attention_heads,
               ") is odd: rotary embeddings need an even head dimension");
  TANDEM_CHECK(num_query_groups >= 1 && num_attention_heads % num_query_groups == 0,
               "--num-query-groups ", num_query_groups, " does not divide --num-attention-heads ",
               num_attention_heads, ": it must be a divisor of the number of heads");
  TANDEM_CHECK(ffn_hidden_size >= 1, "--ffn-hidden-size ", ffn_hidden_size,
               " is invalid: need at least 1");
  TANDEM_CHECK(num_experts >= 0, "--num-experts ", num_experts,
               " is invalid: use 0 for a dense model or a positive count");
  if (num_experts > 0) {
    TANDEM_CHECK(moe_router_topk >= 1 && moe_router_topk <= num_experts, "--moe-router-topk ",
                 moe_router_topk, " is invalid: it must be between 1 and --num-experts (",
                 num_experts, ")");
  }
  TANDEM_CHECK(moe_aux_loss_coeff >= 0, "--moe-aux-loss-coeff ", moe_aux_loss_coeff,
               " is invalid: it must be >= 0");
  TANDEM_CHECK(rotary_base > 1, "--rotary-base ", rotary_base, " is invalid: it must be > 1");
  TANDEM_CHECK(norm_epsilon > 0, "--norm-epsilon ", norm_epsilon, " is invalid: it must be > 0");
  TANDEM_CHECK(seq_length >= 2, "--seq-length ", seq_length, " is invalid: need at least 2");
}

void TrainConfig::validate(int64_t data_parallel_size) const {
  TANDEM_CHECK(micro_batch_size >= 1, "--micro-batch-size ", micro_batch_size,
               " is invalid: need at least 1");
  TANDEM_CHECK(global_batch_size >= 1, "--global-batch-size ", global_batch_size,
               " is invalid: need at least 1");
  TANDEM_CHECK(global_batch_size % (micro_batch_size * data_parallel_size) == 0,
               "--global-batch-size ", global_batch_size,
               " is not a multiple of --micro-batch-size ", micro_batch_size,
               data_parallel_size > 1 ? " x data-parallel size " : "",
               data_parallel_size > 1 ? std::to_string(data_parallel_size) : std::string(),
               ": valid global batch sizes are multiples of ",
               micro_batch_size * data_parallel_size);
  TANDEM_CHECK(train_iters >= 1, "--train-iters ", train_iters, " is invalid: need at least 1");
  TANDEM_CHECK(lr > 0, "--lr ", lr, " is invalid: it must be > 0");
  TANDEM_CHECK(min_lr >= 0 && min_lr <= lr, "--min-lr ", min_lr,
               " is invalid: it must be between 0 and --lr (", lr, ")");
  TANDEM_CHECK(lr_warmup_iters >= 0, "--lr-warmup-iters ", lr_warmup_iters,
               " is invalid: it must be >= 0");
  TANDEM_CHECK(lr_decay_iters >= 0, "--lr-decay-iters ", lr_decay_iters,
               " is invalid: it must be >= 0 (0 decays over --train-iters)");
  TANDEM_CHECK(weight_decay >= 0, "--weight-decay ", weight_decay, " is invalid: it must be >= 0");
  TANDEM_CHECK(adam_beta1 >= 0 && adam_beta1 < 1, "--adam-beta1 ", adam_beta1,
               " is invalid: it must be in [0, 1)");
  TANDEM_CHECK(adam_beta2 >= 0 && adam_beta2 < 1, "--adam-beta2 ", adam_beta2,
               " is invalid: it must be in [0, 1)");
  TANDEM_CHECK(adam_eps > 0, "--adam-eps ", adam_eps, " is invalid: it must be > 0");
  TANDEM_CHECK(clip_grad >= 0, "--clip-grad ", clip_grad,
               " is invalid: it must be >= 0 (0 turns clipping off)");
  TANDEM_CHECK(log_interval >= 1, "--log-interval ", log_interval,
               " is invalid: need at least 1");
}

}  // namespace tandem
