// RMSNorm and rotary embedding on CPU.
// Oracles: the formulas of docs/model.md written out in plain loops (rope with explicit angles and
// an explicit rotate_half vector); fp64 central finite differences for the backwards; the f64 op
// for the f32 op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

constexpr double kEps = 1e-5;

TEST(RmsNorm, ForwardMatchesFormula) {
  std::mt19937_64 rng(10);
  const int64_t n = 3, h = 6;
  Tensor x = random({n, h}, DType::kF64, rng, -2, 2), g = random({h}, DType::kF64, rng);
  Tensor y = make({n, h}, DType::kF64), rstd = make({n}, DType::kF64);
  rmsnorm_forward(y, rstd, x, g, kEps);
  for (int64_t r = 0; r < n; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < h; ++c) ms += std::pow(x.data<double>()[r * h + c], 2) / h;
    const double want_rstd = 1 / std::sqrt(ms + kEps);
    EXPECT_NEAR(rstd.data<double>()[r], want_rstd, kF64Tol * want_rstd);
    for (int64_t c = 0; c < h; ++c) {
      EXPECT_NEAR(y.data<double>()[r * h + c],
                  x.data<double>()[r * h + c] * want_rstd * g.data<double>()[c], kF64Tol);
    }
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(11);
  const int64_t n = 4, h = 5;
  Tensor x = random({n, h}, DType::kF64, rng, -2, 2), g = random({h}, DType::kF64, rng);
  Tensor y = make({n, h}, DType::kF64), rstd = make({n}, DType::kF64);
  Tensor up = random({n, h}, DType::kF64, rng);
  auto loss = [&] {
    rmsnorm_forward(y, rstd, x, g, kEps);
    return dot(y, up);
  };
  loss();
  Tensor dx = random({n, h}, DType::kF64, rng);  // garbage that kOverwrite must ignore
  Tensor dg = make({h}, DType::kF64);
  rmsnorm_backward(dx, dg, up, x, g, rstd, Accumulate::kOverwrite);
  expect_grad(dx, numeric_grad(x, loss), "dx");
  expect_grad(dg, numeric_grad(g, loss), "dg");
}

TEST(RmsNorm, DxHonoursAccumulateAndDgAlwaysAdds) {
  std::mt19937_64 rng(12);
  const int64_t n = 3, h = 4;
  Tensor x = random({n, h}, DType::kF64, rng), g = random({h}, DType::kF64, rng);
  Tensor y = make({n, h}, DType::kF64), rstd = make({n}, DType::kF64);
  Tensor up = random({n, h}, DType::kF64, rng);
  rmsnorm_forward(y, rstd, x, g, kEps);
  Tensor dx_ref = make({n, h}, DType::kF64), dg_ref = make({h}, DType::kF64);
  rmsnorm_backward(dx_ref, dg_ref, up, x, g, rstd, Accumulate::kOverwrite);
  Tensor base = random({n, h}, DType::kF64, rng), gbase = random({h}, DType::kF64, rng);
  Tensor dx = clone(base), dg = clone(gbase);
  rmsnorm_backward(dx, dg, up, x, g, rstd, Accumulate::kAdd);
  for (int64_t i = 0; i < n * h; ++i) {
    EXPECT_NEAR(dx.data<double>()[i], base.data<double>()[i] + dx_ref.data<double>()[i], 1e-15);
  }
  for (int64_t i = 0; i < h; ++i) {
    EXPECT_NEAR(dg.data<double>()[i], gbase.data<double>()[i] + dg_ref.data<double>()[i], 1e-15);
  }
}

