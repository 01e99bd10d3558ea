// The router's losses and the expert capacity on CPU, against Megatron-LM's formulas written out
// here: the z-loss (ST-MoE's mean of logsumexp^2) and its gradient, global_aux_loss's running
// mean, the random logits of forced balancing, and dropping past an expert's capacity
// (apply_router_token_dropping and the drop-and-pad permutation of moe_utils.py: both policies,
// with and without padding) through the permutation, per-expert maps and the combine; the
// chain's gradients against fp64 central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

TEST(RouterLoss, ZLossIsTheMeanOfTheSquaredLogSumExpOnBothRouters) {
  std::mt19937_64 rng(80);
  const int64_t n = 7, e = 5, k = 2;
  const double coeff = 0.2, scale = 1.3;
  Tensor logits = random({n, e}, DType::kF64, rng, -3, 3);
  double want = 0;
  for (int64_t r = 0; r < n; ++r) {
    double z = 0;
    for (int64_t x = 0; x < e; ++x) z += std::exp(logits.data<double>()[r * e + x]);
    want += coeff * std::log(z) * std::log(z) / n;
  }
  for (const RouterScore score :
       {RouterScore::kSoftmaxOfSelected, RouterScore::kSigmoidNormalized}) {
    const RouterSpec spec(score);
    Tensor idx = make({n, k}, DType::kI32), w = make({n, k}, DType::kF64);
    Tensor probs = make({n, e}, DType::kF64);
    RouterLoss z;
    z.z = coeff / n;
    z.normalized = spec.sigmoid();
    router_forward(idx, w, probs, logits, spec);
    EXPECT_NEAR(router_loss(probs, Tensor(), logits, z), want, 1e-14);
    const auto idx0 = values(idx);
    Tensor up = random({n, k}, DType::kF64, rng);
    auto loss = [&] {
      router_forward(idx, w, probs, logits, spec);
      EXPECT_EQ(values(idx), idx0);
      return dot(w, up) + scale * router_loss(probs, Tensor(), logits, z);
    };
    loss();
    Tensor dlogits = make({n, e}, DType::kF64);
    router_backward(dlogits, up, idx, w, probs, Tensor(), logits, spec, z, scale);
    expect_grad(dlogits, numeric_grad(logits, loss), "dlogits with the z-loss");
  }
}

// Megatron-LM's switch loss for the sigmoid router (aux_loss over the normalised scores): its
// value by the formula, E coeff / (k N^2) sum_e (sum_n q_ne) C_e, C the top k of the scores.
TEST(RouterLoss, SwitchLossOverNormalisedSigmoidScores) {
  std::mt19937_64 rng(81);
  const int64_t n = 6, e = 4, k = 2;
  Tensor logits = random({n, e}, DType::kF64, rng, -2, 2);
  Tensor idx = make({n, k}, DType::kI32), w = make({n, k}, DType::kF64);
  Tensor probs = make({n, e}, DType::kF64), counts = make({1, e}, DType::kF64);
  router_forward(idx, w, probs, logits, RouterSpec(RouterScore::kSigmoidNormalized));
  router_aux_counts(counts, probs, k);
  RouterLoss aux;
  aux.normalized = true;
  aux.balance = 0.1 * e / (double(k) * n * n);
  std::vector<double> c(e, 0.0), q(e, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const double* p = probs.data<double>() + r * e;
    std::vector<int64_t> order(e);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    for (int64_t j = 0; j < k; ++j) c[order[j]] += 1;
    const double sum = std::accumulate(p, p + e, 0.0);
    for (int64_t x = 0; x < e; ++x) q[x] += p[x] / (sum + 1e-20);
  }
  double want = 0;
  for (int64_t x = 0; x < e; ++x) want += 0.1 * e / (double(k) * n * n) * q[x] * c[x];
  EXPECT_NEAR(router_loss(probs, counts, Tensor(), aux), want, 1e-15);
}

TEST(RouterLoss, GlobalRunningMeanAveragesTheStepsCounts) {
  Tensor total = make({4}, DType::kF64);  // E = 3, then the micro-batches so far
  Tensor c = f64({1, 3}, {4, 0, 2});
  router_aux_running_mean(c, total);
  EXPECT_EQ(values(c), (std::vector<double>{4, 0, 2}));
  c = f64({1, 3}, {0, 2, 4});
  router_aux_running_mean(c, total);
  EXPECT_EQ(values(c), (std::vector<double>{2, 1, 3}));
  EXPECT_EQ(values(total), (std::vector<double>{4, 2, 6, 2}));
}

