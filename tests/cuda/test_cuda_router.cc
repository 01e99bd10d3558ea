// CUDA routers against the CPU reference (ops::cpu through ops.h): the softmax router's top-k with
// ties and its weights, counts and the switch aux loss, its backward; DeepSeek-V3's sigmoid
// router with its expert bias, groups (the others out of the choice) and scaling; reading a
// started value back (HostRead). The other losses and the expert capacity:
// test_cuda_router_losses.cc.
// Exact equality for integer outputs (top-k ids, counts); gpu_test.h's tolerance per output
// dtype for float ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "gpu_test.h"

namespace tandem::testing_gpu {
namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kBF16 = DType::kBF16;
constexpr Tolerance kExact{0, 0};

// ---- router ----

struct RouterCase {
  int64_t n, e, k;
};
// E below, at and above a warp; k up to E; an empty batch.
constexpr RouterCase kRouterCases[] = {{37, 8, 2},  {100, 64, 4}, {19, 37, 3},
                                       {5, 100, 1}, {7, 3, 3},    {0, 8, 2}};

// Logits in steps of 0.25 over a few values: many exact ties, broken toward the lower index.
Tensor tied_logits(int64_t n, int64_t e, uint64_t seed) {
  Tensor t = random_host({n, e}, seed, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = std::round(t.data<float>()[i] * 4) / 4;
  }
  return t;
}

constexpr ops::RouterScore kScores[] = {ops::RouterScore::kSoftmaxOfSelected,
                                        ops::RouterScore::kSoftmaxOfAll};
using testing_gpu::name;  // gpu_test.h's, for a DType, beside this one
std::string name(ops::RouterScore s) {
  return s == ops::RouterScore::kSoftmaxOfAll ? " pre-softmax" : "";
}

TEST(CudaRouter, ForwardTopKTiesAndSoftmax) {
  for (const RouterCase& c : kRouterCases) {
    for (bool ties : {false, true}) {
      for (ops::RouterScore score : kScores) {
        const std::string what = "router_forward n " + std::to_string(c.n) + " E " +
                                 std::to_string(c.e) + " k " + std::to_string(c.k) +
                                 (ties ? " ties" : "") + name(score);
        Tensor logits = ties ? tied_logits(c.n, c.e, 32) : random_host({c.n, c.e}, 32, 3.0);
        Tensor idx =
            Tensor::empty({c.n, c.k}, DType::kI32, MemCategory::kOther, "i", Device::kCUDA);
        Tensor w = Tensor::empty({c.n, c.k}, kF32, MemCategory::kOther, "w", Device::kCUDA);
        Tensor probs = Tensor::empty({c.n, c.e}, kF32, MemCategory::kOther, "p", Device::kCUDA);
        ops::router_forward(idx, w, probs, logits.to(Device::kCUDA), score);
        Tensor idx_want = host({c.n, c.k}, DType::kI32), w_want = host({c.n, c.k});
        Tensor probs_want = host({c.n, c.e});
        ops::router_forward(idx_want, w_want, probs_want, logits, score);
        EXPECT_EQ(ints(idx), ints(idx_want)) << what;
        expect_close(w.to(Device::kCPU), w_want, tolerance_for(kF32), what + " topk_w");
        expect_close(probs.to(Device::kCPU), probs_want, tolerance_for(kF32), what + " probs");
      }
    }
  }
}

// The switch loss coeff E sum_e f_e P_e as RouterLoss weighs it.
ops::RouterLoss switch_loss(double coeff, int64_t e, int64_t k, int64_t n) {
  ops::RouterLoss l;
  l.balance = coeff * double(e) / (double(k) * double(n) * double(n));
  return l;
}

TEST(CudaRouter, CountsAndAuxLoss) {
  for (const RouterCase& c : kRouterCases) {
    const std::string what = "router n " + std::to_string(c.n) + " E " + std::to_string(c.e);
    Tensor logits = random_host({c.n, c.e}, 33, 3.0);
    Tensor idx = host({c.n, c.k}, DType::kI32), w = host({c.n, c.k}), probs = host({c.n, c.e});
    ops::router_forward(idx, w, probs, logits);
    Tensor counts = Tensor::empty({c.e}, DType::kI32, MemCategory::kOther, "c", Device::kCUDA);
    ops::router_counts(counts, idx.to(Device::kCUDA));
    Tensor counts_want = host({c.e}, DType::kI32);
    ops::router_counts(counts_want, idx);
    EXPECT_EQ(ints(counts), ints(counts_want)) << what;
    Tensor aux = host({1, c.e});
    ops::router_aux_counts(aux, probs, c.k);
    const ops::RouterLoss loss = switch_loss(0.01, c.e, c.k, std::max<int64_t>(c.n, 1));
    const double got =
        ops::router_loss(probs.to(Device::kCUDA), aux.to(Device::kCUDA), Tensor(), loss);
    const double want = ops::router_loss(probs, aux, Tensor(), loss);
    // Column sums in double in another order.
    EXPECT_NEAR(got, want, 1e-12 * std::fabs(want)) << what;
  }
  // Many rows: the column sums span several chunks.
  const int64_t n = 20000, e = 8;
  Tensor probs = random_host({n, e}, 34);
  Tensor counts = host({1, e});
  for (int64_t x = 0; x < e; ++x) counts.data<float>()[x] = static_cast<float>(1000 * x + 7);
  const ops::RouterLoss loss = switch_loss(0.01, e, 2, n);
  const double got =
      ops::router_loss(probs.to(Device::kCUDA), counts.to(Device::kCUDA), Tensor(), loss);
  EXPECT_NEAR(got, ops::router_loss(probs, counts, Tensor(), loss), 1e-12 * std::fabs(got));
  // Started, then its inputs overwritten on the stream: the value is the one started from,
  // the same for every copy of the pending value, and the same bits as asked for at once.
  const Tensor d_probs = probs.to(Device::kCUDA), d_counts = counts.to(Device::kCUDA);
  ops::PendingScalar pending = ops::router_loss_start(d_probs, d_counts, Tensor(), loss);
  ops::PendingScalar copy = pending;
  d_probs.zero_();
  d_counts.zero_();
  EXPECT_EQ(pending.get(), got);
  EXPECT_EQ(copy.get(), got);
  EXPECT_EQ(pending.get(), got);
}

// HostRead of a device tensor: the values when the read was started, though the stream
// overwrites the tensor right after (Note [Reads to the host ahead of use]).
TEST(CudaHostRead, ReadsTheValuesAsStarted) {
  Tensor want = host({300}, DType::kI32);
  for (int64_t i = 0; i < 300; ++i) want.data<int32_t>()[i] = static_cast<int32_t>(i * 7 - 50);
  const Tensor d = want.to(Device::kCUDA);
  std::vector<HostRead> reads;
  for (int r = 0; r < 20; ++r) reads.emplace_back(d);  // more than one pinned slot
  d.zero_();
  HostRead after(d);
  for (HostRead& r : reads) EXPECT_EQ(r.take(), ints(want));
  EXPECT_EQ(after.take(), std::vector<int32_t>(300, 0));
  // A read dropped untaken gives its slot back; the next reads still see their own values.
  { HostRead dropped(d); }
  EXPECT_EQ(HostRead(d).take(), std::vector<int32_t>(300, 0));
}

TEST(CudaRouter, BackwardSelectedAndAuxTerms) {
  for (const RouterCase& c : kRouterCases) {
    // aux_only: dtopk_w = 0 and a large aux_scale, so the (otherwise ~1e-5) aux term is checked
    // at full weight against the tolerance.
    for (bool aux_only : {false, true}) {
      for (DType dt : {kF32, kBF16}) {
        for (ops::RouterScore score : kScores) {
          const std::string what = "router_backward n " + std::to_string(c.n) + " E " +
                                   std::to_string(c.e) + " k " + std::to_string(c.k) + " " +
                                   name(dt) + (aux_only ? " aux only" : "") + name(score);
          Tensor logits = random_host({c.n, c.e}, 36, 3.0);
          Tensor idx = host({c.n, c.k}, DType::kI32), w = host({c.n, c.k});
          Tensor probs = host({c.n, c.e}), counts = host({1, c.e});
          ops::router_forward(idx, w, probs, logits, score);
          ops::router_aux_counts(counts, probs, c.k);
          Tensor dw = aux_only ? host({c.n, c.k}) : random_host({c.n, c.k}, 37);
          const double aux_scale = aux_only ? 1000.0 * double(c.n) : 0.5;
          const ops::RouterLoss loss = switch_loss(0.01, c.e, c.k, std::max<int64_t>(c.n, 1));
          Tensor dl = Tensor::empty({c.n, c.e}, dt, MemCategory::kOther, "dl", Device::kCUDA);
          ops::router_backward(dl, dw.to(Device::kCUDA), idx.to(Device::kCUDA), w.to(Device::kCUDA),
                               probs.to(Device::kCUDA), counts.to(Device::kCUDA), Tensor(), score,
                               loss, aux_scale);
          Tensor dl_want = host({c.n, c.e});
          ops::router_backward(dl_want, dw, idx, w, probs, counts, Tensor(), score, loss,
                               aux_scale);
          expect_close(to_host_f32(dl), dl_want, tolerance_for(dt), what);
        }
      }
    }
  }
}

// DeepSeek-V3's sigmoid router against the CPU's: the same choice (with an expert bias, with
// groups: 8 groups of 4 of 32 experts, 3 kept; 256 experts, 8 groups, 4 kept, k 8, as V3; 64
// groups of 2, the most the GPU takes; 64 experts top-6 without groups over rows of several
// blocks, as shape (d)), the weights normalised and not, scaled; the backward in f32 and bf16;
// the load tally.
TEST(CudaRouter, SigmoidWithBiasGroupsAndScaling) {
  struct Case {
    int64_t n, e, k, groups, group_topk;
  };
  for (const Case& c : {Case{37, 32, 4, 8, 3}, Case{19, 256, 8, 8, 4}, Case{23, 128, 6, 64, 10},
                        Case{300, 64, 6, 0, 0}, Case{5, 7, 2, 0, 0}, Case{0, 8, 2, 2, 1}}) {
    for (ops::RouterScore score :
         {ops::RouterScore::kSigmoid, ops::RouterScore::kSigmoidNormalized}) {
      ops::RouterSpec spec(score);
      spec.groups = c.groups;
      spec.group_topk = c.group_topk;
      spec.scaling = 2.5;
      const std::string what = "sigmoid router n " + std::to_string(c.n) + " E " +
                               std::to_string(c.e) + " k " + std::to_string(c.k) + " groups " +
                               std::to_string(c.groups) +
                               (score == ops::RouterScore::kSigmoid ? " unnormalised" : "");
      Tensor logits = random_host({c.n, c.e}, 38, 3.0);
      Tensor bias = random_host({c.e}, 39, 0.2);
      Tensor idx = Tensor::empty({c.n, c.k}, DType::kI32, MemCategory::kOther, "i", Device::kCUDA);
      Tensor w = Tensor::empty({c.n, c.k}, kF32, MemCategory::kOther, "w", Device::kCUDA);
      Tensor probs = Tensor::empty({c.n, c.e}, kF32, MemCategory::kOther, "p", Device::kCUDA);
      ops::router_forward(idx, w, probs, logits.to(Device::kCUDA), spec, bias.to(Device::kCUDA));
      Tensor idx_want = host({c.n, c.k}, DType::kI32), w_want = host({c.n, c.k});
      Tensor probs_want = host({c.n, c.e});
      ops::router_forward(idx_want, w_want, probs_want, logits, spec, bias);
      EXPECT_EQ(ints(idx), ints(idx_want)) << what;
      expect_close(w.to(Device::kCPU), w_want, tolerance_for(kF32), what + " topk_w");
      expect_close(probs.to(Device::kCPU), probs_want, tolerance_for(kF32), what + " probs");
      Tensor counts = host({c.e}, DType::kI32);
      ops::router_counts(counts, idx_want);
      Tensor dw = random_host({c.n, c.k}, 40);
      for (DType dt : {kF32, kBF16}) {
        Tensor dl = Tensor::empty({c.n, c.e}, dt, MemCategory::kOther, "dl", Device::kCUDA);
        ops::router_backward(dl, dw.to(Device::kCUDA), idx_want.to(Device::kCUDA),
                             w_want.to(Device::kCUDA), probs_want.to(Device::kCUDA), Tensor(),
                             Tensor(), spec, ops::RouterLoss(), 1.0);
        Tensor dl_want = host({c.n, c.e});
        ops::router_backward(dl_want, dw, idx_want, w_want, probs_want, Tensor(), Tensor(), spec,
                             ops::RouterLoss(), 1.0);
        expect_close(to_host_f32(dl), dl_want, tolerance_for(dt), what + " backward " + name(dt));
      }
      Tensor load = host({c.e});
      ops::router_load_add(load, counts);
      const Tensor d_load = load.to(Device::kCUDA);
      ops::router_load_add(d_load, counts.to(Device::kCUDA));
      ops::router_load_add(load, counts);
      expect_close(d_load.to(Device::kCPU), load, kExact, what + " load");
    }
  }
}

}  // namespace
}  // namespace tandem::testing_gpu
