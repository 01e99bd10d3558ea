// FP8 conversion and scaling (core/fp8.h) against references written independently: the codes'
// values from the formats' definitions, rounding by a search over every code, and the recipes'
// scales worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"

namespace tandem::fp8 {
namespace {

constexpr Format kFormats[] = {Format::kE4M3, Format::kE5M2};

bool finite_code(uint8_t c, Format f) { return std::isfinite(to_float(c, f)); }

// The code nearest x by a search over every finite code: the smaller distance wins; a tie goes
// to the code whose last mantissa bit is 0; past the largest finite value, that value.
uint8_t nearest_by_search(float x, Format f) {
  const double a = std::fabs(static_cast<double>(x));
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x80; ++c) {
    if (!finite_code(static_cast<uint8_t>(c), f)) continue;
    const double d = std::fabs(static_cast<double>(to_float(static_cast<uint8_t>(c), f)) - a);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_distance = d;
    }
  }
  return static_cast<uint8_t>(best | sign);
}

TEST(Fp8, CodesHoldTheFormatsValues) {
  EXPECT_EQ(to_float(0x00, Format::kE4M3), 0.0f);
  EXPECT_EQ(to_float(0x01, Format::kE4M3), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(to_float(0x07, Format::kE4M3), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(to_float(0x08, Format::kE4M3), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(to_float(0x38, Format::kE4M3), 1.0f);
  EXPECT_EQ(to_float(0x39, Format::kE4M3), 1.125f);
  EXPECT_EQ(to_float(0x7e, Format::kE4M3), 448.0f);
  EXPECT_EQ(to_float(0xfe, Format::kE4M3), -448.0f);
  EXPECT_TRUE(std::isnan(to_float(0x7f, Format::kE4M3)));
  EXPECT_TRUE(std::isnan(to_float(0xff, Format::kE4M3)));
  EXPECT_EQ(to_float(0x01, Format::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(to_float(0x04, Format::kE5M2), std::ldexp(1.0f, -14));
  EXPECT_EQ(to_float(0x3c, Format::kE5M2), 1.0f);
  EXPECT_EQ(to_float(0x3d, Format::kE5M2), 1.25f);
  EXPECT_EQ(to_float(0x7b, Format::kE5M2), 57344.0f);
  EXPECT_EQ(to_float(0x7c, Format::kE5M2), std::numeric_limits<float>::infinity());
  EXPECT_EQ(to_float(0xfc, Format::kE5M2), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(to_float(0x7d, Format::kE5M2)));
  EXPECT_EQ(max_finite(Format::kE4M3), 448.0f);
  EXPECT_EQ(max_finite(Format::kE5M2), 57344.0f);
  for (Format f : kFormats) {
    int finite = 0;
    for (int c = 1; c < 0x80; ++c) {
      if (!finite_code(static_cast<uint8_t>(c), f)) continue;
      ++finite;
      EXPECT_LT(to_float(static_cast<uint8_t>(c - 1), f), to_float(static_cast<uint8_t>(c), f));
    }
    EXPECT_EQ(finite, f == Format::kE4M3 ? 126 : 123);  // besides zero
  }
}

TEST(Fp8, EveryFiniteCodeRoundTrips) {
  for (Format f : kFormats) {
    for (int c = 0; c < 0x100; ++c) {
      const auto code = static_cast<uint8_t>(c);
      if (!finite_code(code, f)) continue;
      EXPECT_EQ(from_float(to_float(code, f), f), code) << c;
    }
  }
}

TEST(Fp8, RoundsToNearestEvenAsASearchOverEveryCode) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-22, 17);
  for (Format f : kFormats) {
    std::vector<float> xs;
    // Every midpoint between neighbouring codes (the ties), and the floats on either side.
    for (int c = 0; c + 1 < 0x80; ++c) {
      const auto lo = static_cast<uint8_t>(c), hi = static_cast<uint8_t>(c + 1);
      if (!finite_code(hi, f)) continue;
      const float mid = (to_float(lo, f) + to_float(hi, f)) / 2;
      xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
    }
    for (int i = 0; i < 20000; ++i) xs.push_back(std::ldexp(mantissa(rng), exponent(rng)));
    for (float x : xs) {
      EXPECT_EQ(from_float(x, f), nearest_by_search(x, f)) << x;
      EXPECT_EQ(from_float(-x, f), nearest_by_search(-x, f)) << -x;
    }
  }
}

TEST(Fp8, SaturatesAndKeepsNaN) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(from_float(449.0f, Format::kE4M3), 0x7e);
  EXPECT_EQ(from_float(1e30f, Format::kE4M3), 0x7e);
  EXPECT_EQ(from_float(kInf, Format::kE4M3), 0x7e);
  EXPECT_EQ(from_float(-kInf, Format::kE4M3), 0xfe);
  EXPECT_EQ(from_float(kInf, Format::kE5M2), 0x7b);
  EXPECT_EQ(from_float(-1e30f, Format::kE5M2), 0xfb);
  EXPECT_EQ(from_float(std::numeric_limits<float>::quiet_NaN(), Format::kE4M3), 0x7f);
  EXPECT_EQ(from_float(-std::numeric_limits<float>::quiet_NaN(), Format::kE5M2), 0xff);
  EXPECT_EQ(from_float(-0.0f, Format::kE4M3), 0x80);
  // Half the smallest subnormal is a tie between 0 and it: 0 (even).
  EXPECT_EQ(from_float(std::ldexp(1.0f, -10), Format::kE4M3), 0x00);
  EXPECT_EQ(from_float(std::nextafter(std::ldexp(1.0f, -10), 1.0f), Format::kE4M3), 0x01);
}

TEST(Fp8, ScalesFollowTransformerEnginesRule) {
  EXPECT_EQ(scale_from_amax(2.0f, 448.0f), 224.0f);
  EXPECT_EQ(scale_from_amax(3.0f, 448.0f), 448.0f / 3.0f);
  EXPECT_EQ(scale_from_amax(3.0f, 448.0f, true), 128.0f);  // 149.3 down to a power of two
  EXPECT_EQ(scale_from_amax(0.0f, 448.0f), 1.0f);
  EXPECT_EQ(scale_from_amax(std::numeric_limits<float>::infinity(), 448.0f), 1.0f);
  EXPECT_EQ(scale_from_amax(1e-44f, 448.0f), std::numeric_limits<float>::max());
  EXPECT_EQ(scale_from_amax(1e-3f, 448.0f, false, 1.0f), 448.0f);  // amax raised to epsilon
  EXPECT_TRUE(std::isnan(scale_from_amax(std::numeric_limits<float>::quiet_NaN(), 448.0f)));
  EXPECT_EQ(amax(std::vector<float>{1.0f, -5.0f, 2.0f}), 5.0f);
  EXPECT_TRUE(std::isnan(amax(std::vector<float>{1.0f, std::nanf(""), 2.0f})));
}

// A [rows, cols] matrix whose blocks differ in magnitude by powers of ten.
std::vector<float> graded(int64_t rows, int64_t cols) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      x[static_cast<size_t>(r * cols + c)] =
          n(rng) * std::pow(10.0f, static_cast<float>((r + c / 128) % 5) - 2);
    }
  }
  return x;
}

