// Attention within documents (AttentionShape::key_begin, Note [Document masking] in
// data/document_masks.h) on CPU in fp64. Oracle: each document run alone through the plain
// causal op, as a sequence of its own; the masked run's out, lse and gradients of every
// document's rows must be those of its lone run. Grouped-query heads and a value width other
// than the key width (MLA's shape) are covered.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

// Rows [from, from + count) of a 2-D f64 tensor, as a tensor of their own.
Tensor rows(const Tensor& t, int64_t from, int64_t count) {
  const int64_t w = t.size(1);
  const std::vector<double> all = values(t);
  return f64({count, w},
             std::vector<double>(all.begin() + from * w, all.begin() + (from + count) * w));
}

// lse [batch, heads, seq] of sample b, positions [from, from + count), head-major.
std::vector<double> lse_part(const Tensor& lse, const AttentionShape& s, int64_t b, int64_t from,
                             int64_t count) {
  const std::vector<double> all = values(lse);
  std::vector<double> out;
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t i = from; i < from + count; ++i) out.push_back(all[(b * s.heads + h) * s.seq + i]);
  return out;
}

TEST(DocumentAttention, EachDocumentAsIfAlone) {
  AttentionShape s{2, 11, 4, 2, 6};
  s.v_head_dim = 5;
  // Documents [0, 3), [3, 7), [7, 11) in sample 0; [0, 1), [1, 6), [6, 11) in sample 1.
  const std::vector<std::vector<int32_t>> starts = {{0, 3, 7}, {0, 1, 6}};
  std::vector<int32_t> begin;
  for (const auto& doc : starts) {
    for (int64_t i = 0; i < s.seq; ++i) {
      int32_t at = 0;
      for (int32_t d : doc) at = d <= i ? d : at;
      begin.push_back(at);
    }
  }
  s.key_begin = i32({s.batch * s.seq}, begin);
  std::mt19937_64 rng(46);
  const int64_t n = s.batch * s.seq;
  const Tensor q = random({n, s.heads * s.head_dim}, DType::kF64, rng, -2, 2);
  const Tensor k = random({n, s.kv_heads * s.head_dim}, DType::kF64, rng, -2, 2);
  const Tensor v = random({n, s.kv_heads * s.v_dim()}, DType::kF64, rng, -2, 2);
  const Tensor dout = random({n, s.heads * s.v_dim()}, DType::kF64, rng, -1, 1);
  Tensor out = make({n, s.heads * s.v_dim()}, DType::kF64);
  Tensor lse = make({s.batch, s.heads, s.seq}, DType::kF64);
  attention_forward(out, lse, q, k, v, s);
  Tensor dq = make(q.shape(), DType::kF64), dk = make(k.shape(), DType::kF64),
         dv = make(v.shape(), DType::kF64);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
  int documents = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (size_t d = 0; d < starts[b].size(); ++d) {
      const int64_t from = starts[b][d];
      const int64_t to = d + 1 < starts[b].size() ? starts[b][d + 1] : s.seq;
      const int64_t len = to - from, row = b * s.seq + from;
      AttentionShape alone{1, len, s.heads, s.kv_heads, s.head_dim, s.v_head_dim};
      const Tensor aq = rows(q, row, len), ak = rows(k, row, len), av = rows(v, row, len);
      Tensor aout = make({len, s.heads * s.v_dim()}, DType::kF64);
      Tensor alse = make({1, s.heads, len}, DType::kF64);
      attention_forward(aout, alse, aq, ak, av, alone);
      Tensor adq = make(aq.shape(), DType::kF64), adk = make(ak.shape(), DType::kF64),
             adv = make(av.shape(), DType::kF64);
      attention_backward(adq, adk, adv, rows(dout, row, len), aq, ak, av, aout, alse, alone);
      EXPECT_LE(rel_err(values(rows(out, row, len)), values(aout)), kF64Tol) << b << "," << d;
      EXPECT_LE(rel_err(lse_part(lse, s, b, from, len), values(alse)), kF64Tol) << b << "," << d;
      EXPECT_LE(rel_err(values(rows(dq, row, len)), values(adq)), kF64Tol) << b << "," << d;
      EXPECT_LE(rel_err(values(rows(dk, row, len)), values(adk)), kF64Tol) << b << "," << d;
      EXPECT_LE(rel_err(values(rows(dv, row, len)), values(adv)), kF64Tol) << b << "," << d;
      ++documents;
    }
  }
  EXPECT_EQ(documents, 6);
  // And the bounds change the result: plain causal attention differs past the first document.
  AttentionShape plain = s;
  plain.key_begin = Tensor();
  Tensor pout = make(out.shape(), DType::kF64), plse = make(lse.shape(), DType::kF64);
  attention_forward(pout, plse, q, k, v, plain);
  EXPECT_GT(rel_err(values(rows(pout, 3, 1)), values(rows(out, 3, 1))), 1e-3);
}

TEST(DocumentAttention, BoundsPastTheQueryAreRefused) {
  AttentionShape s{1, 4, 2, 2, 4};
  s.key_begin = i32({4}, {0, 0, 3, 1});  // position 2 cannot start at key 3
  std::mt19937_64 rng(1);
  const Tensor q = random({4, 8}, DType::kF64, rng), k = random({4, 8}, DType::kF64, rng);
  Tensor out = make({4, 8}, DType::kF64), lse = make({1, 2, 4}, DType::kF64);
  EXPECT_THROW(attention_forward(out, lse, q, k, k, s), Error);
}

}  // namespace
}  // namespace tandem::ops::test
