// The learning-rate schedule against an independent model of Megatron-LM's scheduler: an object
// that is built from the run's options as Megatron's training loop builds its scheduler (lengths
// in samples), is read before each update and advanced by the global batch after it. Every style,
// by iterations and by samples, with --lr-warmup-fraction and --lr-warmup-init, at every step of
// runs of a few hundred steps; and a few values worked out by hand (the first update's rate is
// --lr-warmup-init: the warm-up is not a step ahead). The options' rules against the messages
// they must give. The rate of the embedding and output layer under --decoupled-lr and
// --decoupled-min-lr, against the same model's rate of a group with its own peak and floor.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "runtime/optimizer.h"

namespace tandem::runtime {
namespace {

// A model of Megatron-LM's OptimizerParamScheduler as its training loop drives it.
class MegatronScheduler {
 public:
  explicit MegatronScheduler(const TrainConfig& t) : t_(t) {
    const double gbs = static_cast<double>(t.global_batch_size);
    if (t.train_samples > 0) {
      decay_ = static_cast<double>(t.lr_decay_samples ? t.lr_decay_samples : t.train_samples);
      warmup_ = static_cast<double>(t.lr_warmup_samples);
      if (t.lr_wsd_decay_samples >= 0) wsd_ = static_cast<double>(t.lr_wsd_decay_samples);
    } else {
      decay_ = gbs * static_cast<double>(t.lr_decay_iters ? t.lr_decay_iters : t.train_iters);
      warmup_ = gbs * static_cast<double>(t.lr_warmup_iters);
      if (t.lr_wsd_decay_iters >= 0) wsd_ = gbs * static_cast<double>(t.lr_wsd_decay_iters);
    }
    if (t.lr_warmup_fraction >= 0) warmup_ = t.lr_warmup_fraction * decay_;
  }
  void advance() { consumed_ += static_cast<double>(t_.global_batch_size); }

  double rate() const { return rate(t_.lr, t_.min_lr); }
  // get_lr(param_group) of a group with its own max_lr and min_lr (--decoupled-lr's).
  double rate(double top, double low) const {
    const double n = consumed_;
    if (warmup_ > 0 && !(n > warmup_)) {
      const double share = n / warmup_;
      return (1 - share) * t_.lr_warmup_init + share * top;
    }
    switch (t_.lr_decay_style) {
      case LrDecayStyle::kConstant:
        return top;
      case LrDecayStyle::kInverseSquareRoot:
        if (n > decay_) return low;
        return std::max(low, top / std::sqrt(std::max(n, 1.0) / std::max(warmup_, 1.0)));
      case LrDecayStyle::kLinear:
        if (n > decay_) return low;
        return top - (top - low) * (n - warmup_) / (decay_ - warmup_);
      case LrDecayStyle::kCosine: {
        if (n > decay_) return low;
        const double angle = M_PI * (n - warmup_) / (decay_ - warmup_);
        return low + (top - low) * (std::cos(angle) + 1) / 2;
      }
      case LrDecayStyle::kWsd: {
        if (n > decay_) return low;
        const double stable_end = decay_ - *wsd_;
        if (n <= stable_end) return top;
        const double s = (n - stable_end) / *wsd_;
        double c = 0;
        switch (t_.lr_wsd_decay_style) {
          case LrWsdDecayStyle::kLinear:
            c = 1 - s;
            break;
          case LrWsdDecayStyle::kCosine:
            c = (std::cos(M_PI * s) + 1) / 2;
            break;
          case LrWsdDecayStyle::kExponential:
            c = 2 * std::exp2(-s) - 1;
            break;
          case LrWsdDecayStyle::kMinusSqrt:
            c = 1 - std::sqrt(s);
            break;
        }
        return low + (top - low) * c;
      }
    }
    return -1;
  }

