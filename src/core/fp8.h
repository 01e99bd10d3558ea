// FP8 numbers and the scaling of Megatron-LM's FP8 recipes (--fp8-format, --fp8-recipe), on the
// host. This is the CPU backend's emulation of FP8 training and the reference the GPU's
// quantization kernels are checked against, so every function here is bit-exact to the GPU's
// conversion and to Transformer Engine's scale arithmetic (docs/fp8.md).
//
// Note [FP8 quantization]: a tensor x is stored as codes q = fp8(x * s) and read back as
// to_float(q) * (1 / s), where s is a scale chosen so the tensor's (or the block's) largest
// magnitude lands near the format's largest finite value:
//   tensorwise  s = max / amax(x), from the tensor itself (Transformer Engine's "current scaling");
//   delayed     s = max / amax / 2^margin, amax taken from the last amax-history-len steps' amaxes
//               (the step's own amax joins the history after the step: DelayedScaling);
//   blockwise   one s per 1x128 tile of a row (activations and gradients) or per 128x128 block
//               (weights), rounded down to a power of two (DeepSeek-V3's recipe as Transformer
//               Engine's Float8BlockScaling implements it).
// The conversion rounds to nearest, ties to even, and saturates: a magnitude past the largest
// finite value becomes that value (CUDA's __NV_SATFINITE, which Transformer Engine uses), so a
// scale that is too large clips rather than overflows. NaN stays NaN.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/enum_names.h"

namespace tandem::fp8 {

// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, largest 448 (the "fn" variant
// of the OCP FP8 formats); E5M2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like with
// infinities, largest 57344.
enum class Format : uint8_t { kE4M3, kE5M2 };
inline constexpr EnumName<Format> kFormatNames[] = {{Format::kE4M3, "e4m3"},
                                                    {Format::kE5M2, "e5m2"}};
constexpr std::span<const EnumName<Format>> enum_names(Format) { return kFormatNames; }

// The largest finite value of a format.
float max_finite(Format format);
// The code of x: round to nearest even, saturating to +-max_finite; NaN -> 0x7f with x's sign.
uint8_t from_float(float x, Format format);
// The value of a code (NaN for E4M3's 0x7f/0xff and E5M2's NaNs, +-inf for E5M2's infinities).
float to_float(uint8_t code, Format format);

// Transformer Engine's scale from an amax: max / max(amax, epsilon) in float; 1 where that amax is
// 0 or infinite (NaN stays NaN: the step's NaN check sees it); the largest float where the
// quotient overflows; with power_of_two, rounded down to a power of two by clearing the mantissa
// bits.
float scale_from_amax(float amax, float max, bool power_of_two = false, float epsilon = 0.0f);

// The larger of a and b, NaN if either is (std::fmax would drop a NaN and hide it from the step's
// NaN check): the amax's reduction.
float nan_max(float a, float b);
// The largest magnitude of xs (0 for none; NaN if any is NaN).
float amax(std::span<const float> xs);

// Calls fn(r0, r1, c0, c1) for each tile [r0, r1) x [c0, c1) of a [rows, cols] matrix cut into
// tiles of [tile_rows, tile_cols] (the last of a row or column holding what is left), tile rows
// first.
template <typename Fn>
void for_each_tile(int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols, Fn&& fn) {
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    for (int64_t c0 = 0; c0 < cols; c0 += tile_cols) {
      fn(r0, r0 + tile_rows < rows ? r0 + tile_rows : rows, c0,
         c0 + tile_cols < cols ? c0 + tile_cols : cols);
    }
  }
}

// A quantized matrix: codes row-major as the source, and the reciprocal scale of each block
// (block-major: block (i, j) at i * block_cols + j), so that x[r][c] ~ to_float(code) * scale_inv.
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
  int64_t rows = 0, cols = 0, tile_rows = 0, tile_cols = 0;
  Format format = Format::kE4M3;
  int64_t block_cols() const { return (cols + tile_cols - 1) / tile_cols; }
  // The value code i stands for.
  float value(int64_t r, int64_t c) const;
};

// Quantizes the [rows, cols] matrix x with one scale for the whole tensor.
Quantized quantize_with_scale(std::span<const float> x, int64_t rows, int64_t cols, float scale,
                              Format format);
// Quantizes x in tiles of [tile_rows, tile_cols] (1x128 or 128x128; the last tiles of a row or
// column hold what is left), each with its own power-of-two scale from its own amax.
Quantized quantize_blocks(std::span<const float> x, int64_t rows, int64_t cols, int64_t tile_rows,
                          int64_t tile_cols, Format format, bool power_of_two = true);
// The matrix the codes stand for.
std::vector<float> dequantize(const Quantized& q);

// --fp8-amax-compute-algo: the amax a delayed scale is computed from.
enum class AmaxAlgo : uint8_t { kMax, kMostRecent };
inline constexpr EnumName<AmaxAlgo> kAmaxAlgoNames[] = {{AmaxAlgo::kMax, "max"},
                                                        {AmaxAlgo::kMostRecent, "most_recent"}};
constexpr std::span<const EnumName<AmaxAlgo>> enum_names(AmaxAlgo) { return kAmaxAlgoNames; }

// One tensor's delayed scaling (Transformer Engine's DelayedScaling): the step quantizes with
// scale(), records its amax into the newest slot of the history, and update() then computes the
// next scale from the history (its maximum, or its newest entry), rolls the history one slot
// (the oldest entry drops out) and opens a zero newest slot. The scale stays as it was while the
// amax it would come from is 0 or not finite. The first step quantizes with scale 1.
class DelayedScaling {
 public:
  DelayedScaling(int64_t history_len, AmaxAlgo algo, int margin, Format format);
  float scale() const { return scale_; }
  void record(float amax);
  void update();
  // Newest first.
  const std::vector<float>& history() const { return history_; }

 private:
  std::vector<float> history_;  // history_[0] the step in progress
  AmaxAlgo algo_;
  int margin_;
  Format format_;
  float scale_ = 1.0f;
};

}  // namespace tandem::fp8
