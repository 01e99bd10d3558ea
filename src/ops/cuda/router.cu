// CUDA routers (ops.h): top-k of the softmax router with the routing weights of RouterScore;
// DeepSeek-V3's sigmoid router with its expert bias, groups and scaling; the random logits of
// --moe-router-force-load-balancing; the per-expert counts and load. The router's losses are in
// router_loss.cu. Every reduction runs in a fixed order (no float atomics), so every result is
// bitwise reproducible run to run on one GPU. Index tensors that our own ops produce (topk_idx)
// are trusted rather than checked on the host: an entry out of range is skipped, never read or
// written out of bounds.
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "core/rng.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe_rows.cuh"
#include "ops/cuda/router_rows.cuh"

namespace tandem::ops::cuda {

namespace {

// One warp per row: probs = softmax(logits row); the top k in descending order (a warp arg-max
// per pick; lane j keeps pick j), then their weights: their softmax (of_all false) or their
// probs (of_all, RouterScore::kSoftmaxOfAll).
__global__ void __launch_bounds__(kThreads)
    router_forward_kernel(int32_t* topk_idx, float* topk_w, float* probs, const float* logits,
                          int64_t n, int e, int k, bool of_all) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* lr = logits + row * e;
  float mx = -INFINITY;
  for (int c = lane; c < e; c += 32) mx = fmaxf(mx, lr[c]);
  mx = warp_max(mx);
  float sum = 0;
  for (int c = lane; c < e; c += 32) sum += expf(lr[c] - mx);
  sum = warp_sum(sum);
  for (int c = lane; c < e; c += 32) probs[row * e + c] = expf(lr[c] - mx) / sum;

  int pick_i;
  float pick_v;
  warp_topk(pick_i, pick_v, lr, e, k);
  const float pmax = warp_max(lane < k ? pick_v : -INFINITY);
  const float ex = lane < k ? expf(pick_v - pmax) : 0.0f;
  const float psum = warp_sum(ex);
  if (lane < k) {
    topk_idx[row * k + lane] = pick_i;
    topk_w[row * k + lane] = of_all ? expf(pick_v - mx) / sum : ex / psum;  // probs' formula
  }
}

// DeepSeek-V3's router, one warp per row (RouterSpec; the CPU's order and ties): p =
// sigmoid(logits); the choice reads p + bias, the groups' values are the sums of their two best,
// the group_topk best groups are kept and the other experts read as -inf; the top k of that; the
// weights are p at the chosen, divided by their sum + 1e-20 when `normalize`, times scaling.
// Lane l holds experts l + 32 m and groups l + 32 m (each group's two best found by its lane in
// the CPU's order); each pick is a warp arg-max under `beats` (a total order without NaNs, so the
// serial scan's winner), lane j keeps pick j, and the sum of the picked p is added in pick order
// as the CPU does. kMaxSigmoidGroups groups at most (a 64-bit mask).
constexpr int kMaxSigmoidGroups = 64;

__device__ __forceinline__ float sigmoid_choice(const float* p, const float* bias, uint64_t kept,
                                                int size, int c) {
  if (!((kept >> (c / size)) & 1u)) return -INFINITY;
  return p[c] + (bias != nullptr ? bias[c] : 0.0f);
}

__global__ void __launch_bounds__(kThreads)
    sigmoid_router_kernel(int32_t* topk_idx, float* topk_w, float* probs, const float* logits,
                          const float* bias, int64_t n, int e, int k, int groups, int group_topk,
                          float scaling, bool normalize) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* lr = logits + row * e;
  float* p = probs + row * e;
  for (int c = lane; c < e; c += 32) p[c] = 1.0f / (1.0f + expf(-lr[c]));
  __syncwarp();  // every lane reads the others' p below
  const int size = groups > 0 ? e / groups : e;
  uint64_t kept = groups > 0 ? 0 : 1;  // bit g: group g's experts may be chosen
  if (groups > 0) {
    float score[kMaxSigmoidGroups / 32];
#pragma unroll
    for (int m = 0; m < kMaxSigmoidGroups / 32; ++m) {
      const int g = lane + 32 * m;
      float best = -INFINITY, second = -INFINITY;
      for (int c = g * size; g < groups && c < (g + 1) * size; ++c) {
        const float x = p[c] + (bias != nullptr ? bias[c] : 0.0f);
        if (x > best) {
          second = best;
          best = x;
        } else if (x > second) {
          second = x;
        }
      }
      score[m] = best + second;
    }
    for (int pick = 0; pick < group_topk; ++pick) {
      float bv = 0;
      int bi = -1;
#pragma unroll
      for (int m = 0; m < kMaxSigmoidGroups / 32; ++m) {
        const int g = lane + 32 * m;
        if (g < groups && !((kept >> g) & 1u) && beats(score[m], g, bv, bi)) bv = score[m], bi = g;
      }
      warp_best(bv, bi);
      kept |= uint64_t{1} << bi;
    }
  }
  uint64_t taken = 0;  // bit m: expert lane + 32 m already picked
  float sum = 1e-20f;
  int pick_i = 0;
  for (int j = 0; j < k; ++j) {
    float bv = 0;
    int bi = -1;
    for (int c = lane, m = 0; c < e; c += 32, ++m) {
      if ((taken >> m) & 1u) continue;
      const float x = sigmoid_choice(p, bias, kept, size, c);
      if (beats(x, c, bv, bi)) bv = x, bi = c;
    }
    warp_best(bv, bi);
    if ((bi & 31) == lane) taken |= uint64_t{1} << (bi >> 5);
    if (lane == j) pick_i = bi;
    sum += p[bi];
  }
  if (lane < k) {
    const float pj = p[pick_i];
    topk_idx[row * k + lane] = pick_i;
    topk_w[row * k + lane] = scaling * (normalize ? pj / sum : pj);
  }
}

