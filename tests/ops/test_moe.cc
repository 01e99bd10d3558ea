// Router, aux loss, token permutation and combine on CPU (the router's other losses and the
// expert capacity: test_router_losses.cc).
// Oracles: hand-worked examples (tie-breaking, permutation order, counts, aux loss), softmax by
// its definition, fp64 central finite differences for router_backward (selected softmax plus the
// aux term), permute_backward and combine_backward; the f64 op for the f32 op.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

TEST(Router, TopKDescendingWithTiesToLowerIndex) {
  // Row 0: three-way tie at 3 -> experts 1, 2. Row 1: all equal -> 0, 1. Row 2: clear order.
  Tensor logits = f64({3, 5}, {1, 3, 3, 0, 3,  //
                               2, 2, 2, 2, 2,  //
                               0.5, -1, 4, 2, 0});
  Tensor idx = make({3, 2}, DType::kI32), w = make({3, 2}, DType::kF64);
  Tensor probs = make({3, 5}, DType::kF64);
  router_forward(idx, w, probs, logits);
  EXPECT_EQ(values(idx), (std::vector<double>{1, 2, 0, 1, 2, 3}));
  // Softmax over the two selected logits only.
  EXPECT_DOUBLE_EQ(w.data<double>()[0], 0.5);
  EXPECT_DOUBLE_EQ(w.data<double>()[2], 0.5);
  EXPECT_NEAR(w.data<double>()[4], 1 / (1 + std::exp(-2.0)), 1e-15);
  EXPECT_NEAR(w.data<double>()[5], 1 / (1 + std::exp(2.0)), 1e-15);
  // probs: softmax over all five.
  for (int64_t r = 0; r < 3; ++r) {
    double z = 0;
    for (int64_t e = 0; e < 5; ++e) z += std::exp(logits.data<double>()[r * 5 + e]);
    for (int64_t e = 0; e < 5; ++e) {
      EXPECT_NEAR(probs.data<double>()[r * 5 + e], std::exp(logits.data<double>()[r * 5 + e]) / z,
                  1e-15);
    }
  }
  Tensor counts = make({5}, DType::kI32);
  router_counts(counts, idx);
  EXPECT_EQ(values(counts), (std::vector<double>{1, 2, 2, 1, 0}));
}

// The switch loss coeff E sum_e f_e P_e as RouterLoss weighs it: balance = coeff E / (k N^2).
RouterLoss switch_loss(double coeff, int64_t e, int64_t k, int64_t n) {
  RouterLoss l;
  l.balance = coeff * double(e) / (double(k) * double(n) * double(n));
  return l;
}

TEST(Router, AuxLossMatchesHandFormula) {
  // N = 2, E = 3, k = 1; counts {2, 0, 0}: f = {1, 0, 0}; P_0 = (0.5 + 0.2) / 2 = 0.35.
  Tensor probs = f64({2, 3}, {0.5, 0.3, 0.2, 0.2, 0.1, 0.7});
  Tensor counts = f64({1, 3}, {2, 0, 0});
  EXPECT_NEAR(router_loss(probs, counts, Tensor(), switch_loss(0.01, 3, 1, 2)),
              0.01 * 3 * 1.0 * 0.35, 1e-16);
  // k = 2 halves f.
  Tensor counts2 = f64({1, 3}, {2, 1, 1});
  const double want = 0.01 * 3 * (0.5 * 0.35 + 0.25 * 0.2 + 0.25 * 0.45);
  EXPECT_NEAR(router_loss(probs, counts2, Tensor(), switch_loss(0.01, 3, 2, 2)), want, 1e-16);
  // The counts are the top k of each row's probs: {0, 1} and {2, 0}.
  Tensor made = make({1, 3}, DType::kF64);
  router_aux_counts(made, probs, 2);
  EXPECT_EQ(values(made), (std::vector<double>{2, 1, 1}));
  // The pending form: on the CPU ready at once, the same value, copies agreeing.
  PendingScalar pending = router_loss_start(probs, counts2, Tensor(), switch_loss(0.01, 3, 2, 2));
  PendingScalar copy = pending;
  EXPECT_EQ(pending.get(), router_loss(probs, counts2, Tensor(), switch_loss(0.01, 3, 2, 2)));
  EXPECT_EQ(copy.get(), pending.get());
}

