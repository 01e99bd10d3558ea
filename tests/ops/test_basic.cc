// Elementwise ops, embedding, SwiGLU, cross-entropy and AdamW on CPU.
// Oracles: values computed by hand or by the formula in plain loops; fp64 central finite
// differences for every backward; the f64 op for the f32 op; adamw_step (by hand) for
// adamw_step_flat.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "op_test_util.h"
#include "ops/ops.h"

namespace tandem::ops::test {
namespace {

TEST(Elementwise, AxpyAddsOrOverwrites) {
  Tensor x = f64({3}, {1, 2, 3});
  Tensor y = f64({3}, {10, 20, 30});
  axpy(y, x, 2.0, Accumulate::kAdd);
  EXPECT_EQ(values(y), (std::vector<double>{12, 24, 36}));
  axpy(y, x, -0.5, Accumulate::kOverwrite);
  EXPECT_EQ(values(y), (std::vector<double>{-0.5, -1, -1.5}));
}

TEST(Elementwise, ScaleSumSquaresAllFinite) {
  Tensor x = to_f32(f64({4}, {1, -2, 3, 0.5}));
  scale(x, 2.0);
  EXPECT_EQ(values(x), (std::vector<double>{2, -4, 6, 1}));
  EXPECT_EQ(sum_squares(x), 4.0 + 16 + 36 + 1);
  EXPECT_TRUE(all_finite(x));
  x.data<float>()[2] = INFINITY;
  EXPECT_FALSE(all_finite(x));
  x.data<float>()[2] = NAN;
  EXPECT_FALSE(all_finite(x));
}

TEST(Elementwise, MismatchedDtypeThrows) {
  Tensor y = make({3}, DType::kF64);
  Tensor x = make({3}, DType::kF32);
  EXPECT_THROW(axpy(y, x, 1.0), Error);
}

// Note [Lanes] on the CPU: the pieces run at once, in order; a piece's error reaches the caller
// and the Lanes still joins as it unwinds (the GPU side: CudaLanes in tests/cuda).
TEST(Lanes, CpuPiecesRunInOrderAndErrorsPropagate) {
  const Tensor on = make({1}, DType::kF32);
  std::vector<int64_t> order;
  {
    Lanes lanes(on);
    for (int64_t p = 0; p < 7; ++p) lanes.run(p, [&] { order.push_back(p); });
    EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
    lanes.join();
  }
  EXPECT_THROW(
      {
        Lanes lanes(on);
        lanes.run(0, [] {});
        lanes.run(1, [] { TANDEM_CHECK(false, "piece 1 failed"); });
      },
      Error);
}

// --expert-lanes (Note [Performance settings] in core/tuning.h): a bad value is refused naming it
// and the range, and leaves the setting as it was; a good one is what Lanes takes.
TEST(Lanes, CountFromThePerformanceSettings) {
  const Tuning before = tuning();
  Tuning t;
  t.expert_lanes = 9;
  try {
    set_tuning(t);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-lanes 9"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("between 1 and 8"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Lanes::count(), before.expert_lanes);
  t.expert_lanes = 2;
  set_tuning(t);
  EXPECT_EQ(Lanes::count(), 2);
  set_tuning(before);
}

TEST(Embedding, ForwardCopiesRowsAndBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(1);
  const int64_t v = 5, h = 3;
  Tensor table = random({v, h}, DType::kF64, rng);
  Tensor ids = i32({4}, {3, 0, 3, 4});  // id 3 twice: its gradient rows must add up
  Tensor out = make({4, h}, DType::kF64);
  embedding_forward(out, ids, table);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < h; ++c) {
      EXPECT_EQ(out.data<double>()[r * h + c],
                table.data<double>()[ids.data<int32_t>()[r] * h + c]);
    }
  }
  Tensor up = random({4, h}, DType::kF64, rng);
  Tensor dtable = make({v, h}, DType::kF64);
  embedding_backward(dtable, up, ids);
  const auto numeric = numeric_grad(table, [&] {
    embedding_forward(out, ids, table);
    return dot(out, up);
  });
  expect_grad(dtable, numeric, "dtable");
}

TEST(Embedding, OutOfRangeIdThrowsNamingIdRowAndRange) {
  Tensor table = make({5, 2}, DType::kF32);
  Tensor out = make({3, 2}, DType::kF32);
  for (int32_t bad : {5, -1}) {
    Tensor ids = i32({3}, {0, 1, bad});
    try {
      embedding_forward(out, ids, table);
      FAIL() << "no error for id " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[0, 5)"), std::string::npos) << msg;
    }
    Tensor dtable = make({5, 2}, DType::kF32);
    EXPECT_THROW(embedding_backward(dtable, out, ids), Error);
  }
}

// gate_up rows are (gate | up): out[i][j] = silu(gate_up[i][j]) * gate_up[i][F + j].
TEST(SwiGLU, ForwardMatchesFormulaAndBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  const int64_t m = 3, f = 4;
  Tensor gate_up = random({m, 2 * f}, DType::kF64, rng, -3, 3);
  Tensor out = make({m, f}, DType::kF64);
  swiglu_forward(out, gate_up);
  const double* gu = gate_up.data<double>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < f; ++j) {
      const double g = gu[i * 2 * f + j], u = gu[i * 2 * f + f + j];
      EXPECT_NEAR(out.data<double>()[i * f + j], g / (1 + std::exp(-g)) * u, 1e-15);
    }
  }
  Tensor r = random({m, f}, DType::kF64, rng);
  Tensor d_gate_up = make({m, 2 * f}, DType::kF64);
  swiglu_backward(d_gate_up, r, gate_up);
  auto loss = [&] {
    swiglu_forward(out, gate_up);
    return dot(out, r);
  };
  expect_grad(d_gate_up, numeric_grad(gate_up, loss), "d_gate_up");
  // f32 against the f64 op (out recomputed: the difference left it at a perturbed input).
  swiglu_forward(out, gate_up);
  Tensor out32 = make({m, f}, DType::kF32), d_gate_up32 = make({m, 2 * f}, DType::kF32);
  swiglu_forward(out32, to_f32(gate_up));
  swiglu_backward(d_gate_up32, to_f32(r), to_f32(gate_up));
  expect_f32_close(out32, out, "out");
  expect_f32_close(d_gate_up32, d_gate_up, "d_gate_up");
  // An odd width is not (gate | up).
  EXPECT_THROW(swiglu_forward(make({m, 2}, DType::kF64), make({m, 5}, DType::kF64)), Error);
}

