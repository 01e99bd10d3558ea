// CUDA routers (ops.h): top-k of the softmax router with the routing weights of RouterScore and
// the switch aux loss; DeepSeek-V3's sigmoid router with its expert bias, groups and scaling;
// the per-expert counts and load. Every reduction runs in a fixed order (no float atomics), so
// every result is bitwise reproducible run to run on one GPU. Index tensors that our own ops
// produce (topk_idx) are trusted rather than checked on the host: an entry out of range is
// skipped, never read or written out of bounds.
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe_rows.cuh"
#include "ops/cuda/scratch.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxTopK = 32;          // one lane per selected expert
constexpr int kMaxExperts = 64 * 32;  // a 64-bit mask of taken experts per lane

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Whether candidate (v, i) beats (bv, bi): higher logit, ties (and unordered NaN) to the lower
// index; i < 0 is "no candidate".
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0 || v > bv) return true;
  if (v < bv) return false;
  return i < bi;
}

// The warp's best (v, i) under `beats`, lane 0's in every lane (the same unless NaNs make the
// order partial).
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (beats(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  bv = __shfl_sync(0xffffffffu, bv, 0);
  bi = __shfl_sync(0xffffffffu, bi, 0);
}

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
  const int rounds = (e + 31) / 32;  // lane holds experts lane + 32 m
  float mx = -INFINITY;
  for (int c = lane; c < e; c += 32) mx = fmaxf(mx, lr[c]);
  mx = warp_max(mx);
  float sum = 0;
  for (int c = lane; c < e; c += 32) sum += expf(lr[c] - mx);
  sum = warp_sum(sum);
  for (int c = lane; c < e; c += 32) probs[row * e + c] = expf(lr[c] - mx) / sum;

  uint64_t taken = 0;  // bit m: expert lane + 32 m already picked
  float pick_v = -INFINITY;
  int pick_i = 0;
  for (int j = 0; j < k; ++j) {
    float bv = 0;
    int bi = -1;
    for (int m = 0; m < rounds; ++m) {
      const int c = lane + 32 * m;
      if (c < e && !((taken >> m) & 1u) && beats(lr[c], c, bv, bi)) bv = lr[c], bi = c;
    }
    warp_best(bv, bi);
    if ((bi & 31) == lane) taken |= uint64_t{1} << (bi >> 5);
    if (lane == j) pick_v = bv, pick_i = bi;
  }
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
// the group_topk best groups are kept and the other experts read as 0; the top k of that; the
// weights are p at the chosen, divided by their sum + 1e-20 when `normalize`, times scaling.
// Lane l holds experts l + 32 m and groups l + 32 m (each group's two best found by its lane in
// the CPU's order); each pick is a warp arg-max under `beats` (a total order without NaNs, so the
// serial scan's winner), lane j keeps pick j, and the sum of the picked p is added in pick order
// as the CPU does. kMaxSigmoidGroups groups at most (a 64-bit mask).
constexpr int kMaxSigmoidGroups = 64;

__device__ __forceinline__ float sigmoid_choice(const float* p, const float* bias, uint64_t kept,
                                                int size, int c) {
  if (!((kept >> (c / size)) & 1u)) return 0.0f;
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

// Its backward, one warp per row: ds_j = scaling (dw_j / S - sum_i dw_i p_i / S^2) (scaling
// dw_j when not normalised) at the chosen experts, dlogit = ds p (1 - p); 0 elsewhere. S and the
// dot are summed in pick order (lane 0's serial loop, as the CPU's); lane j writes pick j after
// the row's zeros.
template <typename TD>
__global__ void __launch_bounds__(kThreads)
    sigmoid_router_backward_kernel(TD* dlogits, const float* dtopk_w, const int32_t* topk_idx,
                                   const float* probs, int64_t n, int e, int k, float scaling,
                                   bool normalize) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  TD* dl = dlogits + row * e;
  const float* p = probs + row * e;
  const int32_t* idx = topk_idx + row * k;
  const float* dw = dtopk_w + row * k;
  for (int c = lane; c < e; c += 32) dl[c] = static_cast<TD>(0.0f);
  float sum = 1e-20f, dot = 0;
  for (int j = 0; j < k; ++j) {
    if (idx[j] < 0 || idx[j] >= e) continue;
    sum += p[idx[j]];
    dot += dw[j] * p[idx[j]];
  }
  __syncwarp();  // the zeros before the picks' values
  if (lane < k && idx[lane] >= 0 && idx[lane] < e) {
    const float pj = p[idx[lane]];
    const float ds =
        normalize ? scaling * (dw[lane] / sum - dot / (sum * sum)) : scaling * dw[lane];
    dl[idx[lane]] = static_cast<TD>(ds * pj * (1.0f - pj));
  }
}

__global__ void __launch_bounds__(kThreads)
    load_add_kernel(float* load, const int32_t* counts, int64_t e) {
  const int64_t c = global_thread();
  if (c < e) load[c] += static_cast<float>(counts[c]);
}

// partial[chunk, c] = sum of probs[r, c] over the chunk's rows, in double. Block (32, 8): 32
// columns, 8 strided row slices combined in a fixed order.
__global__ void __launch_bounds__(kThreads)
    column_sums_kernel(double* partial, const float* probs, int64_t n, int e, int64_t chunk_rows) {
  __shared__ double slice[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * chunk_rows;
  const int64_t r1 = std::min(n, r0 + chunk_rows);
  double s = 0;
  if (c < e) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += probs[r * e + c];
  }
  slice[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < e) {
    double total = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) total += slice[y][threadIdx.x];
    partial[int64_t{blockIdx.y} * e + c] = total;
  }
}

