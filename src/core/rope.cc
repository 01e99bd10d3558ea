// RoPE's frequencies (rope.h), and the model's RoPE settings as a RopeSpec and its softmax
// scale (ModelConfig::rope, ModelConfig::softmax_scale).
#include "core/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/config.h"
#include "core/error.h"

namespace tandem {

std::vector<double> rope_inv_freq(const RopeSpec& rope, int64_t head_dim) {
  TANDEM_ASSERT(head_dim >= 2 && head_dim % 2 == 0, "rope head_dim ", head_dim);
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    inv[i] = std::pow(rope.theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  }
  if (rope.scaling == RopeScaling::kLlama3) {
    const double original = static_cast<double>(rope.original_max_position);
    const double low_wavelen = original / rope.low_freq_factor;    // longer: scaled
    const double high_wavelen = original / rope.high_freq_factor;  // shorter: kept
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= rope.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (original / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - smooth) * f / rope.factor + smooth * f;
      }
    }
  }
  if (rope.scaling == RopeScaling::kYarn) {
    // Dimension pair i keeps its frequency below `low`, takes frequency / factor above `high`,
    // and a linear mix between; low and high are the pairs that turn beta_fast and beta_slow
    // times over the original context, rounded outwards.
    const double d = static_cast<double>(head_dim);
    const auto pair_of = [&](double rotations) {
      return d *
             std::log(static_cast<double>(rope.original_max_position) /
                      (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(rope.theta));
    };
    const double low = std::max(std::floor(pair_of(rope.beta_fast)), 0.0);
    double high = std::min(std::ceil(pair_of(rope.beta_slow)), d - 1);
    if (low == high) high += 0.001;
    for (size_t i = 0; i < inv.size(); ++i) {
      // transformers forms the ramp in f32; its value is exact for these small integers.
      const double ramp =
          std::clamp((static_cast<double>(static_cast<float>(i)) - low) / (high - low), 0.0, 1.0);
      const double kept = 1 - ramp;
      inv[i] = inv[i] / rope.factor * (1 - kept) + inv[i] * kept;
    }
  }
  return inv;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

double rope_attention_factor(const RopeSpec& rope) {
  if (rope.scaling != RopeScaling::kYarn) return 1.0;
  if (rope.mscale != 0 && rope.mscale_all_dim != 0) {
    return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim);
  }
  return yarn_mscale(rope.factor, 1.0);
}

RopeSpec ModelConfig::rope() const {
  RopeSpec r(rotary_base);
  if (use_rope_scaling) {
    r.scaling = RopeScaling::kLlama3;
    r.factor = rope_scaling_factor;
    r.low_freq_factor = rope_low_freq_factor;
    r.high_freq_factor = rope_high_freq_factor;
    r.original_max_position = rope_original_max_position;
  }
  if (rope_type == "yarn") {
    r.scaling = RopeScaling::kYarn;
    r.factor = rotary_scaling_factor;
    r.original_max_position = rope_original_max_position;
    r.beta_fast = yarn_beta_fast;
    r.beta_slow = yarn_beta_slow;
    r.mscale = yarn_mscale;
    r.mscale_all_dim = yarn_mscale_all_dim;
  }
  r.interleaved = rotary_interleaved;
  return r;
}

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_dim()));
  if (multi_latent_attention && rope_type == "yarn" && yarn_mscale_all_dim != 0) {
    const double m = tandem::yarn_mscale(rotary_scaling_factor, yarn_mscale_all_dim);
    s *= m * m;
  }
  return s;
}

}  // namespace tandem
