// ops::fp8_round_trip on the CPU against core/fp8.h's quantize and dequantize (themselves checked
// against a search over every code in tests/core/test_fp8.cc): every tile shape of the recipes,
// partial tiles, f64 inputs and in place.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "op_test_util.h"
#include "ops/fp8.h"

namespace tandem::ops::test {
namespace {

// Values spread over eight decades, so tiles differ in scale.
std::vector<float> spread(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> decade(-4, 3);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng) * std::pow(10.0f, static_cast<float>(decade(rng)));
  return v;
}

Tensor tensor_of(const std::vector<float>& v, int64_t rows, int64_t cols, DType dt) {
  Tensor t = make({rows, cols}, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::kF64) {
      t.data<double>()[i] = v[static_cast<size_t>(i)];
    } else {
      t.data<float>()[i] = v[static_cast<size_t>(i)];
    }
  }
  return t;
}

TEST(Fp8RoundTrip, EachRecipesTilesAsCoreQuantizes) {
  const int64_t rows = 200, cols = 300;  // partial tiles in both directions
  const std::vector<float> x = spread(rows * cols, 5);
  struct Case {
    std::string name;
    Fp8Tiles tiles;
  };
  const Case cases[] = {
      {"tensorwise e4m3", Fp8Tiles::tensorwise(fp8::Format::kE4M3, rows, cols)},
      {"tensorwise e5m2", Fp8Tiles::tensorwise(fp8::Format::kE5M2, rows, cols)},
      {"1x128 rows", Fp8Tiles::blocks(fp8::Format::kE4M3, 1, 128)},
      {"128x1 columns", Fp8Tiles::blocks(fp8::Format::kE4M3, 128, 1)},
      {"128x128 blocks", Fp8Tiles::blocks(fp8::Format::kE4M3, 128, 128)},
      {"1x128 rows e5m2", Fp8Tiles::blocks(fp8::Format::kE5M2, 1, 128)},
  };
  for (const Case& c : cases) {
    const std::vector<float> want = fp8::dequantize(fp8::quantize_blocks(
        x, rows, cols, c.tiles.tile_rows, c.tiles.tile_cols, c.tiles.format, c.tiles.power_of_two));
    for (DType dt : {DType::kF32, DType::kF64}) {
      for (bool in_place : {false, true}) {
        Tensor in = tensor_of(x, rows, cols, dt);
        Tensor out = in_place ? in : make({rows, cols}, dt);
        fp8_round_trip(out, in, c.tiles);
        int64_t differ = 0;
        for (int64_t i = 0; i < out.numel(); ++i) {
          const double got =
              dt == DType::kF64 ? out.data<double>()[i] : double{out.data<float>()[i]};
          differ += got != double{want[static_cast<size_t>(i)]};
        }
        EXPECT_EQ(differ, 0) << c.name << " " << dtype_name(dt) << (in_place ? " in place" : "");
      }
    }
  }
}

TEST(Fp8RoundTrip, ErrorIsWithinTheFormatsPrecision) {
  // Each value comes back within half a unit in the last place of its format, relative to the
  // tile's largest (3 mantissa bits: 2^-4 of a normal value; subnormals within half the tile's
  // smallest step).
  const int64_t rows = 64, cols = 256;
  const std::vector<float> x = spread(rows * cols, 9);
  Tensor in = tensor_of(x, rows, cols, DType::kF32);
  Tensor out = make({rows, cols}, DType::kF32);
  fp8_round_trip(out, in, Fp8Tiles::blocks(fp8::Format::kE4M3, 1, 128));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      float m = 0;
      for (int64_t c = c0; c < c0 + 128; ++c) m = std::fmax(m, std::fabs(x[r * cols + c]));
      const float scale = std::exp2(std::floor(std::log2(448.0f / m)));
      const float smallest_step = std::ldexp(1.0f, -9) / scale;
      for (int64_t c = c0; c < c0 + 128; ++c) {
        const float v = x[r * cols + c], got = out.data<float>()[r * cols + c];
        EXPECT_LE(std::fabs(got - v), std::fmax(std::fabs(v) / 16, smallest_step / 2))
            << r << " " << c;
      }
    }
  }
}