TEST(RouterLoss, RandomLogitsAreTheKeysNormalDraws) {
  Tensor a = make({3, 4}, DType::kF64), b = make({3, 4}, DType::kF32);
  router_random_logits(a, 77, 5);
  router_random_logits(b, 77, 5);
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(a.data<double>()[i], normal01(77, static_cast<uint64_t>(20 + i)));
    EXPECT_EQ(b.data<float>()[i], static_cast<float>(a.data<double>()[i]));
  }
}

// ---- expert capacity ----

// Megatron-LM's token order (position t of every sequence before t + 1) of tandem's row n.
int64_t megatron_token(int64_t n, int64_t rows, int64_t seq) {
  return (n % seq) * (rows / seq) + n / seq;
}

// apply_router_token_dropping (moe_utils.py) over Megatron-LM's tokens: the final routing
// weights [T, E] (0 where a token is not kept, or pads) and the final map (routed and within
// capacity, or with padding the capacity mask itself). Ties go to the earlier token, as tandem
// documents (torch.topk leaves them open).
struct Dropped {
  std::vector<double> probs;
  std::vector<char> map;
};

Dropped megatron_drop(const std::vector<double>& probs, const std::vector<char>& map, int64_t t,
                      int64_t e, int64_t k, double factor, bool by_position, bool pad) {
  const auto capacity = static_cast<int64_t>(std::ceil(double(t * k) / double(e) * factor));
  std::vector<char> mask(static_cast<size_t>(t * e), capacity > t ? 1 : 0);
  for (int64_t x = 0; x < e && capacity <= t; ++x) {
    std::vector<int64_t> order(static_cast<size_t>(t));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double va = by_position ? map[a * e + x] : probs[a * e + x];
      const double vb = by_position ? map[b * e + x] : probs[b * e + x];
      return va > vb;
    });
    for (int64_t i = 0; i < capacity; ++i) mask[order[i] * e + x] = 1;
  }
  Dropped d{std::vector<double>(probs.size()), std::vector<char>(map.size())};
  for (size_t i = 0; i < map.size(); ++i) {
    d.map[i] = pad ? mask[i] : (map[i] && mask[i]);
    d.probs[i] = probs[i] * d.map[i];
  }
  return d;
}

struct Chain {
  int64_t batch = 2, seq = 4, n = 8, k = 2, e = 4, h = 3;
  Tensor x, logits, idx, w, probs, perm, counts, maps;  // maps: [E, H, H], expert x's map
  MoeCapacity cap;
};

// The experts' rows (each expert's block of c.counts rows, from row 0) through their maps:
// out[r] = rows[r] @ maps[e] (or @ maps[e]^T, the input gradient's, when `transposed`).
// Returns [the counted rows, H].
Tensor apply_maps(const Tensor& rows, const Chain& c, bool transposed) {
  int64_t total = 0;
  for (int64_t x = 0; x < c.e; ++x) total += c.counts.data<int32_t>()[x];
  Tensor out = make({total, c.h}, DType::kF64);
  int64_t at = 0;
  for (int64_t x = 0; x < c.e; ++x) {
    for (int64_t r = at; r < at + c.counts.data<int32_t>()[x]; ++r) {
      for (int64_t j = 0; j < c.h; ++j) {
        double v = 0;
        for (int64_t i = 0; i < c.h; ++i) {
          const int64_t m = transposed ? (x * c.h + j) * c.h + i : (x * c.h + i) * c.h + j;
          v += rows.data<double>()[r * c.h + i] * c.maps.data<double>()[m];
        }
        out.data<double>()[r * c.h + j] = v;
      }
    }
    at += c.counts.data<int32_t>()[x];
  }
  return out;
}

// The chain: route, permute, y = x @ maps[expert] row by row, combine into zeros.
Tensor run_chain(Chain& c) {
  router_forward(c.idx, c.w, c.probs, c.logits);
  moe_permutation(c.perm, c.counts, c.idx, c.w, c.e, Tensor(), c.cap);
  Tensor rows = make({c.perm.numel(), c.h}, DType::kF64);
  permute_forward(rows, c.x, c.perm, c.k);
  Tensor out = make({c.n, c.h}, DType::kF64);
  combine_forward(out, apply_maps(rows, c, false), c.perm, c.w);
  return out;
}