TEST(RmsNorm, F32MatchesF64) {
  std::mt19937_64 rng(13);
  const int64_t n = 8, h = 32;
  Tensor x = random({n, h}, DType::kF64, rng, -2, 2), g = random({h}, DType::kF64, rng);
  Tensor up = random({n, h}, DType::kF64, rng);
  Tensor res[2][4];  // y, rstd, dx, dg for f64 then f32
  for (int i = 0; i < 2; ++i) {
    const DType dt = i == 0 ? DType::kF64 : DType::kF32;
    auto cvt = [&](const Tensor& t) { return i == 0 ? clone(t) : to_f32(t); };
    Tensor xi = cvt(x), gi = cvt(g), ui = cvt(up);
    res[i][0] = make({n, h}, dt), res[i][1] = make({n}, dt);
    res[i][2] = make({n, h}, dt), res[i][3] = make({h}, dt);
    rmsnorm_forward(res[i][0], res[i][1], xi, gi, kEps);
    rmsnorm_backward(res[i][2], res[i][3], ui, xi, gi, res[i][1], Accumulate::kOverwrite);
  }
  const char* names[4] = {"y", "rstd", "dx", "dg"};
  for (int j = 0; j < 4; ++j) expect_f32_close(res[1][j], res[0][j], names[j]);
}

// rope(u) at position pos written out from docs/model.md, one head of width d.
std::vector<double> naive_rope(const double* u, int64_t d, int64_t pos, double theta) {
  std::vector<double> cosv(d), sinv(d), rot(d), out(d);
  for (int64_t c = 0; c < d; ++c) {
    const int64_t i = c % (d / 2);  // cos/sin duplicated over both halves
    const double ang = static_cast<double>(pos) * std::pow(theta, -2.0 * i / d);
    cosv[c] = std::cos(ang);
    sinv[c] = std::sin(ang);
    rot[c] = c < d / 2 ? -u[c + d / 2] : u[c - d / 2];  // rotate_half
  }
  for (int64_t c = 0; c < d; ++c) out[c] = u[c] * cosv[c] + rot[c] * sinv[c];
  return out;
}

TEST(Rope, ForwardMatchesExplicitAnglesAndPositionsWrapPerSequence) {
  std::mt19937_64 rng(14);
  const int64_t seq = 5, batch = 2, heads = 3, d = 8;
  const RopeSpec theta(10000);
  Tensor x = random({batch * seq, heads * d}, DType::kF64, rng);
  Tensor out = make(x.shape(), DType::kF64);
  rope_forward(out, x, seq, heads, d, theta);
  for (int64_t r = 0; r < batch * seq; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const auto want =
          naive_rope(x.data<double>() + r * heads * d + h * d, d, r % seq, theta.theta);
      for (int64_t c = 0; c < d; ++c) {
        EXPECT_NEAR(out.data<double>()[r * heads * d + h * d + c], want[c], 1e-14)
            << "row " << r << " head " << h << " col " << c;
      }
    }
  }
  // Position 0 is the identity; the first row of the second sequence is position 0 again.
  for (int64_t c = 0; c < heads * d; ++c) {
    EXPECT_EQ(out.data<double>()[c], x.data<double>()[c]);
    EXPECT_EQ(out.data<double>()[seq * heads * d + c], x.data<double>()[seq * heads * d + c]);
  }
  // In place gives the same values.
  Tensor inplace = clone(x);
  rope_forward(inplace, inplace, seq, heads, d, theta);
  EXPECT_EQ(values(inplace), values(out));
}

TEST(Rope, BackwardMatchesFiniteDifferencesAndInvertsForward) {
  std::mt19937_64 rng(15);
  const int64_t seq = 4, heads = 2, d = 6;
  const RopeSpec theta(100);  // large angles at small d, so every frequency matters
  Tensor x = random({2 * seq, heads * d}, DType::kF64, rng);
  Tensor out = make(x.shape(), DType::kF64), up = random(x.shape(), DType::kF64, rng);
  Tensor dx = make(x.shape(), DType::kF64);
  rope_backward(dx, up, seq, heads, d, theta);
  expect_grad(dx,
              numeric_grad(x,
                           [&] {
                             rope_forward(out, x, seq, heads, d, theta);
                             return dot(out, up);
                           }),
              "dx");
  // In place, and the inverse of the forward.
  Tensor roundtrip = make(x.shape(), DType::kF64);
  rope_forward(roundtrip, x, seq, heads, d, theta);
  rope_backward(roundtrip, roundtrip, seq, heads, d, theta);
  EXPECT_LE(rel_err(values(roundtrip), values(x)), 1e-15);
}

