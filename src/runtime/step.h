// What every training step shares, whichever trainer runs it: the step's result, the one place
// that decides which samples a micro-batch reads, and the verdict on a step whose loss or
// gradients are not finite.
#pragma once

#include <cstdint>

#include "core/allocator.h"
#include "core/config.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace tandem::runtime {

// Whether a step changed the weights: kSkipped when its loss or gradients were not finite and
// the policy is NonFinitePolicy::kSkip (no optimizer update, gradients zeroed).
enum class StepStatus : uint8_t { kApplied, kSkipped };

struct StepResult {
  int64_t iteration = 0;  // 1-based, after the step
  StepStatus status = StepStatus::kApplied;
  double loss = 0;      // mean over micro-batches of (lm_loss + aux_loss + mtp_loss)
  double lm_loss = 0;   // mean cross-entropy
  double aux_loss = 0;  // mean of the summed router aux losses
  // --mtp-num-layers: mean of the MTP term, mtp-loss-scaling-factor x the modules' mean
  // cross-entropy (docs/model.md "Multi-token prediction"); 0 without.
  double mtp_loss = 0;
  double grad_norm = 0;  // before clipping
  double lr = 0;
  // The input embedding's and output layer's rate (Note [Decoupled learning rate] in
  // core/lr_schedule.h): lr's without --decoupled-lr.
  double decoupled_lr = 0;
  int64_t tokens = 0;
  double seconds = 0;
  MemoryStats memory;           // at the end of the step, with the step's peaks
  int64_t activation_peak = 0;  // peak bytes of kActivation during the step
  // Peak host bytes holding offloaded activations (Note [Activation offload] in
  // activation_offload.h); 0 without --offload-activations.
  int64_t offload_host_peak = 0;
  // With --moe-router-enable-expert-bias (Note [Expert bias] in expert_bias.h): the step's most
  // loaded expert's rows over the mean, the largest over this rank's MoE layers (-1: none here).
  double expert_load_max_over_mean = -1;
};

// Note [Per-token loss]: Megatron-LM's default step loss is the mean over micro-batches of each
// micro-batch's mean over its unmasked tokens; with --calculate-per-token-loss it is the sum over
// the global batch's unmasked tokens (every micro-batch of every data-parallel rank) divided by
// their count G: its loss_func returns the sum and the count, and finalize_model_grads divides
// the gradients, summed over the data-parallel ranks, by the count summed likewise. tandem
// forms G on the host before the step (per_token_divisor: every token of the global batch's
// samples but the end-of-document inputs with --eod-mask-loss, all of them without) and gives
// the loss node G / (micro-batches x data-parallel ranks) as its divisor in place of its own
// count (NodeContext::per_token_divisor); the trainers then average as they always do, so the
// step's loss is the sum over G and every token's gradient weighs 1 / G. Without --eod-mask-loss
// each micro-batch holds micro_batch * seq of them and the two losses are one value. The MTP
// modules weigh as Megatron-LM does (Note [MTP loss mask] in model/mtp.cc); the router's losses
// keep their default weight 1 / (micro-batches x data-parallel ranks), the weight Megatron-LM's
// router aims for under --calculate-per-token-loss (it multiplies them by the micro-batch's
// tokens before the division by G, which reaches that weight where no token is masked).

// Tokens of one micro-batch: inputs and next-token targets, [micro_batch * seq] i32 each.
// With document masking (TrainConfig::document_masking), also each query's first key
// (--reset-attention-mask) and each token's position (--document-positions), i32
// [micro_batch * seq] each, and the loss mask (--eod-mask-loss), f32, from the ids
// (Note [Document masking] in data/document_masks.h), on the training device
// (Note [Document masks on the device] in step.cc); each undefined when its option is off.
// loss_tokens: the loss mask's tokens of weight 1, counted on the host.
// mtp_loss_tokens: with --eod-mask-loss and MTP modules, depth k's count in the loss mask rolled
// k left (Note [MTP loss mask] in model/mtp.cc), k = 1..mtp_num_layers.
struct MicroBatchTokens {
  Tensor ids, targets;
  Tensor key_begin, positions, loss_mask;
  int64_t loss_tokens = 0;
  std::vector<int64_t> mtp_loss_tokens;
};

// Reads micro-batch `mb` of step `iteration` (0-based) from the dataset: sample indices
// iteration * global_batch + mb * micro_batch + row, each seq + 1 tokens long. This is the one
// place that decides which samples a micro-batch gets (data-parallel sharding belongs here), so
// the data position of a checkpoint is its iteration alone.
MicroBatchTokens load_micro_batch(const data::Dataset& data, const ModelConfig& m,
                                  const TrainConfig& t, int64_t iteration, int64_t mb);

// Note [Per-token loss]: the loss node's divisor in step `iteration` (0-based) with
// --calculate-per-token-loss, the global batch's tokens of weight 1 over its micro-batches of
// all data-parallel ranks (global_batch / micro_batch of them); -1 without the option.
double per_token_divisor(const data::Dataset& data, const ModelConfig& m, const TrainConfig& t,
                         int64_t iteration);

// Throws unless the document options (TrainConfig::document_masking) fit the model: each needs
// the end-of-document id within the vocabulary.
void check_document_masking(const ModelConfig& m, const TrainConfig& t);

// Throws unless the data set's token ids are all below the model's vocabulary size.
void check_data_fits(const data::Dataset& data, const ModelConfig& m);

// Note [Non-finite steps]: a step is judged by one value, the gradients' sum of squares plus
// +inf when the loss is not finite (a multi-rank run all-reduces it, so every rank takes the same
// decision). When it is not finite, NonFinitePolicy::kStop throws tandem::Error before any
// update, naming the iteration and whether the loss or the gradients were at fault; kContinue
// checks nothing (update_applies); kSkip zeroes the gradients, leaves weights and optimizer
// untouched, still advances the iteration (its data is consumed) and reports StepStatus::kSkipped.
//
// The stop: throws that error when `finite` is false and the policy is kStop (the one message
// of every trainer); otherwise returns.
void check_step_verdict(const TrainConfig& t, int64_t iteration, double loss, double grad_norm,
                        bool finite);
// Whether the step's update applies: when it is finite, or whatever it is under
// NonFinitePolicy::kContinue (no check: the non-finite values reach the weights, as in
// Megatron-LM without its check).
inline bool update_applies(const TrainConfig& t, bool finite) {
  return finite || t.non_finite_policy == NonFinitePolicy::kContinue;
}

}  // namespace tandem::runtime