// One warp per row: dl[x] = aux_scale p_x (c_x - sum_x' p_x' c_x') with c_x = cscale counts[x],
// then the routing weights' term added in f32 (lane j holds pick j), in the CPU's order:
// dl[idx_j] += w_j (dw_j - sum_i w_i dw_i); of_all (w_j = p[idx_j]): dl[x] += -p_x sum_i w_i dw_i
// and dl[idx_j] += p[idx_j] dw_j.
template <typename TD>
__global__ void __launch_bounds__(kThreads)
    router_backward_kernel(TD* dlogits, const float* dtopk_w, const int32_t* topk_idx,
                           const float* topk_w, const float* probs, const int32_t* counts,
                           int64_t n, int e, int k, double cscale, double aux_scale, bool of_all) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* p = probs + row * e;
  const bool picks = lane < k;
  const double w = picks ? topk_w[row * k + lane] : 0.0;
  const double dw = picks ? dtopk_w[row * k + lane] : 0.0;
  const int32_t idx = picks ? topk_idx[row * k + lane] : -1;
  const double dot = warp_sum(w * dw);
  const float sel = static_cast<float>(of_all ? w * dw : w * (dw - dot));
  double pc = 0;
  for (int c = lane; c < e; c += 32) pc += static_cast<double>(p[c]) * (cscale * counts[c]);
  pc = warp_sum(pc);
  const int rounds = (e + 31) / 32;
  for (int m = 0; m < rounds; ++m) {
    const int c = lane + 32 * m;
    const bool live = c < e;
    float d = live ? static_cast<float>(aux_scale * p[c] * (cscale * counts[c] - pc)) : 0.0f;
    if (of_all && live) d += static_cast<float>(-static_cast<double>(p[c]) * dot);
    for (int j = 0; j < k; ++j) {
      const int32_t ij = __shfl_sync(0xffffffffu, idx, j);
      const float sj = __shfl_sync(0xffffffffu, sel, j);
      if (ij == c) d += sj;
    }
    if (live) store1(dlogits + row * e + c, d);
  }
}

}  // namespace

// The softmax router takes no groups, scaling or bias (as the CPU's).
static void expect_softmax_router(const char* op, const RouterSpec& spec, const Tensor& bias) {
  TANDEM_CHECK(spec.groups == 0 && spec.scaling == 1.0 && !bias.defined(), op,
               ": groups, a scaling of the weights and an expert bias need sigmoid scores");
}

PendingScalar router_seq_aux_loss_start(const Tensor& probs, const Tensor&, int64_t seq,
                                        double coeff) {
  if (coeff == 0) return PendingScalar(0.0);
  TANDEM_CHECK(false,
               "router_seq_aux_loss: the sequence-wise aux loss "
               "(--moe-router-load-balancing-type seq_aux_loss) is not implemented on the GPU (",
               probs.numel(), " scores, sequences of ", seq, ", coeff ", coeff, ")");
  return PendingScalar(0.0);
}

