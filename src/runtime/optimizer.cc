// AdamW, clipping and the learning-rate schedule.
#include "runtime/optimizer.h"

#include <cmath>
#include <numbers>

#include "ops/ops.h"

namespace tandem::runtime {

double learning_rate(const TrainConfig& t, int64_t iter) {
  if (t.lr_warmup_iters > 0 && iter <= t.lr_warmup_iters) {
    return t.lr * static_cast<double>(iter) / static_cast<double>(t.lr_warmup_iters);
  }
  const int64_t decay = t.lr_decay_iters > 0 ? t.lr_decay_iters : t.train_iters;
  if (decay <= t.lr_warmup_iters) return t.min_lr;
  const double progress = std::min(
      1.0, static_cast<double>(iter - t.lr_warmup_iters) /
               static_cast<double>(decay - t.lr_warmup_iters));
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

namespace {

// adamw_step_flat's `decayed`: the [begin, end) ranges of the matrices (the entries lie in offset
// order, back to back), neighbours merged, so a chunk has a few per layer.
std::vector<int64_t> decayed_ranges(const model::Parameters& params) {
  std::vector<int64_t> r;
  for (const model::ParamEntry& e : params.entries()) {
    if (e.kind != model::ParamKind::kMatrix) continue;
    const int64_t end = e.offset + shape_numel(e.shape);
    if (!r.empty() && r.back() == e.offset) {
      r.back() = end;
    } else {
      r.push_back(e.offset);
      r.push_back(end);
    }
  }
  return r;
}

}  // namespace

AdamW::AdamW(model::Parameters& params, const TrainConfig& t)
    : params_(&params),
      hp_(t),
      m_(Tensor::zeros({params.numel()}, params.dtype(), MemCategory::kOptimizer, "adam.m",
                       params.device())),
      v_(Tensor::zeros({params.numel()}, params.dtype(), MemCategory::kOptimizer, "adam.v",
                       params.device())),
      decayed_(decayed_ranges(params)) {}

void AdamW::step(double lr, double grad_scale) {
  ++step_;
  ops::adamw_step_flat(params_->flat_params(), m_, v_, params_->flat_compute(),
                       params_->flat_grads(), decayed_, grad_scale,
                       {lr, hp_.adam_beta1, hp_.adam_beta2, hp_.adam_eps, hp_.weight_decay, step_});
}

double grad_sum_squares(const model::Parameters& params) {
  return ops::sum_squares(params.flat_grads());
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  return coeff >= 1.0 ? 1.0 : coeff;
}

}  // namespace tandem::runtime
