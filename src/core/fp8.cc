#include "core/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tandem::fp8 {
namespace {

struct Layout {
  int mantissa_bits;
  int bias;
  float max;         // largest finite value
  uint8_t max_code;  // its code
};

constexpr Layout layout(Format format) {
  return format == Format::kE4M3 ? Layout{3, 7, 448.0f, 0x7e} : Layout{2, 15, 57344.0f, 0x7b};
}

}  // namespace

float nan_max(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::fmax(a, b);
}

float max_finite(Format format) { return layout(format).max; }

// The magnitude is rounded on the format's grid: below the smallest normal the grid's spacing is
// that of the subnormals, 2^(1 - bias - mantissa_bits); in binade [2^e, 2^(e+1)) it is
// 2^(e - mantissa_bits). Dividing by a power of two is exact in double, so nearbyint's
// round-half-even on the quotient is the format's rounding; a carry into the next binade
// (15.5 -> 16 in E4M3) is a value on the grid too, and the encoding below reads it as such.
uint8_t from_float(float x, Format format) {
  const Layout l = layout(format);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(0x7f | sign);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= l.max) return static_cast<uint8_t>(l.max_code | sign);
  if (a == 0.0) return sign;
  const int emin = 1 - l.bias;  // exponent of the smallest normal
  int e = std::ilogb(a);
  if (e < emin) e = emin;
  const double quantum = std::ldexp(1.0, e - l.mantissa_bits);
  const double rounded = std::nearbyint(a / quantum) * quantum;
  if (rounded >= l.max) return static_cast<uint8_t>(l.max_code | sign);
  if (rounded == 0.0) return sign;
  int exponent = std::ilogb(rounded);
  uint32_t code;
  if (exponent < emin) {  // subnormal: exponent field 0
    code = static_cast<uint32_t>(rounded / std::ldexp(1.0, emin - l.mantissa_bits));
  } else {
    const auto mantissa = static_cast<uint32_t>(
        rounded / std::ldexp(1.0, exponent - l.mantissa_bits) - std::ldexp(1.0, l.mantissa_bits));
    code = (static_cast<uint32_t>(exponent + l.bias) << l.mantissa_bits) | mantissa;
  }
  return static_cast<uint8_t>(code | sign);
}

float to_float(uint8_t code, Format format) {
  const Layout l = layout(format);
  const bool negative = (code & 0x80) != 0;
  const uint32_t magnitude = code & 0x7f;
  const uint32_t field = magnitude >> l.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << l.mantissa_bits) - 1);
  float v;
  if (format == Format::kE4M3 && magnitude == 0x7f) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (format == Format::kE5M2 && field == 31) {
    v = mantissa == 0 ? std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::quiet_NaN();
  } else if (field == 0) {
    v = std::ldexp(static_cast<float>(mantissa), 1 - l.bias - l.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<float>((1u << l.mantissa_bits) | mantissa),
                   static_cast<int>(field) - l.bias - l.mantissa_bits);
  }
  return negative ? -v : v;
}

float scale_from_amax(float amax, float max, bool power_of_two, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  if (std::isinf(amax) || amax == 0.0f) return 1.0f;
  float scale = max / amax;
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  if (power_of_two) scale = std::bit_cast<float>(std::bit_cast<uint32_t>(scale) & 0xff800000u);
  return scale;
}

float amax(std::span<const float> xs) {
  float m = 0.0f;
  for (float x : xs) m = nan_max(m, std::fabs(x));
  return m;
}

float Quantized::value(int64_t r, int64_t c) const {
  const int64_t block = (r / tile_rows) * block_cols() + c / tile_cols;
  return to_float(codes[static_cast<size_t>(r * cols + c)], format) *
         scale_inv[static_cast<size_t>(block)];
}

namespace {

Quantized empty_like(int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                     Format format, std::span<const float> x) {
  TANDEM_ASSERT(rows >= 0 && cols >= 0 && tile_rows > 0 && tile_cols > 0 &&
                    static_cast<int64_t>(x.size()) == rows * cols,
                "fp8 quantization of ", x.size(), " values as [", rows, ", ", cols,
                "] in tiles of [", tile_rows, ", ", tile_cols, "]");
  Quantized q;
  q.rows = rows;
  q.cols = cols;
  q.tile_rows = tile_rows;
  q.tile_cols = tile_cols;
  q.format = format;
  q.codes.resize(static_cast<size_t>(rows * cols));
  q.scale_inv.resize(static_cast<size_t>(((rows + tile_rows - 1) / tile_rows) * q.block_cols()));
  return q;
}

// Quantizes tile [r0, r1) x [c0, c1) of q's source x with `scale`.
void quantize_tile(std::span<const float> x, Quantized& q, int64_t r0, int64_t r1, int64_t c0,
                   int64_t c1, float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const auto i = static_cast<size_t>(r * q.cols + c);
      q.codes[i] = from_float(x[i] * scale, q.format);
    }
  }
  q.scale_inv[static_cast<size_t>((r0 / q.tile_rows) * q.block_cols() + c0 / q.tile_cols)] =
      1.0f / scale;
}

}  // namespace

Quantized quantize_with_scale(std::span<const float> x, int64_t rows, int64_t cols, float scale,
                              Format format) {
  Quantized q =
      empty_like(rows, cols, std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1), format, x);
  if (!q.scale_inv.empty()) quantize_tile(x, q, 0, rows, 0, cols, scale);
  return q;
}

Quantized quantize_blocks(std::span<const float> x, int64_t rows, int64_t cols, int64_t tile_rows,
                          int64_t tile_cols, Format format, bool power_of_two) {
  Quantized q = empty_like(rows, cols, tile_rows, tile_cols, format, x);
  for_each_tile(
      rows, cols, tile_rows, tile_cols, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
        float m = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          m = nan_max(
              m, amax(x.subspan(static_cast<size_t>(r * cols + c0), static_cast<size_t>(c1 - c0))));
        }
        quantize_tile(x, q, r0, r1, c0, c1, scale_from_amax(m, max_finite(format), power_of_two));
      });
  return q;
}

std::vector<float> dequantize(const Quantized& q) {
  std::vector<float> out(q.codes.size());
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) out[static_cast<size_t>(r * q.cols + c)] = q.value(r, c);
  }
  return out;
}

DelayedScaling::DelayedScaling(int64_t history_len, AmaxAlgo algo, int margin, Format format)
    : history_(static_cast<size_t>(history_len), 0.0f),
      algo_(algo),
      margin_(margin),
      format_(format) {
  TANDEM_ASSERT(history_len >= 1, "an amax history of ", history_len, " steps");
}

void DelayedScaling::record(float amax) { history_[0] = nan_max(history_[0], amax); }

void DelayedScaling::update() {
  float a = history_[0];
  if (algo_ == AmaxAlgo::kMax) {
    for (float h : history_) a = nan_max(a, h);
  }
  if (std::isfinite(a) && a > 0.0f) {
    float scale = (max_finite(format_) / a) / std::exp2(static_cast<float>(margin_));
    if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
    scale_ = scale;
  }
  for (size_t i = history_.size() - 1; i > 0; --i) history_[i] = history_[i - 1];
  history_[0] = 0.0f;
}

}  // namespace tandem::fp8