// x [rows, cols] through core/fp8.h's codes in tiles of [tr, tc] (power-of-two scales), or with
// one plain scale (tr = 0).
std::vector<double> through_codes(const std::vector<float>& x, int64_t rows, int64_t cols,
                                  int64_t tr, int64_t tc, fp8::Format f) {
  const fp8::Quantized q = tr == 0 ? fp8::quantize_blocks(x, rows, cols, rows, cols, f, false)
                                   : fp8::quantize_blocks(x, rows, cols, tr, tc, f, true);
  const std::vector<float> v = fp8::dequantize(q);
  return {v.begin(), v.end()};
}

// c[m][n] = sum_k a[m][k] b[n][k] (a: [M, K], b: [N, K]), naively in double.
std::vector<double> abt(const std::vector<double>& a, const std::vector<double>& b, int64_t m_size,
                        int64_t n_size, int64_t k_size) {
  std::vector<double> c(static_cast<size_t>(m_size * n_size));
  for (int64_t m = 0; m < m_size; ++m) {
    for (int64_t n = 0; n < n_size; ++n) {
      double sum = 0;
      for (int64_t k = 0; k < k_size; ++k) sum += a[m * k_size + k] * b[n * k_size + k];
      c[m * n_size + n] = sum;
    }
  }
  return c;
}

std::vector<double> transposed(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  }
  return t;
}

// max |got - want| / max |want|: the products differ only in their sums' order.
double max_abs_difference(const Tensor& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    worst = std::max(worst, std::fabs(got.data<double>()[i] - want[static_cast<size_t>(i)]));
    scale = std::max(scale, std::fabs(want[static_cast<size_t>(i)]));
  }
  return worst / scale;
}

// The three products of Note [FP8 products] against the operands rounded by core/fp8.h as the note
// says and multiplied naively in double: forward (x rows, w blocks), input gradient (dy rows in
// the backward format, w blocks), weight gradient (dy and x in columns).
TEST(Fp8Linear, EachProductQuantizesItsOperandsAlongItsSum) {
  const int64_t m = 150, in = 260, out = 140;
  const std::vector<float> x = spread(m * in, 21), w = spread(out * in, 22),
                           dy = spread(m * out, 23);
  for (Fp8Recipe recipe : {Fp8Recipe::kBlockwise, Fp8Recipe::kTensorwise}) {
    for (fp8::Format backward : {fp8::Format::kE4M3, fp8::Format::kE5M2}) {
      const Fp8Linear fp8{recipe, fp8::Format::kE4M3, backward};
      const bool blocks = recipe == Fp8Recipe::kBlockwise;
      const std::string what = std::string(blocks ? "blockwise" : "tensorwise") + " dy " +
                               std::string(enum_name(backward));
      const int64_t rows_tile = blocks ? 1 : 0, block = blocks ? 128 : 0;
      const auto xr = through_codes(x, m, in, rows_tile, 128, fp8::Format::kE4M3);
      const auto wb = through_codes(w, out, in, block, 128, fp8::Format::kE4M3);
      const auto dyr = through_codes(dy, m, out, rows_tile, 128, backward);
      const auto dyc = through_codes(dy, m, out, block, blocks ? 1 : 0, backward);
      const auto xc = through_codes(x, m, in, block, blocks ? 1 : 0, fp8::Format::kE4M3);

      Tensor y = make({m, out}, DType::kF64);
      fp8_linear_forward(y, tensor_of(x, m, in, DType::kF64), tensor_of(w, out, in, DType::kF64),
                         fp8);
      EXPECT_LT(max_abs_difference(y, abt(xr, wb, m, out, in)), kF64Tol) << what << " forward";

      Tensor dx = make({m, in}, DType::kF64);
      fp8_linear_backward_input(dx, tensor_of(dy, m, out, DType::kF64),
                                tensor_of(w, out, in, DType::kF64), fp8);
      EXPECT_LT(max_abs_difference(dx, abt(dyr, transposed(wb, out, in), m, in, out)), kF64Tol)
          << what << " input gradient";

      Tensor dw = make({out, in}, DType::kF64);
      fp8_linear_backward_weight(dw, tensor_of(dy, m, out, DType::kF64),
                                 tensor_of(x, m, in, DType::kF64), fp8);
      EXPECT_LT(
          max_abs_difference(dw, abt(transposed(dyc, m, out), transposed(xc, m, in), out, in, m)),
          kF64Tol)
          << what << " weight gradient";
    }
  }
}

}  // namespace
}  // namespace tandem::ops::test
