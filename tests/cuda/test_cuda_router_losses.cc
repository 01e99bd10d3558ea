// The CUDA router's losses and the expert capacity against the CPU reference (ops::cpu through
// ops.h): the load-balancing loss's counts per group, the losses' value (every load-balancing
// granularity, the normalised sigmoid scores, the z-loss), their backward on both routers,
// global_aux_loss's running mean, forced balancing's random logits; the permutation with a
// capacity (both policies, padded or not, by place) exactly the CPU's, and the permute and
// combine over its dropped and padding rows. Exact equality for integer outputs; gpu_test.h's
// tolerance per output dtype for float ones; the losses' double sums to 1e-9 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.h"

namespace tandem::testing_gpu {
namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kBF16 = DType::kBF16;
constexpr Tolerance kExact{0, 0};

Tensor gpu_empty(const Shape& shape, DType dt = kF32) {
  return Tensor::empty(shape, dt, MemCategory::kOther, "t", Device::kCUDA);
}

struct LossCase {
  int64_t n, e, k, groups;
};
// E below, at and above a warp; groups of one sequence and several; many rows (several chunks).
constexpr LossCase kLossCases[] = {{37, 8, 2, 1}, {100, 64, 4, 4},  {20, 37, 3, 5},  {5, 100, 1, 1},
                                   {12, 3, 3, 3}, {20000, 8, 2, 1}, {4096, 64, 6, 8}};

// Router state of a random case on the host: probs of the router `spec` says.
struct Routed {
  Tensor logits, idx, w, probs;
};
Routed routed(const LossCase& c, const ops::RouterSpec& spec, uint64_t seed) {
  Routed r{random_host({c.n, c.e}, seed, 3.0), host({c.n, c.k}, DType::kI32), host({c.n, c.k}),
           host({c.n, c.e})};
  ops::router_forward(r.idx, r.w, r.probs, r.logits, spec);
  return r;
}

ops::RouterLoss loss_of(const LossCase& c, bool sigmoid, bool balance, bool z) {
  ops::RouterLoss l;
  l.normalized = sigmoid;
  const double t = double(c.n / c.groups);
  if (balance) l.balance = 0.01 * double(c.e) / (double(c.k) * t * t) / double(c.groups);
  if (z) l.z = 0.001 / double(c.n);
  return l;
}

const ops::RouterScore kRouters[] = {ops::RouterScore::kSoftmaxOfSelected,
                                     ops::RouterScore::kSigmoidNormalized};

TEST(CudaRouterLoss, CountsValueAndBackwardMatchTheCpu) {
  for (const LossCase& c : kLossCases) {
    for (const ops::RouterScore score : kRouters) {
      const ops::RouterSpec spec(score);
      const Routed r = routed(c, spec, 60);
      const std::string base = "n " + std::to_string(c.n) + " E " + std::to_string(c.e) + " k " +
                               std::to_string(c.k) + " G " + std::to_string(c.groups) +
                               (spec.sigmoid() ? " sigmoid" : " softmax");
      Tensor counts = gpu_empty({c.groups, c.e}), counts_want = host({c.groups, c.e});
      ops::router_aux_counts(counts, r.probs.to(Device::kCUDA), c.k);
      ops::router_aux_counts(counts_want, r.probs, c.k);
      expect_close(counts.to(Device::kCPU), counts_want, kExact, base + " counts");
      for (const auto& [balance, z] : {std::pair{true, false}, {false, true}, {true, true}}) {
        const std::string what = base + (balance ? " balance" : "") + (z ? " z" : "");
        const ops::RouterLoss loss = loss_of(c, spec.sigmoid(), balance, z);
        const double got =
            ops::router_loss(r.probs.to(Device::kCUDA), counts, r.logits.to(Device::kCUDA), loss);
        const double want = ops::router_loss(r.probs, counts_want, r.logits, loss);
        EXPECT_NEAR(got, want, 1e-9 * std::fabs(want)) << what;
        const Tensor dw = random_host({c.n, c.k}, 61);
        for (const DType dt : {kF32, kBF16}) {
          Tensor dl = gpu_empty({c.n, c.e}, dt);
          ops::router_backward(dl, dw.to(Device::kCUDA), r.idx.to(Device::kCUDA),
                               r.w.to(Device::kCUDA), r.probs.to(Device::kCUDA), counts,
                               r.logits.to(Device::kCUDA), spec, loss, 1000.0);
          Tensor dl_want = host({c.n, c.e});
          ops::router_backward(dl_want, dw, r.idx, r.w, r.probs, counts_want, r.logits, spec, loss,
                               1000.0);
          expect_close(to_host_f32(dl), dl_want, tolerance_for(dt), what + " backward " + name(dt));
        }
      }
    }
  }
}

TEST(CudaRouterLoss, RunningMeanAndRandomLogitsMatchTheCpu) {
  const int64_t e = 40;
  Tensor total = host({e + 1}, DType::kF64);
  const Tensor d_total = total.to(Device::kCUDA);
  for (int step = 0; step < 3; ++step) {
    Tensor counts = host({1, e});
    for (int64_t x = 0; x < e; ++x) counts.data<float>()[x] = float((x * 7 + step * 3) % 11);
    const Tensor d_counts = counts.to(Device::kCUDA);
    ops::router_aux_running_mean(counts, total);
    ops::router_aux_running_mean(d_counts, d_total);
    expect_close(d_counts.to(Device::kCPU), counts, kExact, "running mean");
  }
  EXPECT_EQ(d_total.to(Device::kCPU).data<double>()[e], 3.0);
  Tensor logits = host({300, 64});
  Tensor d_logits = gpu_empty({300, 64});
  ops::router_random_logits(logits, 1234, 17);
  ops::router_random_logits(d_logits, 1234, 17);
  // The GPU's log and cos may differ from the host's in the last bit of the double.
  expect_close(d_logits.to(Device::kCPU), logits, Tolerance{1e-6, 1e-6}, "random logits");
}

// ---- expert capacity ----

struct CapacityCase {
  int64_t batch, seq, k, e, capacity;
};
constexpr CapacityCase kCapacityCases[] = {
    {2, 50, 2, 8, 20}, {4, 64, 6, 64, 30}, {1, 37, 3, 37, 2}, {3, 10, 1, 4, 12}, {2, 8, 2, 4, 100}};

TEST(CudaCapacity, PermutationIsTheCpusExactly) {
  for (const CapacityCase& c : kCapacityCases) {
    for (const bool position : {false, true}) {
      for (const bool pad : {false, true}) {
        for (const bool placed : {false, true}) {
          const int64_t n = c.batch * c.seq;
          const std::string what = "capacity n " + std::to_string(n) + " k " + std::to_string(c.k) +
                                   " E " + std::to_string(c.e) + " C " +
                                   std::to_string(c.capacity) +
                                   (position ? " position" : " probs") + (pad ? " padded" : "") +
                                   (placed ? " by place" : "");
          Tensor logits = random_host({n, c.e}, 70, 3.0);
          Tensor idx = host({n, c.k}, DType::kI32), w = host({n, c.k}), probs = host({n, c.e});
          ops::router_forward(idx, w, probs, logits);
          std::vector<int32_t> places(static_cast<size_t>(c.e));
          std::iota(places.begin(), places.end(), 0);
          std::shuffle(places.begin(), places.end(), std::mt19937(static_cast<unsigned>(c.e)));
          Tensor slot = host({c.e}, DType::kI32);
          std::copy(places.begin(), places.end(), slot.data<int32_t>());
          ops::MoeCapacity cap;
          cap.capacity = c.capacity;
          cap.policy = position ? ops::TokenDropPolicy::kPosition : ops::TokenDropPolicy::kProbs;
          cap.pad = pad;
          cap.seq = c.seq;
          const int64_t rows = pad ? c.capacity * c.e : n * c.k;
          Tensor perm = gpu_empty({rows}, DType::kI32), counts = gpu_empty({c.e}, DType::kI32);
          ops::moe_permutation(perm, counts, idx.to(Device::kCUDA), w.to(Device::kCUDA), c.e,
                               placed ? slot.to(Device::kCUDA) : Tensor(), cap);
          Tensor perm_want = host({rows}, DType::kI32), counts_want = host({c.e}, DType::kI32);
          ops::moe_permutation(perm_want, counts_want, idx, w, c.e, placed ? slot : Tensor(), cap);
          EXPECT_EQ(ints(perm), ints(perm_want)) << what;
          EXPECT_EQ(ints(counts), ints(counts_want)) << what;
        }
      }
    }
  }
}

// permute and combine over a capacity's rows: -1 rows (padding, or dropped at the end) give zero
// rows and no gradient; a dropped slot's weight gets a gradient of 0.
TEST(CudaCapacity, PermuteAndCombineOverDroppedAndPaddingRows) {
  for (const bool pad : {false, true}) {
    const CapacityCase c{2, 40, 2, 8, 7};
    const int64_t n = c.batch * c.seq, h = 64;
    const std::string what = pad ? "padded" : "dropped";
    Tensor logits = random_host({n, c.e}, 71, 3.0);
    Tensor idx = host({n, c.k}, DType::kI32), w = host({n, c.k}), probs = host({n, c.e});
    ops::router_forward(idx, w, probs, logits);
    ops::MoeCapacity cap{c.capacity, ops::TokenDropPolicy::kProbs, pad, c.seq};
    const int64_t rows = pad ? c.capacity * c.e : n * c.k;
    Tensor perm = host({rows}, DType::kI32), counts = host({c.e}, DType::kI32);
    ops::moe_permutation(perm, counts, idx, w, c.e, Tensor(), cap);
    int64_t kept = 0, slots = 0;  // rows sent (padding included), and the slots among them
    for (const int32_t x : ints(counts)) kept += x;
    for (const int32_t s : ints(perm)) slots += s >= 0;
    ASSERT_LT(slots, n * c.k) << what << ": nothing dropped";
    const Tensor d_perm = perm.to(Device::kCUDA);
    Tensor x = rounded(random_host({n, h}, 72), kBF16);
    Tensor out = gpu_empty({rows, h}, kBF16), out_want = host({rows, h});
    ops::permute_forward(out, to_gpu(x, kBF16), d_perm, c.k);
    ops::permute_forward(out_want, x, perm, c.k);
    expect_close(to_host_f32(out), out_want, tolerance_for(kBF16), what + " permute_forward");
    // The experts' rows: the kept prefix (the tail past it holds no slot).
    Tensor y = rounded(random_host({kept, h}, 73), kBF16), dout = random_host({n, h}, 74);
    Tensor comb = to_gpu(host({n, h}), kBF16), comb_want = host({n, h});
    ops::combine_forward(comb, to_gpu(y, kBF16), d_perm, w.to(Device::kCUDA));
    ops::combine_forward(comb_want, y, perm, w);
    expect_close(to_host_f32(comb), comb_want, tolerance_for(kBF16), what + " combine_forward");
    Tensor dy = gpu_empty({kept, h}, kBF16), dw = gpu_empty({n, c.k});
    ops::combine_backward(dy, dw, to_gpu(rounded(dout, kBF16), kBF16), to_gpu(y, kBF16), d_perm,
                          w.to(Device::kCUDA));
    Tensor dy_want = host({kept, h}), dw_want = host({n, c.k});
    ops::combine_backward(dy_want, dw_want, rounded(dout, kBF16), y, perm, w);
    expect_close(to_host_f32(dy), dy_want, tolerance_for(kBF16), what + " dy");
    expect_close(dw.to(Device::kCPU), dw_want, tolerance_for(kF32), what + " dtopk_w");
    Tensor dx = gpu_empty({n, h}, kBF16), dx_want = host({n, h});
    ops::permute_backward(dx, to_gpu(y, kBF16), d_perm, c.k);
    ops::permute_backward(dx_want, y, perm, c.k);
    expect_close(to_host_f32(dx), dx_want, tolerance_for(kBF16), what + " permute_backward");
  }
}

}  // namespace
}  // namespace tandem::testing_gpu
