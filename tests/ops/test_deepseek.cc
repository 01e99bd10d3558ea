// DeepSeek-V3's ops on CPU: attention with values of their own width and a softmax scale of its
// own, multi-head latent attention's q/k/v layout with interleaved RoPE, and the sigmoid router
// (expert bias for the choice only, groups, scaling).
// Oracles: a naive fp64 attention over explicitly widened tensors; a hand-written rotation of
// neighbouring pairs (YaRN's attention factor included) and the plain copy of each head's parts;
// fp64 central finite differences for every backward; hand-picked scores whose choice and
// weights are worked out in the test.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

// ---- attention with Dv != D and a given scale ----

TEST(AttentionMla, NarrowValuesAndOwnScaleMatchNaiveAndFiniteDifferences) {
  AttentionShape s{2, 5, 3, 3, 6};
  s.v_head_dim = 4;
  s.scale = 0.37;
  std::mt19937_64 rng(70);
  const int64_t n = s.batch * s.seq, qw = s.heads * 6, vw = s.heads * 4;
  Tensor q = random({n, qw}, DType::kF64, rng, -2, 2), k = random({n, qw}, DType::kF64, rng, -2, 2);
  Tensor v = random({n, vw}, DType::kF64, rng, -2, 2);
  Tensor out = make({n, vw}, DType::kF64), lse = make({s.batch, s.heads, s.seq}, DType::kF64);
  attention_forward(out, lse, q, k, v, s);
  // Naive: softmax(q k^T * scale) v per head, causal.
  const auto qv = values(q), kv = values(k), vv = values(v);
  std::vector<double> want(static_cast<size_t>(n * vw), 0.0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.seq; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1));
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < 6; ++c) {
            d += qv[(b * s.seq + i) * qw + h * 6 + c] * kv[(b * s.seq + j) * qw + h * 6 + c];
          }
          p[j] = std::exp(d * 0.37);
          z += p[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t c = 0; c < 4; ++c) {
            want[(b * s.seq + i) * vw + h * 4 + c] +=
                p[j] / z * vv[(b * s.seq + j) * vw + h * 4 + c];
          }
        }
      }
    }
  }
  EXPECT_LE(rel_err(values(out), want), kF64Tol);
  Tensor up = random({n, vw}, DType::kF64, rng);
  auto loss = [&] {
    attention_forward(out, lse, q, k, v, s);
    return dot(out, up);
  };
  loss();
  Tensor dq = make(q.shape(), DType::kF64), dk = make(k.shape(), DType::kF64);
  Tensor dv = make(v.shape(), DType::kF64);
  attention_backward(dq, dk, dv, up, q, k, v, out, lse, s);
  expect_grad(dq, numeric_grad(q, loss), "dq");
  expect_grad(dk, numeric_grad(k, loss), "dk");
  expect_grad(dv, numeric_grad(v, loss), "dv");
}

// ---- MLA's q, k, v ----

constexpr int64_t kSeq = 3, kHeads = 2, kNope = 3, kRope = 4, kV = 2;

RopeSpec yarn_rope() {
  RopeSpec r(10000.0);
  r.interleaved = true;
  r.scaling = RopeScaling::kYarn;
  r.factor = 4;
  r.original_max_position = 2;
  r.mscale = 1.0;
  r.mscale_all_dim = 0.5;
  return r;
}

// One head of width kRope rotated by hand: pairs (2i, 2i+1) at frequency i, written to (i,
// i + kRope/2), cos and sin scaled by the attention factor.
std::vector<double> rotate_by_hand(const double* x, int64_t pos, const RopeSpec& r) {
  const std::vector<double> inv = rope_inv_freq(r, kRope);
  const double af = rope_attention_factor(r);
  std::vector<double> out(kRope);
  for (int64_t i = 0; i < kRope / 2; ++i) {
    const double c = std::cos(pos * inv[i]) * af, s = std::sin(pos * inv[i]) * af;
    out[i] = x[2 * i] * c - x[2 * i + 1] * s;
    out[i + kRope / 2] = x[2 * i + 1] * c + x[2 * i] * s;
  }
  return out;
}

// Random inputs of the op (two sequences) and its outputs.
struct MlaTensors {
  Tensor q_in, kv, kr, q, k, v;
};