TEST(Router, BackwardMatchesFiniteDifferencesIncludingAux) {
  std::mt19937_64 rng(40);
  const int64_t n = 6, e = 5, k = 2;
  const double coeff = 0.3, aux_scale = 1.7;  // large enough that the aux term matters
  Tensor logits = random({n, e}, DType::kF64, rng, -2, 2);
  Tensor idx = make({n, k}, DType::kI32), w = make({n, k}, DType::kF64);
  Tensor probs = make({n, e}, DType::kF64), counts = make({1, e}, DType::kF64);
  Tensor up = random({n, k}, DType::kF64, rng);
  const RouterLoss aux = switch_loss(coeff, e, k, n);
  router_forward(idx, w, probs, logits);
  router_aux_counts(counts, probs, k);
  const auto idx0 = values(idx);
  auto loss = [&] {
    router_forward(idx, w, probs, logits);
    EXPECT_EQ(values(idx), idx0);  // the step is small enough not to change the selection
    return dot(w, up) + aux_scale * router_loss(probs, counts, Tensor(), aux);
  };
  Tensor dlogits = random({n, e}, DType::kF64, rng);  // overwritten
  router_backward(dlogits, up, idx, w, probs, counts, Tensor(), RouterSpec(), aux, aux_scale);
  expect_grad(dlogits, numeric_grad(logits, loss), "dlogits");
  // The aux term alone (no upstream through topk_w) also matches.
  Tensor zero_up = make({n, k}, DType::kF64);
  router_forward(idx, w, probs, logits);  // the difference left them at a perturbed input
  router_backward(dlogits, zero_up, idx, w, probs, counts, Tensor(), RouterSpec(), aux, aux_scale);
  expect_grad(dlogits,
              numeric_grad(logits,
                           [&] {
                             router_forward(idx, w, probs, logits);
                             return aux_scale * router_loss(probs, counts, Tensor(), aux);
                           }),
              "dlogits (aux only)");
}

TEST(Router, F32MatchesF64) {
  std::mt19937_64 rng(41);
  const int64_t n = 16, e = 8, k = 2;
  Tensor l64 = random({n, e}, DType::kF64, rng, -3, 3), up = random({n, k}, DType::kF64, rng);
  Tensor res[2][3];  // topk_w, probs, dlogits
  Tensor idx[2];
  for (int i = 0; i < 2; ++i) {
    const DType dt = i == 0 ? DType::kF64 : DType::kF32;
    Tensor l = i == 0 ? clone(l64) : to_f32(l64), u = i == 0 ? clone(up) : to_f32(up);
    idx[i] = make({n, k}, DType::kI32);
    res[i][0] = make({n, k}, dt), res[i][1] = make({n, e}, dt), res[i][2] = make({n, e}, dt);
    Tensor counts = make({1, e}, dt);
    router_forward(idx[i], res[i][0], res[i][1], l);
    router_aux_counts(counts, res[i][1], k);
    router_backward(res[i][2], u, idx[i], res[i][0], res[i][1], counts, Tensor(), RouterSpec(),
                    switch_loss(0.01, e, k, n), 1.0);
  }
  EXPECT_EQ(values(idx[1]), values(idx[0]));
  const char* names[3] = {"topk_w", "probs", "dlogits"};
  for (int j = 0; j < 3; ++j) expect_f32_close(res[1][j], res[0][j], names[j]);
}

TEST(Permutation, StableExpertOrderThenTokenThenSlot) {
  // N = 4, k = 2, E = 4; slots (n*k + j): 0:e2 1:e0 | 2:e0 3:e2 | 4:e3 5:e0 | 6:e2 7:e0.
  Tensor idx = i32({4, 2}, {2, 0, 0, 2, 3, 0, 2, 0});
  Tensor perm = make({8}, DType::kI32), counts = make({4}, DType::kI32);
  moe_permutation(perm, counts, idx, Tensor(), 4);
  EXPECT_EQ(values(perm), (std::vector<double>{1, 2, 5, 7, 0, 3, 6, 4}));
  EXPECT_EQ(values(counts), (std::vector<double>{4, 0, 3, 1}));
  // Same expert twice for one token keeps slot order.
  Tensor dup = i32({2, 2}, {1, 1, 0, 1});
  Tensor perm2 = make({4}, DType::kI32), counts2 = make({2}, DType::kI32);
  moe_permutation(perm2, counts2, dup, Tensor(), 2);
  EXPECT_EQ(values(perm2), (std::vector<double>{2, 0, 1, 3}));
}