 private:
  TrainConfig t_;
  double consumed_ = 0, warmup_ = 0, decay_ = 0;
  std::optional<double> wsd_;
};

TrainConfig base() {
  TrainConfig t;
  t.lr = 3e-3;
  t.min_lr = 3e-5;
  t.micro_batch_size = 4;
  t.global_batch_size = 32;
  t.train_iters = 240;
  return t;
}

// Every step of the run and 20 past its end, against the model.
void expect_schedule(const TrainConfig& t, const std::string& what) {
  ASSERT_NO_THROW(t.validate()) << what;
  MegatronScheduler ref(t);
  for (int64_t k = 1; k <= t.train_iters + 20; ++k) {
    EXPECT_NEAR(learning_rate(t, k), ref.rate(), 1e-15) << what << ", iteration " << k;
    ref.advance();
  }
}

TEST(LrSchedule, EveryStyleByIterationsAgainstMegatronsScheduler) {
  for (const LrDecayStyle style :
       {LrDecayStyle::kConstant, LrDecayStyle::kLinear, LrDecayStyle::kCosine,
        LrDecayStyle::kInverseSquareRoot, LrDecayStyle::kWsd}) {
    for (const int64_t warmup : {0, 1, 17}) {
      for (const int64_t decay : {0, 150}) {
        TrainConfig t = base();
        t.lr_decay_style = style;
        t.lr_warmup_iters = warmup;
        t.lr_decay_iters = decay;
        t.lr_wsd_decay_iters = 40;
        t.lr_warmup_init = warmup == 17 ? 1e-4 : 0.0;
        expect_schedule(t, std::string(enum_name(style)) + " warmup " + std::to_string(warmup) +
                               " decay " + std::to_string(decay));
      }
    }
  }
}

TEST(LrSchedule, EveryWsdAnnealingStyle) {
  for (const LrWsdDecayStyle anneal : {LrWsdDecayStyle::kExponential, LrWsdDecayStyle::kLinear,
                                       LrWsdDecayStyle::kCosine, LrWsdDecayStyle::kMinusSqrt}) {
    for (const int64_t iters : {0, 1, 60, 240}) {
      TrainConfig t = base();
      t.lr_decay_style = LrDecayStyle::kWsd;
      t.lr_wsd_decay_style = anneal;
      t.lr_wsd_decay_iters = iters;
      t.lr_warmup_iters = 10;
      expect_schedule(t, std::string(enum_name(anneal)) + " over " + std::to_string(iters));
    }
  }
}

TEST(LrSchedule, BySamplesAndByFraction) {
  for (const LrDecayStyle style : {LrDecayStyle::kLinear, LrDecayStyle::kCosine,
                                   LrDecayStyle::kInverseSquareRoot, LrDecayStyle::kWsd}) {
    TrainConfig t = base();
    t.lr_decay_style = style;
    t.train_samples = 7000;  // 218 steps of 32, the last samples unused
    t.train_iters = t.train_samples / t.global_batch_size;
    t.lr_warmup_samples = 500;  // not a multiple of the batch
    t.lr_decay_samples = 6000;
    t.lr_wsd_decay_samples = 1111;
    expect_schedule(t, std::string("samples, ") + std::string(enum_name(style)));
    t.lr_warmup_samples = 0;
    t.lr_warmup_fraction = 0.07;
    expect_schedule(t, std::string("samples, fraction, ") + std::string(enum_name(style)));
    TrainConfig it = base();
    it.lr_decay_style = style;
    it.lr_wsd_decay_iters = 30;
    it.lr_warmup_fraction = 0.1;
    expect_schedule(it, std::string("iterations, fraction, ") + std::string(enum_name(style)));
  }
}

// Note [Decoupled learning rate]: the embedding's and output layer's rate is Megatron's get_lr of a
// group whose max_lr is --decoupled-lr and min_lr --decoupled-min-lr, or --min-lr when that is not
// given; the other weights' rate is unchanged.
TEST(LrSchedule, DecoupledRateAgainstMegatronsScheduler) {
  for (const LrDecayStyle style :
       {LrDecayStyle::kConstant, LrDecayStyle::kLinear, LrDecayStyle::kCosine,
        LrDecayStyle::kInverseSquareRoot, LrDecayStyle::kWsd}) {
    for (const double floor : {-1.0, 2e-6}) {
      TrainConfig t = base();
      t.lr_decay_style = style;
      t.lr_warmup_iters = 17;
      t.lr_warmup_init = 1e-5;
      t.lr_wsd_decay_iters = 40;
      t.decoupled_lr = 7e-4;
      t.decoupled_min_lr = floor;
      const std::string what =
          std::string(enum_name(style)) + " decoupled-min-lr " + std::to_string(floor);
      ASSERT_NO_THROW(t.validate()) << what;
      MegatronScheduler ref(t);
      for (int64_t k = 1; k <= t.train_iters + 20; ++k) {
        const UpdateRates r = learning_rates(t, k);
        EXPECT_NEAR(r.lr, ref.rate(), 1e-15) << what << ", iteration " << k;
        EXPECT_NEAR(r.embedding_output, ref.rate(7e-4, floor >= 0 ? floor : t.min_lr), 1e-15)
            << what << ", iteration " << k;
        ref.advance();
      }
    }
  }
  // Not given: both rates are --lr's schedule, --decoupled-min-lr alone included.
  TrainConfig t = base();
  t.decoupled_min_lr = 1e-6;
  for (int64_t k = 1; k <= t.train_iters; ++k) {
    EXPECT_EQ(learning_rates(t, k).embedding_output, learning_rate(t, k)) << k;
  }
}

// Worked by hand: warm-up and cosine decay with --decoupled-lr 0.5 and --decoupled-min-lr 0.05
// beside --lr 1 and --min-lr 0.1.
TEST(LrSchedule, DecoupledWarmupAndCosineByHand) {
  TrainConfig t = base();
  t.lr = 1.0;
  t.min_lr = 0.1;
  t.decoupled_lr = 0.5;
  t.decoupled_min_lr = 0.05;
  t.lr_warmup_iters = 4;
  t.train_iters = 104;
  t.lr_decay_style = LrDecayStyle::kCosine;
  ASSERT_NO_THROW(t.validate());
  const auto at = [&](int64_t k) { return learning_rates(t, k); };
  EXPECT_EQ(at(1).embedding_output, 0.0);  // the warm-up starts at --lr-warmup-init for both
  EXPECT_DOUBLE_EQ(at(3).embedding_output, 0.25);
  EXPECT_DOUBLE_EQ(at(3).lr, 0.5);
  EXPECT_DOUBLE_EQ(at(5).embedding_output, 0.5);  // the peak after 4 warm-up iterations
  // A quarter of the 100 decay iterations: cos(pi / 4).
  EXPECT_NEAR(at(30).embedding_output, 0.05 + 0.45 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_NEAR(at(30).lr, 0.1 + 0.9 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_NEAR(at(55).embedding_output, 0.275, 1e-15);  // half way: the mean of peak and floor
  EXPECT_NEAR(at(55).lr, 0.55, 1e-15);
  EXPECT_DOUBLE_EQ(at(106).embedding_output, 0.05);  // past the decay
  EXPECT_DOUBLE_EQ(at(106).lr, 0.1);
  t.decoupled_min_lr = -1;  // not given: the floor is --min-lr
  EXPECT_NEAR(at(55).embedding_output, 0.3, 1e-15);
  EXPECT_DOUBLE_EQ(at(106).embedding_output, 0.1);
}

// Worked by hand: the first update uses the warm-up's start, the (W+1)-th the peak.
TEST(LrSchedule, FirstUpdateUsesTheWarmupStart) {
  TrainConfig t = base();
  t.lr = 1.0;
  t.min_lr = 0.0;
  t.lr_warmup_iters = 4;
  t.train_iters = 104;
  EXPECT_EQ(learning_rate(t, 1), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(t, 2), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(t, 5), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(t, 55), 0.5);  // linear: half of the 100 decay iterations
  EXPECT_DOUBLE_EQ(learning_rate(t, 105), 0.0);
  t.lr_warmup_init = 0.2;
  EXPECT_DOUBLE_EQ(learning_rate(t, 1), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(t, 3), 0.6);
  // No warm-up: the first update runs at the peak.
  t.lr_warmup_iters = 0;
  t.lr_decay_style = LrDecayStyle::kCosine;
  EXPECT_DOUBLE_EQ(learning_rate(t, 1), 1.0);
  EXPECT_NEAR(learning_rate(t, 53), 0.5, 1e-15);
}

void expect_refused(const TrainConfig& t, const std::string& words) {
  try {
    t.validate();
    ADD_FAILURE() << "accepted; expected an error with: " << words;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(LrSchedule, OptionRules) {
  const std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>> cases = {
      {[](TrainConfig& t) { t.lr_decay_style = LrDecayStyle::kWsd; }, "give --lr-wsd-decay-iters"},
      {[](TrainConfig& t) { t.lr_warmup_iters = 240; },
       "must be shorter than the decay (240 iterations)"},
      {[](TrainConfig& t) {
         t.lr_warmup_fraction = 0.1;
         t.lr_warmup_iters = 3;
       },
       "--lr-warmup-fraction 0.1 and --lr-warmup-iters 3"},
      {[](TrainConfig& t) { t.lr_warmup_samples = 64; }, "need a run by samples (--train-samples)"},
      {[](TrainConfig& t) {
         t.train_samples = 640;
         t.lr_decay_iters = 10;
       },
       "give the schedule in samples too"},
      {[](TrainConfig& t) { t.lr_warmup_init = 0.01; }, "--lr-warmup-init 0.01 is invalid"},
      {[](TrainConfig& t) { t.lr_warmup_fraction = 1.0; }, "--lr-warmup-fraction 1 is invalid"},
      {[](TrainConfig& t) { t.decoupled_lr = -0.5; }, "--decoupled-lr -0.5 is invalid"},
      {[](TrainConfig& t) { t.decoupled_min_lr = -0.5; }, "--decoupled-min-lr -0.5 is invalid"},
      {[](TrainConfig& t) {
         t.decoupled_lr = 1e-4;
         t.decoupled_min_lr = 2e-4;
       },
       "--decoupled-min-lr 0.0002 is invalid: it must be at most --decoupled-lr"},
  };
  for (const auto& [change, words] : cases) {
    TrainConfig t = base();
    change(t);
    expect_refused(t, words);
  }
}

}  // namespace
}  // namespace tandem::runtime