void expect_blocks(const std::vector<float>& x, const Quantized& q) {
  const std::vector<float> y = dequantize(q);
  for (int64_t bi = 0; bi * q.tile_rows < q.rows; ++bi) {
    for (int64_t bj = 0; bj < q.block_cols(); ++bj) {
      float m = 0.0f;
      for (int64_t r = bi * q.tile_rows; r < std::min(q.rows, (bi + 1) * q.tile_rows); ++r) {
        for (int64_t c = bj * q.tile_cols; c < std::min(q.cols, (bj + 1) * q.tile_cols); ++c) {
          m = std::fmax(m, std::fabs(x[static_cast<size_t>(r * q.cols + c)]));
        }
      }
      const float scale = 1.0f / q.scale_inv[static_cast<size_t>(bi * q.block_cols() + bj)];
      // The block's own power-of-two scale: its amax lands in (max / 2, max].
      EXPECT_EQ(scale, std::exp2(std::floor(std::log2(max_finite(q.format) / m))));
      EXPECT_LE(m * scale, max_finite(q.format));
      EXPECT_GT(m * scale, max_finite(q.format) / 2);
      for (int64_t r = bi * q.tile_rows; r < std::min(q.rows, (bi + 1) * q.tile_rows); ++r) {
        for (int64_t c = bj * q.tile_cols; c < std::min(q.cols, (bj + 1) * q.tile_cols); ++c) {
          const auto i = static_cast<size_t>(r * q.cols + c);
          EXPECT_EQ(q.codes[i], from_float(x[i] * scale, q.format));
          EXPECT_EQ(y[i], to_float(q.codes[i], q.format) / scale);
        }
      }
    }
  }
}