// load[c] += counts[slot[c]] (counts[c] without slots).
__global__ void __launch_bounds__(kThreads)
    load_add_kernel(float* load, const int32_t* counts, const int32_t* slot, int64_t e) {
  const int64_t c = global_thread();
  if (c >= e) return;
  const int64_t from = slot != nullptr ? slot[c] : c;
  if (from >= 0 && from < e) load[c] += static_cast<float>(counts[from]);
}

// logits[i] = normal01(key, first + i) of core/rng.h: the same splitmix64 draws and Box-Muller in
// double (the GPU's log and cos may differ from the host's in the last bit), rounded to f32.
__global__ void __launch_bounds__(kThreads)
    random_logits_kernel(float* logits, uint64_t key, uint64_t first, int64_t count) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const uint64_t at = first + static_cast<uint64_t>(i);
    const auto uniform = [&](uint64_t j) {
      return static_cast<double>(splitmix64(key ^ splitmix64(j)) >> 11) * 0x1.0p-53;
    };
    const double u1 = 1.0 - uniform(2 * at), u2 = uniform(2 * at + 1);
    logits[i] = static_cast<float>(::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2));
  }
}

}  // namespace

// The softmax router takes no groups, scaling or bias (as the CPU's).
static void expect_softmax_router(const char* op, const RouterSpec& spec, const Tensor& bias) {
  TANDEM_CHECK(spec.groups == 0 && spec.scaling == 1.0 && !bias.defined(), op,
               ": groups, a scaling of the weights and an expert bias need sigmoid scores");
}

