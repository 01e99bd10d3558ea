// Causal grouped-query attention on CPU.
// Oracles: a plain full-softmax implementation with an explicit [seq, seq] causal mask of -inf
// (forward and lse); fp64 central finite differences for dq, dk, dv (GQA, batch > 1); the f64
// op for the f32 op; a second run for bitwise reproducibility.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

// out [N, heads*D] and lse [batch, heads, seq] by the definition, in fp64.
void naive_attention(std::vector<double>& out, std::vector<double>& lse, const Tensor& q,
                     const Tensor& k, const Tensor& v, const AttentionShape& s) {
  const int64_t t = s.seq, d = s.head_dim, qw = s.heads * d, kw = s.kv_heads * d;
  const auto qv = values(q), kv = values(k), vv = values(v);
  out.assign(static_cast<size_t>(s.batch * t * qw), 0.0);
  lse.assign(static_cast<size_t>(s.batch * s.heads * t), 0.0);
  std::vector<double> mask(static_cast<size_t>(t * t));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < t; ++j) {
      mask[i * t + j] = j <= i ? 0.0 : -std::numeric_limits<double>::infinity();
    }
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / (s.heads / s.kv_heads);
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> sc(static_cast<size_t>(t));
        double z = 0;
        for (int64_t j = 0; j < t; ++j) {
          double dotp = 0;
          for (int64_t c = 0; c < d; ++c) {
            dotp += qv[(b * t + i) * qw + h * d + c] * kv[(b * t + j) * kw + g * d + c];
          }
          sc[j] = std::exp(dotp / std::sqrt(static_cast<double>(d)) + mask[i * t + j]);
          z += sc[j];
        }
        lse[(b * s.heads + h) * t + i] = std::log(z);
        for (int64_t j = 0; j < t; ++j) {
          for (int64_t c = 0; c < d; ++c) {
            out[(b * t + i) * qw + h * d + c] += sc[j] / z * vv[(b * t + j) * kw + g * d + c];
          }
        }
      }
    }
  }
}

struct Inputs {
  Tensor q, k, v;
};

Inputs make_inputs(const AttentionShape& s, std::mt19937_64& rng, double range) {
  const int64_t n = s.batch * s.seq;
  return {random({n, s.heads * s.head_dim}, DType::kF64, rng, -range, range),
          random({n, s.kv_heads * s.head_dim}, DType::kF64, rng, -range, range),
          random({n, s.kv_heads * s.head_dim}, DType::kF64, rng, -range, range)};
}

void check_forward(const AttentionShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Inputs in = make_inputs(s, rng, 2.0);
  Tensor out = make(in.q.shape(), DType::kF64), lse = make({s.batch, s.heads, s.seq}, DType::kF64);
  attention_forward(out, lse, in.q, in.k, in.v, s);
  std::vector<double> want_out, want_lse;
  naive_attention(want_out, want_lse, in.q, in.k, in.v, s);
  EXPECT_LE(rel_err(values(out), want_out), kF64Tol);
  EXPECT_LE(rel_err(values(lse), want_lse), kF64Tol);
  // The first query of each sequence sees only its own key: out equals v of that position.
  const int64_t g = (s.heads - 1) / (s.heads / s.kv_heads);
  for (int64_t c = 0; c < s.head_dim; ++c) {
    const int64_t row = (s.batch - 1) * s.seq;
    EXPECT_EQ(out.data<double>()[row * s.heads * s.head_dim + (s.heads - 1) * s.head_dim + c],
              in.v.data<double>()[row * s.kv_heads * s.head_dim + g * s.head_dim + c]);
  }
}

TEST(Attention, ForwardMatchesNaiveMaskedSoftmaxGqa) { check_forward({2, 7, 4, 2, 8}, 30); }
TEST(Attention, ForwardMatchesNaiveMaskedSoftmaxMha) { check_forward({3, 5, 2, 2, 4}, 31); }
TEST(Attention, ForwardMatchesNaiveMaskedSoftmaxOneKvHead) { check_forward({1, 9, 4, 1, 6}, 32); }

