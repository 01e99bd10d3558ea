// Learning-rate schedule (linear warm-up, then cosine to min-lr) and AdamW over a chunk's flat
// fp32 master weights, with global-norm gradient clipping (MODEL.md "optimiser").
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/tensor.h"
#include "model/parameters.h"

namespace tandem::runtime {

// lr at 1-based iteration `iter`: lr * iter / warmup during warm-up, then cosine from lr to
// min_lr over [warmup, decay_iters] and min_lr after.
double learning_rate(const TrainConfig& t, int64_t iter);

class AdamW {
 public:
  AdamW(model::Parameters& params, const TrainConfig& t);

  // One update with learning rate `lr`; weight decay on matrices only (not norms, embeddings).
  void step(double lr);
  int64_t steps() const { return step_; }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  void set_steps(int64_t steps) { step_ = steps; }

 private:
  model::Parameters* params_;
  TrainConfig hp_;
  Tensor m_, v_;  // flat, like the parameters (kOptimizer)
  int64_t step_ = 0;
};

// Sum of squares of the gradients (for the global norm; add across ranks before the sqrt).
double grad_sum_squares(const model::Parameters& params);
// Scales the gradients so their global norm is at most max_norm (Megatron's rule: coefficient
// max_norm / (norm + 1e-6) when below one). Returns the coefficient applied (1 if none).
double clip_gradients(model::Parameters& params, double norm, double max_norm);

}  // namespace tandem::runtime