// -log softmax(row)[t] summed over rows, by the definition in long double.
double naive_ce(const Tensor& logits, const std::vector<int32_t>& t) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const auto x = values(logits);
  long double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    long double z = 0;
    for (int64_t j = 0; j < v; ++j) z += std::exp(static_cast<long double>(x[r * v + j]));
    total += -std::log(std::exp(static_cast<long double>(x[r * v + t[r]])) / z);
  }
  return static_cast<double>(total);
}

TEST(CrossEntropy, ForwardIsSumOfRowLossesAndBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(3);
  const std::vector<int32_t> tv = {2, 0, 6, 6};
  Tensor targets = i32({4}, tv);
  Tensor logits = random({4, 7}, DType::kF64, rng, -4, 4);
  EXPECT_NEAR(cross_entropy_forward(logits, targets), naive_ce(logits, tv), 1e-12);
  const double s = 0.37;
  Tensor dlogits = make({4, 7}, DType::kF64);
  cross_entropy_backward(dlogits, logits, targets, s);
  expect_grad(dlogits,
              numeric_grad(logits, [&] { return s * cross_entropy_forward(logits, targets); }),
              "dlogits");
  // In place: dlogits aliasing logits gives the same values.
  Tensor inplace = clone(logits);
  cross_entropy_backward(inplace, inplace, targets, s);
  EXPECT_EQ(values(inplace), values(dlogits));
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  Tensor logits = f64({1, 3}, {1000, 0, -1000});
  Tensor targets = i32({1}, {1});
  EXPECT_NEAR(cross_entropy_forward(logits, targets), 1000.0, 1e-9);
}

TEST(CrossEntropy, F32MatchesF64) {
  std::mt19937_64 rng(4);
  Tensor targets = i32({5}, {0, 1, 2, 8, 3});
  Tensor l64 = random({5, 9}, DType::kF64, rng, -5, 5);
  Tensor l32 = to_f32(l64);
  const double a = cross_entropy_forward(l64, targets), b = cross_entropy_forward(l32, targets);
  EXPECT_NEAR(b, a, kF32Tol * std::fabs(a));
  Tensor d64 = make({5, 9}, DType::kF64), d32 = make({5, 9}, DType::kF32);
  cross_entropy_backward(d64, l64, targets, 1.0);
  cross_entropy_backward(d32, l32, targets, 1.0);
  expect_f32_close(d32, d64, "dlogits");
}

TEST(CrossEntropy, OutOfRangeTargetThrowsNamingTargetRowAndRange) {
  Tensor logits = make({2, 4}, DType::kF32);
  Tensor targets = i32({2}, {1, 4});
  try {
    cross_entropy_forward(logits, targets);
    FAIL() << "no error for target 4";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("target 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 4)"), std::string::npos) << msg;
  }
  Tensor d = make({2, 4}, DType::kF32);
  EXPECT_THROW(cross_entropy_backward(d, logits, i32({2}, {-3, 0}), 1.0), Error);
}

