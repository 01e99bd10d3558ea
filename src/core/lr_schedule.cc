// Note [Learning-rate schedule] (core/lr_schedule.h).
#include "core/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/config.h"
#include "core/error.h"

namespace tandem {

LrLengths lr_lengths(const TrainConfig& t) {
  const double batch = static_cast<double>(t.global_batch_size);
  LrLengths l;
  if (t.train_samples > 0) {
    l.decay = static_cast<double>(t.lr_decay_samples > 0 ? t.lr_decay_samples : t.train_samples);
    l.warmup = static_cast<double>(t.lr_warmup_samples);
    l.anneal = static_cast<double>(std::max<int64_t>(t.lr_wsd_decay_samples, 0));
  } else {
    l.decay = static_cast<double>(t.lr_decay_iters > 0 ? t.lr_decay_iters : t.train_iters) * batch;
    l.warmup = static_cast<double>(t.lr_warmup_iters) * batch;
    l.anneal = static_cast<double>(std::max<int64_t>(t.lr_wsd_decay_iters, 0)) * batch;
  }
  if (t.lr_warmup_fraction >= 0) l.warmup = t.lr_warmup_fraction * l.decay;
  return l;
}

namespace {

// WSD's annealing coefficient at s in [0, 1] of the annealing phase.
double wsd_coefficient(LrWsdDecayStyle style, double s) {
  switch (style) {
    case LrWsdDecayStyle::kLinear:
      return 1.0 - s;
    case LrWsdDecayStyle::kCosine:
      return 0.5 * (std::cos(std::numbers::pi * s) + 1.0);
    case LrWsdDecayStyle::kExponential:
      return 2.0 * std::pow(0.5, s) - 1.0;
    case LrWsdDecayStyle::kMinusSqrt:
      return 1.0 - std::sqrt(s);
  }
  return 1.0;
}

}  // namespace

double lr_at(const TrainConfig& t, int64_t update) { return lr_at(t, update, t.lr, t.min_lr); }

double decoupled_lr_at(const TrainConfig& t, int64_t update) {
  if (t.decoupled_lr < 0) return lr_at(t, update);
  return lr_at(t, update, t.decoupled_lr, t.decoupled_min_lr >= 0 ? t.decoupled_min_lr : t.min_lr);
}

double lr_at(const TrainConfig& t, int64_t update, double max_lr, double min_lr) {
  const LrLengths l = lr_lengths(t);
  const double n = static_cast<double>(std::max<int64_t>(update - 1, 0)) *
                   static_cast<double>(t.global_batch_size);
  if (l.warmup > 0 && n <= l.warmup) {
    return t.lr_warmup_init + (max_lr - t.lr_warmup_init) * n / l.warmup;
  }
  if (t.lr_decay_style == LrDecayStyle::kConstant) return max_lr;
  if (n > l.decay) return min_lr;
  if (t.lr_decay_style == LrDecayStyle::kInverseSquareRoot) {
    return std::max(min_lr,
                    max_lr * std::sqrt(std::max(l.warmup, 1.0)) / std::sqrt(std::max(n, 1.0)));
  }
  const double ratio = (n - l.warmup) / (l.decay - l.warmup);
  double coeff = 1.0;
  switch (t.lr_decay_style) {
    case LrDecayStyle::kLinear:
      coeff = 1.0 - ratio;
      break;
    case LrDecayStyle::kCosine:
      coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
      break;
    case LrDecayStyle::kWsd: {
      const double stable_until = l.decay - l.anneal;
      if (n > stable_until)
        coeff = wsd_coefficient(t.lr_wsd_decay_style, (n - stable_until) / l.anneal);
      break;
    }
    case LrDecayStyle::kConstant:
    case LrDecayStyle::kInverseSquareRoot:
      break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

void validate_lr_schedule(const TrainConfig& t) {
  TANDEM_CHECK(t.min_lr >= 0 && t.min_lr <= t.lr, "--min-lr ", t.min_lr,
               " is invalid: it must be between 0 and --lr (", t.lr, ")");
  TANDEM_CHECK(t.lr_warmup_init >= 0 && t.lr_warmup_init <= t.lr, "--lr-warmup-init ",
               t.lr_warmup_init, " is invalid: it must be between 0 and --lr (", t.lr, ")");
  // -1 is "not given" (the default), as Megatron-LM's None.
  TANDEM_CHECK(t.decoupled_lr == -1 || t.decoupled_lr >= 0, "--decoupled-lr ", t.decoupled_lr,
               " is invalid: it must be >= 0");
  TANDEM_CHECK(t.decoupled_min_lr == -1 || t.decoupled_min_lr >= 0, "--decoupled-min-lr ",
               t.decoupled_min_lr, " is invalid: it must be >= 0");
  TANDEM_CHECK(t.decoupled_lr < 0 || t.decoupled_min_lr <= t.decoupled_lr, "--decoupled-min-lr ",
               t.decoupled_min_lr, " is invalid: it must be at most --decoupled-lr (",
               t.decoupled_lr, ")");
  TANDEM_CHECK(t.lr_warmup_iters >= 0, "--lr-warmup-iters ", t.lr_warmup_iters,
               " is invalid: it must be >= 0");
  TANDEM_CHECK(t.lr_decay_iters >= 0, "--lr-decay-iters ", t.lr_decay_iters,
               " is invalid: it must be >= 0 (0 decays over --train-iters)");
  for (const auto& [option, value] : {std::pair{"--lr-wsd-decay-iters", t.lr_wsd_decay_iters},
                                      {"--lr-wsd-decay-samples", t.lr_wsd_decay_samples}}) {
    TANDEM_CHECK(value >= -1, option, " ", value, " is invalid: it must be >= 0");
  }
  TANDEM_CHECK(
      t.lr_warmup_fraction == -1 || (t.lr_warmup_fraction >= 0 && t.lr_warmup_fraction < 1),
      "--lr-warmup-fraction ", t.lr_warmup_fraction,
      " is invalid: it must be in [0, 1) (a share of the decay length)");
  const bool by_samples = t.train_samples > 0;
  if (by_samples) {
    TANDEM_CHECK(t.lr_decay_iters == 0 && t.lr_warmup_iters == 0 && t.lr_wsd_decay_iters == -1,
                 "--train-samples ", t.train_samples,
                 " runs by samples: give the schedule in samples too (--lr-decay-samples, "
                 "--lr-warmup-samples, --lr-wsd-decay-samples), not --lr-decay-iters, "
                 "--lr-warmup-iters or --lr-wsd-decay-iters");
  } else {
    TANDEM_CHECK(
        t.lr_decay_samples == 0 && t.lr_warmup_samples == 0 && t.lr_wsd_decay_samples == -1,
        "--lr-decay-samples, --lr-warmup-samples and --lr-wsd-decay-samples need a run "
        "by samples (--train-samples); with --train-iters use --lr-decay-iters, "
        "--lr-warmup-iters and --lr-wsd-decay-iters");
  }
  if (t.lr_warmup_fraction >= 0) {
    TANDEM_CHECK(t.lr_warmup_iters == 0 && t.lr_warmup_samples == 0, "--lr-warmup-fraction ",
                 t.lr_warmup_fraction, " and --lr-warmup-", by_samples ? "samples " : "iters ",
                 by_samples ? t.lr_warmup_samples : t.lr_warmup_iters,
                 " both set the warm-up: give one of them");
  }
  if (t.lr_decay_style == LrDecayStyle::kWsd) {
    TANDEM_CHECK((by_samples ? t.lr_wsd_decay_samples : t.lr_wsd_decay_iters) >= 0,
                 "--lr-decay-style WSD needs the length of its annealing phase: give ",
                 by_samples ? "--lr-wsd-decay-samples" : "--lr-wsd-decay-iters", " (0: none)");
  }
  const LrLengths l = lr_lengths(t);
  const double unit = by_samples ? 1.0 : static_cast<double>(t.global_batch_size);
  const char* units = by_samples ? " samples" : " iterations";
  TANDEM_CHECK(l.warmup < l.decay, "the warm-up (", l.warmup / unit, units,
               ") must be shorter than the decay (", l.decay / unit, units,
               "): lower --lr-warmup-iters, --lr-warmup-samples or --lr-warmup-fraction, or "
               "raise --lr-decay-iters or --lr-decay-samples");
}

}  // namespace tandem