// Note [Expert placement]: by place, the same slots as the example above, hand-sorted.
TEST(Permutation, ByPlaceSortsByEachExpertsPlace) {
  Tensor idx = i32({4, 2}, {2, 0, 0, 2, 3, 0, 2, 0});
  Tensor slot = i32({4}, {2, 3, 0, 1});  // expert 0 at place 2, 1 at 3, 2 at 0, 3 at 1
  Tensor perm = make({8}, DType::kI32), counts = make({4}, DType::kI32);
  moe_permutation(perm, counts, idx, Tensor(), 4, slot);
  // Place 0 (expert 2): slots 0 3 6; place 1 (expert 3): 4; place 2 (expert 0): 1 2 5 7.
  EXPECT_EQ(values(perm), (std::vector<double>{0, 3, 6, 4, 1, 2, 5, 7}));
  EXPECT_EQ(values(counts), (std::vector<double>{3, 1, 4, 0}));
  Tensor twice = i32({4}, {2, 3, 2, 1});
  try {
    moe_permutation(perm, counts, idx, Tensor(), 4, twice);
    FAIL() << "a placement with place 2 twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("place 2 twice"), std::string::npos) << e.what();
  }
}

TEST(Permutation, PermuteForwardCopiesTokenRows) {
  Tensor x = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor perm = i32({4}, {3, 0, 2, 1});  // k = 2: slots 3, 0, 2, 1 -> tokens 1, 0, 1, 0
  Tensor out = make({4, 3}, DType::kF64);
  permute_forward(out, x, perm, 2);
  EXPECT_EQ(values(out), (std::vector<double>{4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3}));
  Tensor bad = i32({4}, {3, 0, 3, 1});
  EXPECT_THROW(permute_forward(out, x, bad, 2), Error);
}

struct Routed {
  int64_t n, k, e, h;
  Tensor idx, w, perm;
};

Routed make_routed(std::mt19937_64& rng) {
  Routed r{5, 2, 3, 4, {}, {}, {}};
  Tensor logits = random({r.n, r.e}, DType::kF64, rng, -2, 2);
  r.idx = make({r.n, r.k}, DType::kI32), r.w = make({r.n, r.k}, DType::kF64);
  Tensor probs = make({r.n, r.e}, DType::kF64), counts = make({r.e}, DType::kI32);
  router_forward(r.idx, r.w, probs, logits);
  r.perm = make({r.n * r.k}, DType::kI32);
  moe_permutation(r.perm, counts, r.idx, Tensor(), r.e);
  return r;
}

TEST(Permutation, PermuteBackwardMatchesFiniteDifferencesAndHonoursAccumulate) {
  std::mt19937_64 rng(42);
  const Routed r = make_routed(rng);
  Tensor x = random({r.n, r.h}, DType::kF64, rng), out = make({r.n * r.k, r.h}, DType::kF64);
  Tensor up = random({r.n * r.k, r.h}, DType::kF64, rng);
  Tensor dx = random({r.n, r.h}, DType::kF64, rng);
  permute_backward(dx, up, r.perm, r.k);  // default kOverwrite
  expect_grad(dx,
              numeric_grad(x,
                           [&] {
                             permute_forward(out, x, r.perm, r.k);
                             return dot(out, up);
                           }),
              "dx");
  Tensor base = random({r.n, r.h}, DType::kF64, rng), add = clone(base);
  permute_backward(add, up, r.perm, r.k, Accumulate::kAdd);
  for (int64_t i = 0; i < base.numel(); ++i) {
    EXPECT_NEAR(add.data<double>()[i], base.data<double>()[i] + dx.data<double>()[i], 1e-15);
  }
}