TEST(Rope, F32MatchesF64AndOddHeadDimThrows) {
  std::mt19937_64 rng(16);
  const int64_t seq = 128, heads = 2, d = 32;
  Tensor x = random({seq, heads * d}, DType::kF64, rng);
  Tensor o64 = make(x.shape(), DType::kF64), o32 = make(x.shape(), DType::kF32);
  rope_forward(o64, x, seq, heads, d, RopeSpec(10000));
  rope_forward(o32, to_f32(x), seq, heads, d, RopeSpec(10000));
  expect_f32_close(o32, o64, "rope");
  Tensor odd = make({2, 6}, DType::kF32);
  EXPECT_THROW(rope_forward(odd, odd, 2, 2, 3, RopeSpec(10000)), Error);
}

TEST(Rope, QkIsTheSingleTensorOpOnEach) {
  std::mt19937_64 rng(17);
  const int64_t seq = 6, batch = 2, heads = 4, kv_heads = 2, d = 8;
  const Tensor q0 = random({batch * seq, heads * d}, DType::kF64, rng);
  const Tensor k0 = random({batch * seq, kv_heads * d}, DType::kF64, rng);
  for (bool backward : {false, true}) {
    auto rope_qk = backward ? rope_backward_qk : rope_forward_qk;
    auto rope = backward ? rope_backward : rope_forward;
    Tensor q = clone(q0), k = clone(k0);
    rope_qk(q, k, seq, heads, kv_heads, d, RopeSpec(500));
    Tensor q_want = make(q0.shape(), DType::kF64), k_want = make(k0.shape(), DType::kF64);
    rope(q_want, q0, seq, heads, d, RopeSpec(500));
    rope(k_want, k0, seq, kv_heads, d, RopeSpec(500));
    EXPECT_EQ(values(q), values(q_want)) << (backward ? "backward" : "forward");
    EXPECT_EQ(values(k), values(k_want)) << (backward ? "backward" : "forward");
  }
  // k's shape is checked before q is written.
  Tensor q = clone(q0), k_short = make({batch * seq - 1, kv_heads * d}, DType::kF64);
  EXPECT_THROW(rope_forward_qk(q, k_short, seq, heads, kv_heads, d, RopeSpec(500)), Error);
  EXPECT_THROW(rope_forward_qk(q, clone(k0), seq, heads, heads, d, RopeSpec(500)), Error);
  EXPECT_EQ(values(q), values(q0));
}