TEST(Attention, BackwardMatchesFiniteDifferencesGqa) {
  const AttentionShape s{2, 5, 4, 2, 4};
  std::mt19937_64 rng(33);
  const Inputs in = make_inputs(s, rng, 1.5);
  Tensor out = make(in.q.shape(), DType::kF64), lse = make({s.batch, s.heads, s.seq}, DType::kF64);
  Tensor up = random(in.q.shape(), DType::kF64, rng);
  auto loss = [&] {
    attention_forward(out, lse, in.q, in.k, in.v, s);
    return dot(out, up);
  };
  loss();
  // Garbage in the gradients: they are overwritten.
  Tensor dq = random(in.q.shape(), DType::kF64, rng), dk = random(in.k.shape(), DType::kF64, rng);
  Tensor dv = random(in.v.shape(), DType::kF64, rng);
  attention_backward(dq, dk, dv, up, in.q, in.k, in.v, out, lse, s);
  expect_grad(dq, numeric_grad(in.q, loss), "dq");
  expect_grad(dk, numeric_grad(in.k, loss), "dk");
  expect_grad(dv, numeric_grad(in.v, loss), "dv");
}

TEST(Attention, F32MatchesF64AndRunsAreBitwiseEqual) {
  const AttentionShape s{2, 32, 4, 2, 16};
  std::mt19937_64 rng(34);
  const Inputs in = make_inputs(s, rng, 1.0);
  Tensor up = random(in.q.shape(), DType::kF64, rng);
  const Shape lse_shape{s.batch, s.heads, s.seq};
  Tensor res[2][5];  // out, lse, dq, dk, dv for f64 then f32
  for (int i = 0; i < 2; ++i) {
    const DType dt = i == 0 ? DType::kF64 : DType::kF32;
    auto cvt = [&](const Tensor& t) { return i == 0 ? clone(t) : to_f32(t); };
    Tensor q = cvt(in.q), k = cvt(in.k), v = cvt(in.v), dout = cvt(up);
    res[i][0] = make(q.shape(), dt), res[i][1] = make(lse_shape, dt);
    res[i][2] = make(q.shape(), dt), res[i][3] = make(k.shape(), dt),
    res[i][4] = make(v.shape(), dt);
    attention_forward(res[i][0], res[i][1], q, k, v, s);
    attention_backward(res[i][2], res[i][3], res[i][4], dout, q, k, v, res[i][0], res[i][1], s);
    if (i == 1) {
      // A second f32 run gives the same bytes.
      Tensor out2 = make(q.shape(), dt), lse2 = make(lse_shape, dt);
      Tensor dq2 = make(q.shape(), dt), dk2 = make(k.shape(), dt), dv2 = make(v.shape(), dt);
      attention_forward(out2, lse2, q, k, v, s);
      attention_backward(dq2, dk2, dv2, dout, q, k, v, out2, lse2, s);
      const Tensor* again[5] = {&out2, &lse2, &dq2, &dk2, &dv2};
      for (int j = 0; j < 5; ++j) {
        EXPECT_EQ(std::memcmp(again[j]->data<float>(), res[i][j].data<float>(),
                              static_cast<size_t>(again[j]->nbytes())),
                  0)
            << "tensor " << j;
      }
    }
  }
  const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int j = 0; j < 5; ++j) expect_f32_close(res[1][j], res[0][j], names[j]);
}

TEST(Attention, BadShapesThrow) {
  const AttentionShape bad_groups{1, 4, 3, 2, 4};  // 3 heads over 2 KV heads
  Tensor q = make({4, 12}, DType::kF32), kv = make({4, 8}, DType::kF32);
  Tensor out = make({4, 12}, DType::kF32), lse = make({1, 3, 4}, DType::kF32);
  EXPECT_THROW(attention_forward(out, lse, q, kv, kv, bad_groups), Error);
  const AttentionShape s{1, 4, 2, 2, 4};
  Tensor q2 = make({4, 8}, DType::kF32), wrong_lse = make({1, 2, 5}, DType::kF32);
  EXPECT_THROW(attention_forward(q2, wrong_lse, q2, kv, kv, s), Error);
}

}  // namespace
}  // namespace tandem::ops::test
