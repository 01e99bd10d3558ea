// Linear layers (y = x @ w^T) on CPU through BLAS.
// Oracles: a plain triple loop for the forward; fp64 central finite differences for dx and dw;
// the kOverwrite result plus the prior contents for kAdd; the f64 op for the f32 op.
#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

TEST(Linear, ForwardMatchesTripleLoop) {
  std::mt19937_64 rng(20);
  const int64_t m = 5, in = 7, out = 3;
  Tensor x = random({m, in}, DType::kF64, rng), w = random({out, in}, DType::kF64, rng);
  Tensor y = random({m, out}, DType::kF64, rng);  // garbage that kOverwrite must ignore
  linear_forward(y, x, w);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t c = 0; c < in; ++c)
        s += x.data<double>()[i * in + c] * w.data<double>()[o * in + c];
      EXPECT_NEAR(y.data<double>()[i * out + o], s, kF64Tol);
    }
  }
}

// y = r + x @ w^T, into a separate output and in place over r.
TEST(Linear, ForwardResidualAddsTheResidual) {
  std::mt19937_64 rng(22);
  const int64_t m = 4, in = 6, out = 3;
  Tensor x = random({m, in}, DType::kF64, rng), w = random({out, in}, DType::kF64, rng);
  Tensor r = random({m, out}, DType::kF64, rng), plain = make({m, out}, DType::kF64);
  linear_forward(plain, x, w);
  Tensor y = random({m, out}, DType::kF64, rng);  // garbage to overwrite
  linear_forward_residual(y, x, w, r);
  Tensor in_place = make({m, out}, DType::kF64);
  in_place.copy_from(r);
  linear_forward_residual(in_place, x, w, in_place);
  for (int64_t i = 0; i < m * out; ++i) {
    const double want = plain.data<double>()[i] + r.data<double>()[i];
    EXPECT_NEAR(y.data<double>()[i], want, kF64Tol);
    EXPECT_NEAR(in_place.data<double>()[i], want, kF64Tol);
  }
  Tensor bad = make({m, out + 1}, DType::kF64);
  EXPECT_THROW(linear_forward_residual(y, x, w, bad), Error);
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(21);
  const int64_t m = 4, in = 3, out = 5;
  Tensor x = random({m, in}, DType::kF64, rng), w = random({out, in}, DType::kF64, rng);
  Tensor y = make({m, out}, DType::kF64), up = random({m, out}, DType::kF64, rng);
  auto loss = [&] {
    linear_forward(y, x, w);
    return dot(y, up);
  };
  Tensor dx = make({m, in}, DType::kF64), dw = make({out, in}, DType::kF64);
  linear_backward_input(dx, up, w);
  linear_backward_weight(dw, up, x, Accumulate::kOverwrite);
  expect_grad(dx, numeric_grad(x, loss), "dx");
  expect_grad(dw, numeric_grad(w, loss), "dw");
}

TEST(Linear, EveryOpHonoursAccumulate) {
  std::mt19937_64 rng(22);
  const int64_t m = 3, in = 4, out = 2;
  Tensor x = random({m, in}, DType::kF64, rng), w = random({out, in}, DType::kF64, rng);
  Tensor dy = random({m, out}, DType::kF64, rng);
  // Each op: (output shape, call with a given mode).
  const std::vector<std::pair<Shape, std::function<void(const Tensor&, Accumulate)>>> ops = {
      {{m, out}, [&](const Tensor& t, Accumulate a) { linear_forward(t, x, w, a); }},
      {{m, in}, [&](const Tensor& t, Accumulate a) { linear_backward_input(t, dy, w, a); }},
      {{out, in}, [&](const Tensor& t, Accumulate a) { linear_backward_weight(t, dy, x, a); }},
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    Tensor fresh = random(ops[i].first, DType::kF64, rng);
    ops[i].second(fresh, Accumulate::kOverwrite);
    Tensor base = random(ops[i].first, DType::kF64, rng);
    Tensor over = clone(base), add = clone(base);
    ops[i].second(over, Accumulate::kOverwrite);
    ops[i].second(add, Accumulate::kAdd);
    EXPECT_EQ(values(over), values(fresh)) << "op " << i;
    for (int64_t e = 0; e < base.numel(); ++e) {
      EXPECT_NEAR(add.data<double>()[e], base.data<double>()[e] + fresh.data<double>()[e], 1e-15)
          << "op " << i;
    }
  }
}

TEST(Linear, EmptyBatchOverwritesWithZerosOrLeavesSumAlone) {
  // An expert that received no token: M = 0.
  Tensor x = make({0, 3}, DType::kF32), dy = make({0, 2}, DType::kF32);
  Tensor dw = to_f32(f64({2, 3}, {1, 2, 3, 4, 5, 6}));
  linear_backward_weight(dw, dy, x, Accumulate::kAdd);
  EXPECT_EQ(values(dw), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  linear_backward_weight(dw, dy, x, Accumulate::kOverwrite);
  EXPECT_EQ(values(dw), (std::vector<double>(6, 0.0)));
  Tensor y = make({0, 2}, DType::kF32);
  linear_forward(y, x, dw);  // nothing to write, must not fail
}

TEST(Linear, F32MatchesF64AndShapeMismatchThrows) {
  std::mt19937_64 rng(23);
  const int64_t m = 16, in = 24, out = 8;
  Tensor x = random({m, in}, DType::kF64, rng), w = random({out, in}, DType::kF64, rng);
  Tensor dy = random({m, out}, DType::kF64, rng);
  Tensor y64 = make({m, out}, DType::kF64), y32 = make({m, out}, DType::kF32);
  linear_forward(y64, x, w);
  linear_forward(y32, to_f32(x), to_f32(w));
  expect_f32_close(y32, y64, "y");
  Tensor dx64 = make({m, in}, DType::kF64), dx32 = make({m, in}, DType::kF32);
  linear_backward_input(dx64, dy, w);
  linear_backward_input(dx32, to_f32(dy), to_f32(w));
  expect_f32_close(dx32, dx64, "dx");
  Tensor dw64 = make({out, in}, DType::kF64), dw32 = make({out, in}, DType::kF32);
  linear_backward_weight(dw64, dy, x);
  linear_backward_weight(dw32, to_f32(dy), to_f32(x));
  expect_f32_close(dw32, dw64, "dw");
  Tensor bad = make({m, out + 1}, DType::kF64);
  EXPECT_THROW(linear_forward(bad, x, w), Error);
}

}  // namespace
}  // namespace tandem::ops::test