MlaTensors mla_tensors(std::mt19937_64& rng) {
  const int64_t n = 2 * kSeq, qk = kNope + kRope;
  MlaTensors t;
  t.q_in = random({n, kHeads * qk}, DType::kF64, rng);
  t.kv = random({n, kHeads * (kNope + kV)}, DType::kF64, rng);
  t.kr = random({n, kRope}, DType::kF64, rng);
  t.q = make(t.q_in.shape(), DType::kF64);
  t.k = make(t.q_in.shape(), DType::kF64);
  t.v = make({n, kHeads * kV}, DType::kF64);
  return t;
}

TEST(MlaQkv, LaysOutTheHeadsAndRotatesInterleavedPairsWithYarnsFactor) {
  const RopeSpec rope = yarn_rope();
  EXPECT_NE(rope_attention_factor(rope), 1.0);  // mscale and mscale_all_dim differ
  std::mt19937_64 rng(71);
  const int64_t n = 2 * kSeq, qk = kNope + kRope;
  const MlaTensors t = mla_tensors(rng);
  const Tensor &q_in = t.q_in, &kv = t.kv, &kr = t.kr, &q = t.q, &k = t.k, &v = t.v;
  mla_qkv_forward(q, k, v, q_in, kv, kr, kSeq, kHeads, kNope, kRope, kV, rope);
  const double* pq = q.data<double>();
  for (int64_t r = 0; r < n; ++r) {
    const auto krot = rotate_by_hand(kr.data<double>() + r * kRope, r % kSeq, rope);
    for (int64_t h = 0; h < kHeads; ++h) {
      const double* qi = q_in.data<double>() + (r * kHeads + h) * qk;
      const auto qrot = rotate_by_hand(qi + kNope, r % kSeq, rope);
      for (int64_t c = 0; c < kNope; ++c) {
        EXPECT_EQ(pq[(r * kHeads + h) * qk + c], qi[c]);
        EXPECT_EQ(k.data<double>()[(r * kHeads + h) * qk + c],
                  kv.data<double>()[r * kHeads * (kNope + kV) + h * (kNope + kV) + c]);
      }
      for (int64_t c = 0; c < kRope; ++c) {
        EXPECT_NEAR(pq[(r * kHeads + h) * qk + kNope + c], qrot[c], 1e-14);
        EXPECT_NEAR(k.data<double>()[(r * kHeads + h) * qk + kNope + c], krot[c], 1e-14);
      }
      for (int64_t c = 0; c < kV; ++c) {
        EXPECT_EQ(v.data<double>()[(r * kHeads + h) * kV + c],
                  kv.data<double>()[r * kHeads * (kNope + kV) + h * (kNope + kV) + kNope + c]);
      }
    }
  }
}

TEST(MlaQkv, BackwardMatchesFiniteDifferences) {
  for (const bool yarn : {false, true}) {
    RopeSpec rope = yarn ? yarn_rope() : RopeSpec(10000.0);
    rope.interleaved = true;
    std::mt19937_64 rng(72);
    const MlaTensors t = mla_tensors(rng);
    const Tensor &q_in = t.q_in, &kv = t.kv, &kr = t.kr, &q = t.q, &k = t.k, &v = t.v;
    Tensor uq = random(q.shape(), DType::kF64, rng), uk = random(k.shape(), DType::kF64, rng);
    Tensor uv = random(v.shape(), DType::kF64, rng);
    auto loss = [&] {
      mla_qkv_forward(q, k, v, q_in, kv, kr, kSeq, kHeads, kNope, kRope, kV, rope);
      return dot(q, uq) + dot(k, uk) + dot(v, uv);
    };
    // Garbage in the outputs: they are overwritten.
    Tensor dq_in = random(q_in.shape(), DType::kF64, rng),
           dkv = random(kv.shape(), DType::kF64, rng);
    Tensor dkr = random(kr.shape(), DType::kF64, rng);
    mla_qkv_backward(dq_in, dkv, dkr, uq, uk, uv, kSeq, kHeads, kNope, kRope, kV, rope);
    expect_grad(dq_in, numeric_grad(q_in, loss), "d_q_in");
    expect_grad(dkv, numeric_grad(kv, loss), "d_kv");
    expect_grad(dkr, numeric_grad(kr, loss), "d_k_rope");
  }
}

// ---- the sigmoid router ----

double logit_of(double p) { return std::log(p / (1 - p)); }