void router_load_add(const Tensor& load, const Tensor& counts, const Tensor& expert_slot) {
  const char* op = "router_load_add";
  expect_cuda_rank(op, "counts", counts, {DType::kI32}, 1);
  expect_cuda(op, "load", load, {DType::kF32}, counts.shape());
  const int64_t e = counts.numel();
  if (expert_slot.defined()) expect_cuda(op, "expert_slot", expert_slot, {DType::kI32}, {e});
  if (e == 0) return;
  load_add_kernel<<<static_cast<unsigned>((e + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
      load.data<float>(), counts.data<int32_t>(),
      expert_slot.defined() ? expert_slot.data<int32_t>() : nullptr, e);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void router_random_logits(const Tensor& logits, uint64_t key, int64_t first_row) {
  const char* op = "router_random_logits";
  expect_cuda_rank(op, "logits", logits, {DType::kF32}, 2);
  TANDEM_CHECK(first_row >= 0, op, ": first_row is ", first_row, ", expected at least 0");
  const int64_t count = logits.numel();
  if (count == 0) return;
  random_logits_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(
      logits.data<float>(), key, static_cast<uint64_t>(first_row * logits.size(1)), count);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// DeepSeek-V3's router (sigmoid_router_kernel): one warp per row.
static void sigmoid_router_forward(const char* op, const Tensor& topk_idx, const Tensor& topk_w,
                                   const Tensor& probs, const Tensor& logits,
                                   const RouterSpec& spec, const Tensor& bias) {
  const int64_t n = logits.size(0), e = logits.size(1), k = topk_idx.size(1);
  if (bias.defined()) expect_cuda(op, "bias", bias, {DType::kF32}, {e});
  if (spec.groups > 0) {
    TANDEM_CHECK(e % spec.groups == 0 && e / spec.groups >= 2 && spec.group_topk >= 1 &&
                     spec.group_topk <= spec.groups && spec.groups <= kMaxSigmoidGroups &&
                     k <= spec.group_topk * (e / spec.groups),
                 op, ": groups ", spec.groups, ", group_topk ", spec.group_topk, " do not fit ", e,
                 " experts and k = ", k, " (the GPU takes at most ", kMaxSigmoidGroups, " groups)");
  }
  if (n == 0) return;
  sigmoid_router_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
      topk_idx.data<int32_t>(), topk_w.data<float>(), probs.data<float>(), logits.data<float>(),
      bias.defined() ? bias.data<float>() : nullptr, n, static_cast<int>(e), static_cast<int>(k),
      static_cast<int>(spec.groups), static_cast<int>(spec.group_topk),
      static_cast<float>(spec.scaling), spec.score == RouterScore::kSigmoidNormalized);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void router_forward(const Tensor& topk_idx, const Tensor& topk_w, const Tensor& probs,
                    const Tensor& logits, const RouterSpec& spec, const Tensor& bias) {
  const char* op = "router_forward";
  const RouterScore score = spec.score;
  if (!spec.sigmoid()) expect_softmax_router(op, spec, bias);
  expect_cuda_rank(op, "logits", logits, {DType::kF32}, 2);
  expect_cuda_rank(op, "topk_idx", topk_idx, {DType::kI32}, 2);
  const int64_t n = logits.size(0), e = logits.size(1), k = topk_idx.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  TANDEM_CHECK(k <= kMaxTopK && e <= kMaxExperts, op, ": k = ", k, " over ", e,
               " experts; the GPU router takes k <= ", kMaxTopK, " and at most ", kMaxExperts,
               " experts");
  expect_cuda(op, "topk_idx", topk_idx, {DType::kI32}, {n, k});
  expect_cuda(op, "topk_w", topk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "probs", probs, {DType::kF32}, {n, e});
  if (spec.sigmoid()) {
    sigmoid_router_forward(op, topk_idx, topk_w, probs, logits, spec, bias);
    return;
  }
  if (n == 0) return;
  router_forward_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
      topk_idx.data<int32_t>(), topk_w.data<float>(), probs.data<float>(), logits.data<float>(), n,
      static_cast<int>(e), static_cast<int>(k), score == RouterScore::kSoftmaxOfAll);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// An expert id outside [0, E) is not counted (topk_idx comes from router_forward; see the top).
void router_counts(const Tensor& counts, const Tensor& topk_idx) {
  const char* op = "router_counts";
  expect_cuda_rank(op, "counts", counts, {DType::kI32}, 1);
  expect_cuda_rank(op, "topk_idx", topk_idx, {DType::kI32}, 2);
  const int64_t e = counts.size(0);
  TANDEM_CHECK(e <= INT_MAX, op, ": ", e, " experts is too many");
  if (e == 0) return;
  launch_counts(counts.data<int32_t>(), topk_idx.data<int32_t>(), topk_idx.numel(), e);
}

}  // namespace tandem::ops::cuda
