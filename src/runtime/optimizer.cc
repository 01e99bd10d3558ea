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

AdamW::AdamW(model::Parameters& params, const TrainConfig& t)
    : params_(&params),
      hp_(t),
      m_(Tensor::zeros({params.numel()}, params.dtype(), MemCategory::kOptimizer, "adam.m",
                       params.device())),
      v_(Tensor::zeros({params.numel()}, params.dtype(), MemCategory::kOptimizer, "adam.v",
                       params.device())) {}

void AdamW::step(double lr) {
  ++step_;
  for (const model::ParamEntry& e : params_->entries()) {
    const int64_t n = shape_numel(e.shape);
    const double wd = e.kind == model::ParamKind::kMatrix ? hp_.weight_decay : 0.0;
    ops::adamw_step(params_->param(e), params_->grad(e), m_.narrow_rows(e.offset, n).reshape(e.shape),
                    v_.narrow_rows(e.offset, n).reshape(e.shape),
                    {lr, hp_.adam_beta1, hp_.adam_beta2, hp_.adam_eps, wd, step_});
  }
}

double grad_sum_squares(const model::Parameters& params) {
  return ops::sum_squares(params.flat_grads());
}

double clip_gradients(model::Parameters& params, double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  if (coeff >= 1.0) return 1.0;
  ops::scale(params.flat_grads(), coeff);
  return coeff;
}

}  // namespace tandem::runtime
