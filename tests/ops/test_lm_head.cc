// The fused LM head + cross-entropy (ops::lm_head_ce_*) against the unfused ops it replaces
// (linear_forward, cross_entropy_*, linear_backward_*), in fp64, with row counts below, at and
// above the op's 256-row block; and dtype conversion including bf16's round-to-nearest-even.
// Oracle: the unfused ops (themselves checked against finite differences in test_linear.cc and
// test_basic.cc) and hand-computed bf16 bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

Tensor targets_of(int64_t n, int64_t v, std::mt19937_64& rng) {
  Tensor t = Tensor::zeros({n}, DType::kI32, MemCategory::kOther, "targets");
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(v - 1));
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = u(rng);
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
  }
  return m;
}

class LmHead : public ::testing::TestWithParam<int64_t> {};

TEST_P(LmHead, FusedEqualsUnfused) {
  const int64_t n = GetParam(), h = 12, v = 37;
  std::mt19937_64 rng(static_cast<uint64_t>(n));
  const Tensor x = random({n, h}, DType::kF64, rng), w = random({v, h}, DType::kF64, rng);
  const Tensor targets = targets_of(n, v, rng);
  const double scale = 0.37;

  // Unfused: the [N, V] logits exist.
  Tensor logits = make({n, v}, DType::kF64);
  linear_forward(logits, x, w);
  const double loss_ref = cross_entropy_forward(logits, targets);
  cross_entropy_backward(logits, logits, targets, scale);
  Tensor dx_ref = make({n, h}, DType::kF64), dw_ref = make({v, h}, DType::kF64);
  linear_backward_input(dx_ref, logits, w);
  linear_backward_weight(dw_ref, logits, x, Accumulate::kOverwrite);

  Tensor lse = Tensor::zeros({n}, DType::kF32, MemCategory::kOther, "lse");
  const double loss = lm_head_ce_forward(lse, x, w, targets);
  EXPECT_NEAR(loss, loss_ref, 1e-12 * std::max(1.0, std::fabs(loss_ref)));
  // lse is f32: the backward's softmax uses it, so its rounding bounds the gradient error.
  Tensor dx = make({n, h}, DType::kF64), dw = random({v, h}, DType::kF64, rng);
  lm_head_ce_backward(dx, dw, x, w, targets, lse, scale, Accumulate::kOverwrite);
  EXPECT_LT(max_abs_diff(dx, dx_ref), 1e-6);
  EXPECT_LT(max_abs_diff(dw, dw_ref), 1e-6);
  // kAdd adds the same gradient again.
  lm_head_ce_backward(dx, dw, x, w, targets, lse, scale, Accumulate::kAdd);
  for (int64_t i = 0; i < dw.numel(); ++i) {
    EXPECT_NEAR(dw.data<double>()[i], 2 * dw_ref.data<double>()[i], 2e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, LmHead, ::testing::Values(1, 255, 256, 600));

TEST(LmHead, BadTargetNamesRowAndVocabulary) {
  std::mt19937_64 rng(3);
  const Tensor x = random({4, 8}, DType::kF32, rng), w = random({10, 8}, DType::kF32, rng);
  Tensor targets = targets_of(4, 10, rng);
  targets.data<int32_t>()[2] = 10;
  Tensor lse = Tensor::zeros({4}, DType::kF32, MemCategory::kOther, "lse");
  try {
    lm_head_ce_forward(lse, x, w, targets);
    FAIL() << "a target equal to the vocabulary size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("10 at row 2"), std::string::npos) << e.what();
  }
}

TEST(Convert, Bf16RoundsToNearestEven) {
  Tensor src = Tensor::zeros({5}, DType::kF32, MemCategory::kOther, "src");
  // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties go to the even (1.0);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties go to even (1 + 2^-6).
  const float in[5] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, 1e-3f};
  for (int i = 0; i < 5; ++i) src.data<float>()[i] = in[i];
  Tensor b = Tensor::zeros({5}, DType::kBF16, MemCategory::kOther, "bf16");
  convert(b, src);
  EXPECT_EQ(b.data<BF16>()[0].bits, 0x3f80);
  EXPECT_EQ(b.data<BF16>()[1].bits, 0x3f80);
  EXPECT_EQ(b.data<BF16>()[2].bits, 0x3f82);
  EXPECT_EQ(b.data<BF16>()[3].bits, 0xc020);
  Tensor back = Tensor::zeros({5}, DType::kF64, MemCategory::kOther, "back");
  convert(back, b);
  EXPECT_EQ(back.data<double>()[3], -2.5);
  EXPECT_NEAR(back.data<double>()[4], 1e-3, 1e-3 * 0x1p-8);
  Tensor wrong = Tensor::zeros({4}, DType::kF32, MemCategory::kOther, "wrong");
  EXPECT_THROW(convert(wrong, b), Error);
}

}  // namespace
}  // namespace tandem::ops::test