// Positions of their own (--document-positions): at r % seq the plain op; each row rotated as
// the plain op rotates the row of a sequence at that position; positions outside [0, seq)
// refused, nothing written.
TEST(Rope, QkAtPositionsRotatesEachRowAtItsPosition) {
  std::mt19937_64 rng(23);
  const int64_t seq = 5, batch = 2, heads = 2, kv_heads = 1, d = 4;
  const Tensor q0 = random({batch * seq, heads * d}, DType::kF64, rng);
  const Tensor k0 = random({batch * seq, kv_heads * d}, DType::kF64, rng);
  const auto i32 = [](std::vector<int32_t> v) {
    Tensor t = make({static_cast<int64_t>(v.size())}, DType::kI32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  };
  for (bool backward : {false, true}) {
    auto plain = backward ? rope_backward_qk : rope_forward_qk;
    auto at = backward ? rope_backward_qk_at : rope_forward_qk_at;
    Tensor q = clone(q0), k = clone(k0), q_want = clone(q0), k_want = clone(k0);
    at(q, k, seq, heads, kv_heads, d, RopeSpec(500), i32({0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
    plain(q_want, k_want, seq, heads, kv_heads, d, RopeSpec(500));
    EXPECT_EQ(values(q), values(q_want));
    EXPECT_EQ(values(k), values(k_want));
    // Restarted positions: row 7 at position 0 is the plain op's row 5 when given row 7's input.
    q = clone(q0);
    k = clone(k0);
    at(q, k, seq, heads, kv_heads, d, RopeSpec(500), i32({0, 1, 2, 0, 1, 0, 1, 0, 1, 2}));
    Tensor moved = clone(q0);
    for (int64_t j = 0; j < heads * d; ++j) {
      moved.data<double>()[5 * heads * d + j] = q0.data<double>()[7 * heads * d + j];
    }
    Tensor k_moved = clone(k0);
    plain(moved, k_moved, seq, heads, kv_heads, d, RopeSpec(500));
    for (int64_t j = 0; j < heads * d; ++j) {
      EXPECT_EQ(q.data<double>()[7 * heads * d + j], moved.data<double>()[5 * heads * d + j]);
    }
  }
  Tensor q = clone(q0), k = clone(k0);
  EXPECT_THROW(rope_forward_qk_at(q, k, seq, heads, kv_heads, d, RopeSpec(500),
                                  i32({0, 1, 2, 3, 5, 0, 1, 2, 3, 4})),
               Error);
  EXPECT_EQ(values(q), values(q0));
}

// Llama 3's frequencies written out from its definition: wavelengths 2 pi / f above
// original / low are divided by factor, below original / high kept, and in between
// interpolated with weight (original / wavelength - low) / (high - low) on the unscaled one.
TEST(Rope, Llama3ScalingKeepsHighDividesLowAndInterpolatesBetween) {
  RopeSpec r(10000);
  r.scaling = RopeScaling::kLlama3;
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position = 256;
  const int64_t d = 16;
  const std::vector<double> plain = rope_inv_freq(RopeSpec(10000), d);
  const std::vector<double> scaled = rope_inv_freq(r, d);
  ASSERT_EQ(scaled.size(), 8u);
  int kept = 0, divided = 0, mixed = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_DOUBLE_EQ(plain[i], std::pow(10000.0, -2.0 * static_cast<double>(i) / d));
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 256.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++kept;
    } else if (wavelen > 256.0) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8) << i;
      ++divided;
    } else {
      const double w = (256.0 / wavelen - 1) / 3;
      EXPECT_DOUBLE_EQ(scaled[i], (1 - w) * plain[i] / 8 + w * plain[i]) << i;
      EXPECT_GT(scaled[i], plain[i] / 8);
      EXPECT_LT(scaled[i], plain[i]);
      ++mixed;
    }
  }
  EXPECT_EQ(kept, 3);  // each band is exercised at this head dim and context
  EXPECT_EQ(divided, 4);
  EXPECT_EQ(mixed, 1);
  // The op rotates by these frequencies: position p, pair i turns by p * scaled[i].
  const int64_t seq = 40;
  std::mt19937_64 rng(18);
  Tensor x = random({seq, d}, DType::kF64, rng);
  Tensor out = make(x.shape(), DType::kF64);
  rope_forward(out, x, seq, 1, d, r);
  for (int64_t p = 0; p < seq; ++p) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = static_cast<double>(p) * scaled[static_cast<size_t>(i)];
      const double u1 = x.data<double>()[p * d + i], u2 = x.data<double>()[p * d + i + d / 2];
      EXPECT_NEAR(out.data<double>()[p * d + i], u1 * std::cos(a) - u2 * std::sin(a), 1e-14);
      EXPECT_NEAR(out.data<double>()[p * d + i + d / 2], u2 * std::cos(a) + u1 * std::sin(a),
                  1e-14);
    }
  }
}

}  // namespace
}  // namespace tandem::ops::test