void router_load_add(const Tensor& load, const Tensor& counts) {
  const char* op = "router_load_add";
  expect_cuda_rank(op, "counts", counts, {DType::kI32}, 1);
  expect_cuda(op, "load", load, {DType::kF32}, counts.shape());
  const int64_t e = counts.numel();
  if (e == 0) return;
  load_add_kernel<<<static_cast<unsigned>((e + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
      load.data<float>(), counts.data<int32_t>(), e);
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

// The chunks' column sums added up in a fixed order and weighted by the counts: thread c of
// one block forms column c's term (its chunks added in order), and thread 0 adds the terms in
// column order: the host loop that did this before, operation for operation with no fused
// multiply-add, so the value is the same bit for bit. nk = n * k; `terms` holds e doubles.
__global__ void __launch_bounds__(kThreads)
    aux_loss_sum_kernel(double* out, double* terms, const double* partial, const int32_t* counts,
                        int64_t e, int64_t chunks, double nd, double nk) {
  for (int64_t c = threadIdx.x; c < e; c += blockDim.x) {
    double col = 0;
    for (int64_t b = 0; b < chunks; ++b) col = __dadd_rn(col, partial[b * e + c]);
    terms[c] = __dmul_rn(__ddiv_rn(static_cast<double>(counts[c]), nk), __ddiv_rn(col, nd));
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double s = 0;
  for (int64_t c = 0; c < e; ++c) s = __dadd_rn(s, terms[c]);
  *out = s;
}

// Column sums of probs in double on the GPU (fixed chunks), their weighted sum by one thread,
// and its read to the host started (Note [Reads to the host ahead of use] in core/host_read.h):
// the host waits for it only when it asks for the value.
PendingScalar router_aux_loss_start(const Tensor& probs, const Tensor& counts, int64_t k,
                                    double coeff) {
  const char* op = "router_aux_loss";
  expect_cuda_rank(op, "probs", probs, {DType::kF32}, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  expect_cuda(op, "counts", counts, {DType::kI32}, {e});
  TANDEM_CHECK(k >= 1, op, ": k is ", k, ", expected at least 1");
  TANDEM_CHECK(e <= INT_MAX, op, ": ", e, " experts is too many");
  if (n == 0 || e == 0) return PendingScalar(0.0);
  constexpr int64_t kMaxChunks = 64;
  const int64_t chunk_rows = std::max<int64_t>(256, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (n + chunk_rows - 1) / chunk_rows;
  Scratch scratch(op);
  double* partial = scratch.take<double>(chunks * e);
  double* terms = scratch.take<double>(e);
  column_sums_kernel<<<dim3(static_cast<unsigned>((e + 31) / 32), static_cast<unsigned>(chunks)),
                       dim3(32, 8), 0, stream()>>>(partial, probs.data<float>(), n,
                                                   static_cast<int>(e), chunk_rows);
  TANDEM_CUDA_CHECK_LAUNCH();
  const Tensor sum =
      Tensor::empty({1}, DType::kF64, MemCategory::kOther, "router_aux_loss.sum", Device::kCUDA);
  const double nd = static_cast<double>(n);
  aux_loss_sum_kernel<<<1, kThreads, 0, stream()>>>(sum.data<double>(), terms, partial,
                                                    counts.data<int32_t>(), e, chunks, nd,
                                                    nd * static_cast<double>(k));
  TANDEM_CUDA_CHECK_LAUNCH();
  return PendingScalar(HostRead(sum), coeff * static_cast<double>(e));
}

void router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                     const Tensor& topk_w, const Tensor& probs, const Tensor& counts, int64_t k,
                     double coeff, double aux_scale, const RouterSpec& spec) {
  const char* op = "router_backward";
  const RouterScore score = spec.score;
  if (!spec.sigmoid()) expect_softmax_router(op, spec, Tensor());
  TANDEM_CHECK(!spec.sigmoid() || coeff == 0, op, ": the aux loss (coeff ", coeff,
               ") needs softmax scores");
  expect_cuda_rank(op, "probs", probs, {DType::kF32}, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  TANDEM_CHECK(k <= kMaxTopK && e <= INT_MAX, op, ": k = ", k, " over ", e,
               " experts; the GPU router takes k <= ", kMaxTopK);
  expect_cuda(op, "dlogits", dlogits, {DType::kF32, DType::kBF16}, {n, e});
  expect_cuda(op, "dtopk_w", dtopk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "topk_w", topk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "topk_idx", topk_idx, {DType::kI32}, {n, k});
  expect_cuda(op, "counts", counts, {DType::kI32}, {e});
  if (n == 0) return;
  if (spec.sigmoid()) {
    auto launch = [&](auto* pd) {
      sigmoid_router_backward_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
          pd, dtopk_w.data<float>(), topk_idx.data<int32_t>(), probs.data<float>(), n,
          static_cast<int>(e), static_cast<int>(k), static_cast<float>(spec.scaling),
          score == RouterScore::kSigmoidNormalized);
      TANDEM_CUDA_CHECK_LAUNCH();
    };
    if (dlogits.dtype() == DType::kBF16)
      launch(static_cast<bf16*>(dlogits.raw_data()));
    else
      launch(dlogits.data<float>());
    return;
  }
  const double nd = static_cast<double>(n);
  const double cscale = coeff * static_cast<double>(e) / (nd * static_cast<double>(k)) / nd;
  auto launch = [&](auto* pd) {
    router_backward_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
        pd, dtopk_w.data<float>(), topk_idx.data<int32_t>(), topk_w.data<float>(),
        probs.data<float>(), counts.data<int32_t>(), n, static_cast<int>(e), static_cast<int>(k),
        cscale, aux_scale, score == RouterScore::kSoftmaxOfAll);
    TANDEM_CUDA_CHECK_LAUNCH();
  };
  if (dlogits.dtype() == DType::kBF16)
    launch(static_cast<bf16*>(dlogits.raw_data()));
  else
    launch(dlogits.data<float>());
}

}  // namespace tandem::ops::cuda