TEST(Fp8, TilesAndBlocksEachHaveTheirOwnScale) {
  const int64_t rows = 130, cols = 300;  // partial tiles at both edges
  const std::vector<float> x = graded(rows, cols);
  const Quantized tiles = quantize_blocks(x, rows, cols, 1, 128, Format::kE4M3);
  EXPECT_EQ(tiles.scale_inv.size(), size_t{130 * 3});
  expect_blocks(x, tiles);
  const Quantized blocks = quantize_blocks(x, rows, cols, 128, 128, Format::kE5M2);
  EXPECT_EQ(blocks.scale_inv.size(), size_t{2 * 3});
  expect_blocks(x, blocks);
  // Blocks three decades apart get scales three decades apart, within a factor of 2 each.
  const float first = tiles.scale_inv[0], fourth = tiles.scale_inv[3 * 3];
  EXPECT_NEAR(std::log10(fourth / first), 3.0, std::log10(2.0) * 2 + 0.5);
}

TEST(Fp8, OneScaleForTheWholeTensor) {
  const std::vector<float> x = graded(4, 200);
  const float scale = scale_from_amax(amax(x), max_finite(Format::kE4M3));
  const Quantized q = quantize_with_scale(x, 4, 200, scale, Format::kE4M3);
  ASSERT_EQ(q.scale_inv.size(), size_t{1});
  EXPECT_EQ(q.scale_inv[0], 1.0f / scale);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(q.codes[i], from_float(x[i] * scale, Format::kE4M3));
}

TEST(Fp8, DelayedScalingUsesTheLastStepsAmaxes) {
  // History of 3 steps, margin 1 (the scale halved): amaxes 2, 8, 1, 1, 1, then 0.
  DelayedScaling by_max(3, AmaxAlgo::kMax, 1, Format::kE4M3);
  DelayedScaling by_newest(3, AmaxAlgo::kMostRecent, 1, Format::kE4M3);
  const float amaxes[] = {2, 8, 1, 1, 1, 0};
  const float want_max[] = {112, 28, 28, 28, 224, 224};       // max over the last 3
  const float want_newest[] = {112, 28, 224, 224, 224, 224};  // 0 keeps the scale
  EXPECT_EQ(by_max.scale(), 1.0f);
  for (int step = 0; step < 6; ++step) {
    by_max.record(amaxes[step] / 2);  // two records in one step: their max counts
    by_max.record(amaxes[step]);
    by_newest.record(amaxes[step]);
    by_max.update();
    by_newest.update();
    EXPECT_EQ(by_max.scale(), want_max[step]) << step;
    EXPECT_EQ(by_newest.scale(), want_newest[step]) << step;
    EXPECT_EQ(by_max.history()[0], 0.0f);
  }
  EXPECT_EQ(by_max.history(), (std::vector<float>{0, 0, 1}));
}

}  // namespace
}  // namespace tandem::fp8