// Two AdamW steps against the update written out by hand (PyTorch's AdamW).
template <typename T>
void check_adamw(DType dt, double tol) {
  const std::vector<double> p0 = {0.5, -1.0, 2.0}, g1 = {0.1, -0.3, 0.0}, g2 = {-0.2, 0.4, 1e-3};
  const AdamWParams base{1e-2, 0.9, 0.95, 1e-8, 0.1, 1};
  Tensor p = make({3}, dt), g = make({3}, dt), m = make({3}, dt), v = make({3}, dt);
  for (int i = 0; i < 3; ++i) p.data<T>()[i] = static_cast<T>(p0[i]);
  std::vector<double> ep = p0, em(3, 0.0), ev(3, 0.0);
  for (int64_t step = 1; step <= 2; ++step) {
    const auto& gs = step == 1 ? g1 : g2;
    for (int i = 0; i < 3; ++i) g.data<T>()[i] = static_cast<T>(gs[i]);
    AdamWParams hp = base;
    hp.step = step;
    adamw_step(p, g, m, v, hp);
    for (int i = 0; i < 3; ++i) {
      const double gi = static_cast<T>(gs[i]);
      ep[i] -= hp.lr * hp.weight_decay * ep[i];
      em[i] = hp.beta1 * em[i] + (1 - hp.beta1) * gi;
      ev[i] = hp.beta2 * ev[i] + (1 - hp.beta2) * gi * gi;
      const double mhat = em[i] / (1 - std::pow(hp.beta1, step));
      const double vhat = ev[i] / (1 - std::pow(hp.beta2, step));
      ep[i] -= hp.lr * mhat / (std::sqrt(vhat) + hp.eps);
    }
    if (step == 1) {
      // Adam's first step moves each parameter by lr * sign(g) after the decay (|g| >> eps).
      for (int i = 0; i < 3; ++i) {
        const double sign = gs[i] > 0 ? 1.0 : (gs[i] < 0 ? -1.0 : 0.0);
        EXPECT_NEAR(p.data<T>()[i], p0[i] * (1 - 1e-3) - 1e-2 * sign, 1e-6) << "param " << i;
      }
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(p.data<T>()[i], ep[i], tol) << "param " << i << " step " << step;
      EXPECT_NEAR(m.data<T>()[i], em[i], tol) << "m " << i << " step " << step;
      EXPECT_NEAR(v.data<T>()[i], ev[i], tol) << "v " << i << " step " << step;
    }
  }
}

TEST(AdamW, TwoStepsMatchHandFormulaF64) { check_adamw<double>(DType::kF64, 1e-15); }
TEST(AdamW, TwoStepsMatchHandFormulaF32) { check_adamw<float>(DType::kF32, 1e-6); }

TEST(AdamW, StepZeroThrows) {
  Tensor p = make({2}, DType::kF32), g = make({2}, DType::kF32);
  Tensor m = make({2}, DType::kF32), v = make({2}, DType::kF32);
  EXPECT_THROW(adamw_step(p, g, m, v, AdamWParams{1e-3, 0.9, 0.95, 1e-8, 0.0, 0}), Error);
}

// adamw_step_flat against adamw_step run by run (weight decay on the `decayed` ranges, 0 off
// them) on gradients scaled first by scale(): bit for bit; its bf16 copy against convert().
void check_adamw_flat(DType dt) {
  const int64_t n = 23;
  // Adjacent ranges, an empty one, one at the end: runs off, on, on, off, on.
  const std::vector<int64_t> decayed = {3, 9, 9, 14, 17, 17, 17, 23};
  const std::vector<bool> decays = [&] {
    std::vector<bool> d(n, false);
    for (size_t r = 0; r < decayed.size(); r += 2) {
      for (int64_t i = decayed[r]; i < decayed[r + 1]; ++i) d[static_cast<size_t>(i)] = true;
    }
    return d;
  }();
  std::mt19937_64 rng(5);
  const Tensor p = random({n}, dt, rng), m = make({n}, dt), v = make({n}, dt);
  const Tensor copy = make({n}, DType::kBF16);
  const Tensor rp = clone(p), rm = make({n}, dt), rv = make({n}, dt);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor g = random({n}, dt, rng), rg = clone(g), g0 = clone(g);
    const double coeff = step == 2 ? 1.0 : 0.3;
    const AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, step};
    adamw_step_flat(p, m, v, copy, g, decayed, coeff, hp);
    scale(rg, coeff);
    for (int64_t i = 0; i < n;) {  // the reference, one run of equal decay at a time
      int64_t end = i + 1;
      while (end < n && decays[static_cast<size_t>(end)] == decays[static_cast<size_t>(i)]) ++end;
      AdamWParams run = hp;
      run.weight_decay = decays[static_cast<size_t>(i)] ? hp.weight_decay : 0.0;
      adamw_step(rp.narrow_rows(i, end - i), rg.narrow_rows(i, end - i), rm.narrow_rows(i, end - i),
                 rv.narrow_rows(i, end - i), run);
      i = end;
    }
    EXPECT_EQ(values(p), values(rp)) << "step " << step;
    EXPECT_EQ(values(m), values(rm)) << "step " << step;
    EXPECT_EQ(values(v), values(rv)) << "step " << step;
    EXPECT_EQ(values(g), values(g0)) << "the gradient is an input only";
  }
  EXPECT_NE(values(m), values(make({n}, dt)));
  const Tensor want = make({n}, DType::kBF16);
  convert(want, rp);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(copy.data<BF16>()[i].bits, want.data<BF16>()[i].bits) << "copy " << i;
  }
  // Without a copy: the same update.
  const Tensor p2 = clone(rp), m2 = clone(rm), v2 = clone(rv), g = random({n}, dt, rng);
  const AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 4};
  adamw_step_flat(p, m, v, copy, g, decayed, 0.5, hp);
  adamw_step_flat(p2, m2, v2, Tensor(), g, decayed, 0.5, hp);
  EXPECT_EQ(values(p2), values(p));
}