TEST(Combine, ForwardAddsWeightedRowsIntoOut) {
  // N = 2, k = 2, perm {2, 0, 3, 1}: row i holds slot perm[i].
  Tensor y = f64({4, 2}, {1, 10, 2, 20, 3, 30, 4, 40});
  Tensor perm = i32({4}, {2, 0, 3, 1});
  Tensor w = f64({2, 2}, {0.25, 0.75, 0.5, 0.5});
  Tensor out = f64({2, 2}, {100, 200, 300, 400});
  combine_forward(out, y, perm, w);
  // token 0: slot 0 at row 1 (2, 20), slot 1 at row 3 (4, 40); token 1: slot 2 at row 0, slot 3
  // at row 2.
  EXPECT_EQ(values(out),
            (std::vector<double>{100 + 0.25 * 2 + 0.75 * 4, 200 + 0.25 * 20 + 0.75 * 40,
                                 300 + 0.5 * 1 + 0.5 * 3, 400 + 0.5 * 10 + 0.5 * 30}));
}

TEST(Combine, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(43);
  Routed r = make_routed(rng);
  Tensor y = random({r.n * r.k, r.h}, DType::kF64, rng), up = random({r.n, r.h}, DType::kF64, rng);
  Tensor out = make({r.n, r.h}, DType::kF64);
  auto loss = [&] {
    out.zero_();
    combine_forward(out, y, r.perm, r.w);
    return dot(out, up);
  };
  Tensor dy = random(y.shape(), DType::kF64, rng), dw = random({r.n, r.k}, DType::kF64, rng);
  combine_backward(dy, dw, up, y, r.perm, r.w);
  expect_grad(dy, numeric_grad(y, loss), "dy");
  expect_grad(dw, numeric_grad(r.w, loss), "dtopk_w");
}

TEST(Combine, F32MatchesF64) {
  std::mt19937_64 rng(44);
  Routed r = make_routed(rng);
  Tensor y = random({r.n * r.k, r.h}, DType::kF64, rng), up = random({r.n, r.h}, DType::kF64, rng);
  Tensor res[2][3];  // out, dy, dtopk_w
  for (int i = 0; i < 2; ++i) {
    const DType dt = i == 0 ? DType::kF64 : DType::kF32;
    auto cvt = [&](const Tensor& t) { return i == 0 ? clone(t) : to_f32(t); };
    Tensor yi = cvt(y), ui = cvt(up), wi = cvt(r.w);
    res[i][0] = make({r.n, r.h}, dt), res[i][1] = make(y.shape(), dt),
    res[i][2] = make({r.n, r.k}, dt);
    combine_forward(res[i][0], yi, r.perm, wi);
    combine_backward(res[i][1], res[i][2], ui, yi, r.perm, wi);
  }
  const char* names[3] = {"out", "dy", "dtopk_w"};
  for (int j = 0; j < 3; ++j) expect_f32_close(res[1][j], res[0][j], names[j]);
}

TEST(RowBlocks, CopiesEachBlockAndChecksItsArguments) {
  // Rows of 2 elements; blocks move [0,2) -> [3,5), [2,3) -> [0,1), [3,5) -> [1,3); row 5 of out
  // is left as it was.
  Tensor in = f64({5, 2}, {0, 1, 10, 11, 20, 21, 30, 31, 40, 41});
  Tensor out = f64({6, 2}, {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -7, -7});
  copy_row_blocks(out, in, {{0, 3, 2}, {2, 0, 1}, {3, 1, 2}, {4, 5, 0}});
  EXPECT_EQ(values(out), (std::vector<double>{20, 21, 30, 31, 40, 41, 0, 1, 10, 11, -7, -7}));
  // Any dtype: i32 rows of 3.
  Tensor ii = make({2, 3}, DType::kI32), io = make({2, 3}, DType::kI32);
  for (int j = 0; j < 6; ++j) ii.data<int32_t>()[j] = j;
  copy_row_blocks(io, ii, {{0, 1, 1}, {1, 0, 1}});
  EXPECT_EQ(values(io), (std::vector<double>{3, 4, 5, 0, 1, 2}));
  // Errors name what is wrong.
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              copy_row_blocks(out, in, {{4, 5, 2}});
            }).find("outside"),
            std::string::npos);
  EXPECT_NE(message([&] {
              copy_row_blocks(out, in, {{0, 0, 2}, {2, 1, 1}});
            }).find("overlap"),
            std::string::npos);
  EXPECT_NE(message([&] { copy_row_blocks(io, in, {}); }).find("must match"), std::string::npos);
  Tensor wide = make({2, 3}, DType::kF64);
  EXPECT_NE(message([&] { copy_row_blocks(out, wide, {}); }).find("elements"), std::string::npos);
}

}  // namespace
}  // namespace tandem::ops::test