// Eight experts in four groups of two; scores chosen so that each rule changes the choice.
TEST(SigmoidRouter, BiasChoosesGroupsLimitAndWeightsAreTheUnbiasedScores) {
  const std::vector<double> scores = {0.9, 0.1, 0.5, 0.45, 0.3, 0.2, 0.6, 0.55};
  std::vector<double> l;
  for (double p : scores) l.push_back(logit_of(p));
  Tensor logits = f64({1, 8}, l);
  Tensor idx = make({1, 2}, DType::kI32), w = make({1, 2}, DType::kF64);
  Tensor probs = make({1, 8}, DType::kF64);
  // No bias, no groups: the two best scores, 0.9 (0) and 0.6 (6); weights normalised, scaled.
  RouterSpec spec(RouterScore::kSigmoidNormalized);
  spec.scaling = 2.5;
  router_forward(idx, w, probs, logits, spec);
  EXPECT_EQ(values(idx), (std::vector<double>{0, 6}));
  EXPECT_NEAR(w.data<double>()[0], 2.5 * 0.9 / 1.5, 1e-12);
  EXPECT_NEAR(w.data<double>()[1], 2.5 * 0.6 / 1.5, 1e-12);
  // Groups {0,1} 1.0, {2,3} 0.95, {4,5} 0.5, {6,7} 1.15: the best two groups are 3 and 0.
  // With group_topk 1 only group 3: experts 6 and 7, although expert 0 scores higher.
  spec.groups = 4;
  spec.group_topk = 1;
  router_forward(idx, w, probs, logits, spec);
  EXPECT_EQ(values(idx), (std::vector<double>{6, 7}));
  EXPECT_NEAR(w.data<double>()[0], 2.5 * 0.6 / 1.15, 1e-12);
  // A bias that lifts group {2,3} above the others (0.95 + 2 * 0.2 = 1.35) moves the choice
  // there, and the weights stay the unbiased scores 0.5 and 0.45.
  Tensor bias = make({8}, DType::kF32);
  bias.data<float>()[2] = 0.2f;
  bias.data<float>()[3] = 0.2f;
  router_forward(idx, w, probs, logits, spec, bias);
  EXPECT_EQ(values(idx), (std::vector<double>{2, 3}));
  EXPECT_NEAR(w.data<double>()[0], 2.5 * 0.5 / 0.95, 1e-7);
  EXPECT_NEAR(w.data<double>()[1], 2.5 * 0.45 / 0.95, 1e-7);
  // Not normalised: the scores themselves, scaled.
  spec.score = RouterScore::kSigmoid;
  router_forward(idx, w, probs, logits, spec, bias);
  EXPECT_NEAR(w.data<double>()[0], 2.5 * 0.5, 1e-7);
  // The experts outside the chosen groups are out of the choice (-inf, as Megatron-LM masks
  // them), so a negative biased score inside a chosen group still wins over them. Biased scores
  // now 0.9, 0.1, 0.7, -0.55, 0.3, 0.2, -0.4, -0.45: groups 1.0, 0.15, 0.5, -0.85; group {0,1}
  // is chosen.
  bias.data<float>()[3] = -1.0f;
  bias.data<float>()[6] = -1.0f;
  bias.data<float>()[7] = -1.0f;
  router_forward(idx, w, probs, logits, spec, bias);
  EXPECT_EQ(values(idx), (std::vector<double>{0, 1}));
  // Expert 1's biased score -0.35 (its group still the best, 0.55): it is chosen, not the
  // masked expert 2 (whose 0.7 a mask of 0 would have let win).
  bias.data<float>()[1] = -0.45f;
  router_forward(idx, w, probs, logits, spec, bias);
  EXPECT_EQ(values(idx), (std::vector<double>{0, 1}));
}

TEST(SigmoidRouter, BackwardMatchesFiniteDifferences) {
  for (const RouterScore score : {RouterScore::kSigmoid, RouterScore::kSigmoidNormalized}) {
    std::mt19937_64 rng(73);
    const int64_t n = 6, e = 8, k = 3;
    RouterSpec spec(score);
    spec.groups = 4;
    spec.group_topk = 2;
    spec.scaling = 1.7;
    Tensor logits = random({n, e}, DType::kF64, rng, -2, 2);
    Tensor bias = random({e}, DType::kF64, rng, -0.2, 0.2);
    Tensor idx = make({n, k}, DType::kI32), w = make({n, k}, DType::kF64);
    Tensor probs = make({n, e}, DType::kF64);
    Tensor up = random({n, k}, DType::kF64, rng);
    router_forward(idx, w, probs, logits, spec, bias);
    const auto idx0 = values(idx);
    auto loss = [&] {
      router_forward(idx, w, probs, logits, spec, bias);
      EXPECT_EQ(values(idx), idx0);
      return dot(w, up);
    };
    Tensor dlogits = random({n, e}, DType::kF64, rng);  // overwritten
    router_backward(dlogits, up, idx, w, probs, Tensor(), Tensor(), spec, RouterLoss(), 1.0);
    expect_grad(dlogits, numeric_grad(logits, loss), "dlogits");
  }
}