TEST(AdamW, FlatMatchesScaleThenStepPerRunF64) { check_adamw_flat(DType::kF64); }
TEST(AdamW, FlatMatchesScaleThenStepPerRunF32) { check_adamw_flat(DType::kF32); }

TEST(AdamW, FlatRejectsBadRangesAndCopy) {
  const int64_t n = 8;
  const Tensor p = make({n}, DType::kF32), g = make({n}, DType::kF32);
  const Tensor m = make({n}, DType::kF32), v = make({n}, DType::kF32);
  const AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
  auto message = [&](const std::vector<int64_t>& decayed, const Tensor& copy) {
    try {
      adamw_step_flat(p, m, v, copy, g, decayed, 1.0, hp);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({0, 8}, Tensor()), "");
  EXPECT_NE(message({2}, Tensor()).find("expected [begin, end) pairs"), std::string::npos);
  EXPECT_NE(message({4, 2}, Tensor()).find("decayed[1] is 2"), std::string::npos);
  EXPECT_NE(message({2, 9}, Tensor()).find("within [2, 8]"), std::string::npos);
  EXPECT_NE(message({}, make({n}, DType::kF32)).find("param_bf16"), std::string::npos);
  EXPECT_THROW(
      adamw_step_flat(p, m, v, Tensor(), g, {}, 1.0, AdamWParams{1e-3, 0.9, 0.95, 1e-8, 0.1, 0}),
      Error);
}

// Note [Grouped expert products]: with --expert-grouped auto (the default), the forward and the
// input gradients are grouped for small experts only; a named phase is grouped whatever the rows.
TEST(GroupedExpertProducts, OnlyForExpertsOfFewRows) {
  ASSERT_EQ(tuning().expert_grouped, "auto");
  using ops::ExpertPhase;
  EXPECT_TRUE(ops::grouped_expert_phase(ExpertPhase::kForward, 32768, 128));    // 256 rows each
  EXPECT_TRUE(ops::grouped_expert_phase(ExpertPhase::kForward, 4096 * 6, 64));  // 384 rows each
  EXPECT_TRUE(ops::grouped_expert_phase(ExpertPhase::kForward, 511 * 4, 4));
  EXPECT_FALSE(ops::grouped_expert_phase(ExpertPhase::kForward, 512 * 4, 4));
  EXPECT_FALSE(ops::grouped_expert_phase(ExpertPhase::kForward, 8192, 8));  // 1,024 rows each
  EXPECT_TRUE(ops::grouped_expert_phase(ExpertPhase::kInput, 32768, 128));
  EXPECT_TRUE(ops::grouped_expert_phase(ExpertPhase::kInput, 4096 * 6, 64));
  EXPECT_FALSE(ops::grouped_expert_phase(ExpertPhase::kInput, 8192, 8));
  const Tuning before = tuning();
  Tuning t;
  t.expert_grouped = "input";
  set_tuning(t);
  EXPECT_FALSE(ops::grouped_expert_phase(ExpertPhase::kForward, 32768, 128));
  EXPECT_TRUE(ops::grouped_expert_phase(ExpertPhase::kInput, 8192, 8));
  t.expert_grouped = "forward,input";
  set_tuning(t);
  EXPECT_TRUE(ops::grouped_expert_phase(ExpertPhase::kForward, 8192, 8));
  t.expert_grouped = "sometimes";
  EXPECT_THROW(set_tuning(t), Error);
  set_tuning(before);
}

}  // namespace
}  // namespace tandem::ops::test
