// The learning-rate schedule (Note [Learning-rate schedule] in core/lr_schedule.h) and AdamW over
// a chunk's flat fp32 master weights, with global-norm gradient clipping (docs/model.md
// "Optimiser"): the clipping coefficient scales the gradients as the step reads them, in the
// step's one pass.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"
#include "model/parameters.h"

namespace tandem::runtime {

// The learning rate of the `update`-th (1-based) update, as Megatron-LM's scheduler gives it: the
// first update's is --lr-warmup-init when there is a warm-up. The trainers pass their
// optimizer's steps() + 1 (Note [Learning-rate schedule] in core/lr_schedule.h).
double learning_rate(const TrainConfig& t, int64_t update);

// The rates of one update (Note [Decoupled learning rate] in core/lr_schedule.h): `lr` for every
// weight but the input embedding and the output layer, which take `embedding_output`.
struct UpdateRates {
  double lr = 0;
  double embedding_output = 0;
};
// Both rates of the `update`-th update; embedding_output is lr without --decoupled-lr.
UpdateRates learning_rates(const TrainConfig& t, int64_t update);

// A range of the flat buffers that an AdamW updates, and where its moments begin in the
// optimizer's own buffers.
struct OwnedRange {
  int64_t begin = 0, count = 0;  // in the flat parameter and gradient buffers
  int64_t state_at = 0;          // in exp_avg() and exp_avg_sq()
};

class AdamW {
 public:
  // Updates every weight of `params`; its moments lie as the weights do.
  AdamW(model::Parameters& params, const TrainConfig& t);
  // Note [Distributed optimizer] (distributed_optimizer.cc): updates only the ranges `owned`
  // (ascending, not overlapping), whose moments take state_numel elements in all.
  AdamW(model::Parameters& params, const TrainConfig& t, std::vector<OwnedRange> owned,
        int64_t state_numel);

  // One update of every parameter with the learning rates `rates` and the gradients multiplied by
  // grad_scale (clip_coefficient's; the gradient buffers are left as they are); weight decay on
  // every weight of two or more dimensions, the embedding table included (not norms, biases). One
  // pass over the flat buffers (ops::adamw_step_flat), which on the GPU also writes the bf16
  // compute copy (Note [Compute copy] in model/parameters.h): no refresh_compute_copy() is needed
  // after it.
  void step(UpdateRates rates, double grad_scale);
  // Every weight at `lr`, the embedding and output layer too.
  void step(double lr, double grad_scale) { step(UpdateRates{lr, lr}, grad_scale); }
  // Note [Deferred update] (optimizer.cc): the same update in pieces. defer_step counts the step
  // and keeps its scalars; update_until(end) updates the elements [updated_until(), end) of the
  // flat buffers and zeroes their gradients (the next step's zero_grads must skip the elements
  // still waiting); finish_step() updates the rest. The values are step()'s, bit for bit.
  void defer_step(UpdateRates rates, double grad_scale);
  void update_until(int64_t end);
  void finish_step() { update_until(params_->numel()); }
  bool update_pending() const { return done_ < params_->numel(); }
  int64_t updated_until() const { return done_; }
  int64_t steps() const { return step_; }
  // The ranges this optimizer updates; one over the whole buffers unless sharded.
  const std::vector<OwnedRange>& owned() const { return owned_; }
  bool sharded() const { return m_.numel() != params_->numel() || owned_.size() != 1; }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  void set_steps(int64_t steps) { step_ = steps; }

 private:
  model::Parameters* params_;
  TrainConfig hp_;
  std::vector<OwnedRange> owned_;
  Tensor m_, v_;                  // the owned ranges' moments, back to back (kOptimizer)
  std::vector<int64_t> decayed_;  // the matrices' element ranges, neighbours merged
  // The input embedding's and output layer's element ranges, as decayed_ (at most two ranges).
  std::vector<int64_t> embedding_output_;
  int64_t step_ = 0;
  // The step's scalars and the elements it has updated (all of them: none pending).
  UpdateRates rates_;
  double grad_scale_ = 1;
  int64_t done_ = 0;
  // Counts a step and keeps its scalars, nothing updated yet; throws (naming `who`) while the
  // last one is unfinished.
  void start_step(const char* who, UpdateRates rates, double grad_scale);
  void update_range(int64_t end);
  // The elements [begin, end) of the flat buffers, all inside one owned range `r`.
  void update_piece(const OwnedRange& r, int64_t begin, int64_t end);
  // As update_piece, all the elements at one learning rate `lr`.
  void update_run(const OwnedRange& r, int64_t begin, int64_t end, double lr);
};

// Sum of squares of the gradients (for the global norm; add across ranks before the sqrt).
double grad_sum_squares(const model::Parameters& params);
// The factor that brings the gradients' global norm to at most max_norm, for AdamW::step's
// grad_scale (Megatron's rule: max_norm / (norm + 1e-6) when below one); 1 when the norm is
// within the limit or max_norm <= 0 (no clipping).
double clip_coefficient(double norm, double max_norm);

}  // namespace tandem::runtime