// The sequence-wise aux loss over the sigmoid router's normalised scores (Megatron-LM's
// seq_aux_loss, DeepSeek-V3's balance loss): its value against the definition written out here
// (per sequence, the choices of each expert among the top k of the unbiased scores, times the
// mean of its normalised score), and its gradient (with the routing weights' through biased,
// grouped choices) against finite differences.
TEST(SigmoidRouter, SequenceAuxLossMatchesItsDefinitionAndFiniteDifferences) {
  std::mt19937_64 rng(74);
  const int64_t seq = 4, batch = 3, n = seq * batch, e = 6, k = 2;
  const double coeff = 0.3, aux_scale = 1.7;
  RouterSpec spec(RouterScore::kSigmoidNormalized);
  spec.scaling = 2.5;
  spec.groups = 3;
  spec.group_topk = 2;
  Tensor logits = random({n, e}, DType::kF64, rng, -2, 2);
  Tensor bias = random({e}, DType::kF64, rng, -0.3, 0.3);
  Tensor idx = make({n, k}, DType::kI32), w = make({n, k}, DType::kF64);
  Tensor probs = make({n, e}, DType::kF64), counts = make({batch, e}, DType::kF64);
  router_forward(idx, w, probs, logits, spec, bias);
  router_aux_counts(counts, probs, k);
  RouterLoss aux;
  aux.normalized = true;
  aux.balance = coeff * double(e) / (double(k) * seq * seq) / batch;
  double want = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t x = 0; x < e; ++x) {
      double chosen = 0, mean = 0;
      for (int64_t t = b * seq; t < (b + 1) * seq; ++t) {
        const double* p = probs.data<double>() + t * e;
        double sum = 0;
        int above = 0;  // experts scoring above x (ties: the lower index above)
        for (int64_t y = 0; y < e; ++y) {
          sum += p[y];
          above += p[y] > p[x] || (p[y] == p[x] && y < x);
        }
        mean += p[x] / (sum + 1e-20) / seq;
        chosen += above < k;
      }
      want += coeff * (double(e) / (k * seq)) * chosen * mean / batch;
    }
  }
  EXPECT_NEAR(router_loss(probs, counts, Tensor(), aux), want, 1e-15);
  const auto idx0 = values(idx);
  Tensor up = random({n, k}, DType::kF64, rng);
  auto loss = [&] {
    router_forward(idx, w, probs, logits, spec, bias);
    EXPECT_EQ(values(idx), idx0);
    return dot(w, up) + aux_scale * router_loss(probs, counts, Tensor(), aux);
  };
  loss();
  Tensor dlogits = make({n, e}, DType::kF64);
  router_backward(dlogits, up, idx, w, probs, counts, Tensor(), spec, aux, aux_scale);
  expect_grad(dlogits, numeric_grad(logits, loss), "dlogits with the sequence aux loss");
}

TEST(SigmoidRouter, LoadAddsCountsAndBadSettingsThrow) {
  Tensor load = make({3}, DType::kF32);
  router_load_add(load, i32({3}, {1, 0, 5}));
  router_load_add(load, i32({3}, {2, 4, 0}));
  EXPECT_EQ(values(load), (std::vector<double>{3, 4, 5}));
  // Counts by place: expert x's count is at place slot[x].
  router_load_add(load, i32({3}, {10, 20, 30}), i32({3}, {2, 0, 1}));
  EXPECT_EQ(values(load), (std::vector<double>{33, 14, 25}));
  Tensor logits = make({1, 6}, DType::kF64), idx = make({1, 2}, DType::kI32);
  Tensor w = make({1, 2}, DType::kF64), probs = make({1, 6}, DType::kF64);
  RouterSpec spec(RouterScore::kSigmoid);
  spec.groups = 4;  // does not divide 6
  spec.group_topk = 1;
  EXPECT_THROW(router_forward(idx, w, probs, logits, spec), Error);
  // An expert bias or a scaling with softmax scores is refused.
  EXPECT_THROW(router_forward(idx, w, probs, logits, RouterSpec(), make({6}, DType::kF32)), Error);
  RouterSpec scaled;
  scaled.scaling = 2;
  EXPECT_THROW(router_forward(idx, w, probs, logits, scaled), Error);
}

}  // namespace
}  // namespace tandem::ops::test
