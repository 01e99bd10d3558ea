// Rotary position embedding's frequencies (docs/model.md "Rotary position embedding"): the
// settings the ops take (RopeSpec) and the inverse frequencies both backends rotate by. The
// model's settings become a RopeSpec in ModelConfig::rope() (core/rope.cc).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

// How RoPE's frequencies are scaled (docs/model.md "Rotary position embedding"): not at all, as
// Llama 3 scales them for a context longer than the one it was trained at, or as YaRN does
// (DeepSeek-V3).
enum class RopeScaling : uint8_t { kNone, kLlama3, kYarn };

// RoPE's frequencies, as the ops take them: the base theta and the scaling.
struct RopeSpec {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 8.0;            // Llama 3: low frequencies divided by this
  double low_freq_factor = 1.0;   // Llama 3: wavelengths above original / low_freq_factor scaled
  double high_freq_factor = 4.0;  // Llama 3: below original / high_freq_factor kept
  int64_t original_max_position = 8192;  // Llama 3, YaRN: the context the model was trained at
  double beta_fast = 32.0;               // YaRN: rotations above which a frequency is kept
  double beta_slow = 1.0;                // YaRN: rotations below which it is divided by factor
  double mscale = 1.0;                   // YaRN: cos and sin scaled by attention_factor()
  double mscale_all_dim = 0.0;           // YaRN: see attention_factor() and mla_softmax_scale()
  // --rotary-interleaved (DeepSeek-V3's rope_interleave): the pairs rotated together are the
  // neighbouring columns (2i, 2i + 1), written out as rotate_half's (i, i + D/2).
  bool interleaved = false;

  RopeSpec() = default;
  explicit RopeSpec(double base) : theta(base) {}
};

// inv_freq[i] for i < head_dim / 2, in double: theta^(-2i / head_dim), then scaled as `rope`
// says (Llama 3: wavelengths 2 pi / inv_freq above original / low_freq_factor divided by factor,
// below original / high_freq_factor kept, interpolated between). Both backends rotate by these.
std::vector<double> rope_inv_freq(const RopeSpec& rope, int64_t head_dim);
// YaRN's m(s, x) = 0.1 x ln(s) + 1 for s > 1, else 1.
double yarn_mscale(double factor, double mscale);
// What cos and sin are multiplied by: YaRN's m(factor, mscale) / m(factor, mscale_all_dim)
// (m(factor, 1) when either is 0); 1 otherwise.
double rope_attention_factor(const RopeSpec& rope);

}  // namespace tandem