TEST(ExpertCapacity, DropsAndPadsAsMegatronLm) {
  for (const bool by_position : {false, true}) {
    for (const bool pad : {false, true}) {
      SCOPED_TRACE(std::string(by_position ? "position" : "probs") + (pad ? ", padded" : ""));
      std::mt19937_64 rng(90);
      Chain c;
      c.x = random({c.n, c.h}, DType::kF64, rng);
      c.logits = random({c.n, c.e}, DType::kF64, rng, -2, 2);
      c.maps = random({c.e, c.h, c.h}, DType::kF64, rng);
      c.idx = make({c.n, c.k}, DType::kI32);
      c.w = make({c.n, c.k}, DType::kF64);
      c.probs = make({c.n, c.e}, DType::kF64);
      c.counts = make({c.e}, DType::kI32);
      const double factor = 0.75;  // capacity ceil(8 x 2 / 4 x 0.75) = 3 of 4 rows on average
      c.cap = {3, by_position ? TokenDropPolicy::kPosition : TokenDropPolicy::kProbs, pad, c.seq};
      c.perm = make({pad ? 3 * c.e : c.n * c.k}, DType::kI32);
      const Tensor out = run_chain(c);
      // Megatron-LM's final weights and map, over its token order.
      std::vector<double> probs(static_cast<size_t>(c.n * c.e), 0.0);
      std::vector<char> map(probs.size(), 0);
      for (int64_t r = 0; r < c.n; ++r) {
        const int64_t m = megatron_token(r, c.n, c.seq);
        for (int64_t j = 0; j < c.k; ++j) {
          const int64_t x = c.idx.data<int32_t>()[r * c.k + j];
          probs[size_t(m * c.e + x)] = c.w.data<double>()[r * c.k + j];
          map[size_t(m * c.e + x)] = 1;
        }
      }
      const Dropped d = megatron_drop(probs, map, c.n, c.e, c.k, factor, by_position, pad);
      int dropped = 0;
      for (int64_t x = 0; x < c.e; ++x) {
        int64_t kept = 0;
        for (int64_t m = 0; m < c.n; ++m) {
          kept += d.map[size_t(m * c.e + x)];
          dropped += map[size_t(m * c.e + x)] && !d.map[size_t(m * c.e + x)];
        }
        EXPECT_EQ(c.counts.data<int32_t>()[x], kept) << "expert " << x;
      }
      EXPECT_GT(dropped, 0) << "nothing dropped: the test shows nothing";
      // out[token] = sum_e final_probs[token, e] x[token] @ maps[e]: padding counts for nothing.
      for (int64_t r = 0; r < c.n; ++r) {
        const int64_t m = megatron_token(r, c.n, c.seq);
        for (int64_t j = 0; j < c.h; ++j) {
          double want = 0;
          for (int64_t x = 0; x < c.e; ++x) {
            for (int64_t i = 0; i < c.h; ++i) {
              want += d.probs[size_t(m * c.e + x)] * c.x.data<double>()[r * c.h + i] *
                      c.maps.data<double>()[(x * c.h + i) * c.h + j];
            }
          }
          EXPECT_NEAR(out.data<double>()[r * c.h + j], want, 1e-14) << "token " << r;
        }
      }
      // Padded: each expert's block is its 3 rows, the kept ones first, -1 after.
      for (int64_t i = 0; pad && i < c.perm.numel(); ++i) {
        const int32_t s = c.perm.data<int32_t>()[i];
        if (s >= 0) {
          EXPECT_EQ(c.idx.data<int32_t>()[s], i / 3) << "row " << i;
        }
      }
      // The chain's gradient (x, and the logits through the kept rows' weights) by differences.
      const Tensor up = random({c.n, c.h}, DType::kF64, rng);
      auto loss = [&] { return dot(run_chain(c), up); };
      const auto idx0 = values(c.idx);
      const auto perm0 = values(c.perm);
      Tensor rows = make({c.perm.numel(), c.h}, DType::kF64);
      permute_forward(rows, c.x, c.perm, c.k);
      const Tensor y = apply_maps(rows, c, false);  // as run_chain forms it
      Tensor dy = make(y.shape(), DType::kF64), dw = random({c.n, c.k}, DType::kF64, rng);
      combine_backward(dy, dw, up, y, c.perm, c.w);
      const Tensor d_rows = apply_maps(dy, c, true);
      Tensor dx = make({c.n, c.h}, DType::kF64);
      permute_backward(dx, d_rows, c.perm, c.k);
      expect_grad(dx, numeric_grad(c.x, loss), "dx through the kept rows");
      Tensor dlogits = make({c.n, c.e}, DType::kF64);
      router_backward(dlogits, dw, c.idx, c.w, c.probs, Tensor(), Tensor(), RouterSpec(),
                      RouterLoss(), 1.0);
      expect_grad(dlogits, numeric_grad(c.logits, loss), "dlogits through the kept weights");
      EXPECT_EQ(values(c.idx), idx0);
      EXPECT_EQ(values(c.perm), perm0);  // the differences changed no choice
    }
  }
}

}  // namespace
}  // namespace tandem::ops::test
