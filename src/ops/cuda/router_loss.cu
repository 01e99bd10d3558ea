// The CUDA router's losses (ops.h RouterLoss: Megatron-LM's load-balancing losses and z-loss):
// the counts of the top k of the scores, global_aux_loss's running mean, the losses' value and
// the router's backward with their gradients. Every float sum runs in a fixed order (the counts'
// atomic adds are of whole numbers, exact in any order), so every result is bitwise
// reproducible run to run on one GPU.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/router_rows.cuh"
#include "ops/cuda/scratch.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = kRouterThreads;

// One warp per row: counts[row / group_rows, e] += 1 for each e among the row's k largest
// probs (zeroed by the caller).
__global__ void __launch_bounds__(kThreads)
    aux_counts_kernel(float* counts, const float* probs, int64_t n, int e, int k,
                      int64_t group_rows) {
  const int64_t row = warp_row();
  if (row >= n) return;
  int idx;
  float v;
  warp_topk(idx, v, probs + row * e, e, k);
  if (idx >= 0) atomicAdd(&counts[(row / group_rows) * e + idx], 1.0f);
}

// One block: total[x] += counts[x], total[e] += 1, counts[x] = total[x] / total[e].
__global__ void __launch_bounds__(kThreads)
    running_mean_kernel(float* counts, double* total, int e) {
  const double steps = total[e] + 1;
  __syncthreads();  // every thread has read total[e] before it changes
  if (threadIdx.x == 0) total[e] = steps;
  for (int x = threadIdx.x; x < e; x += blockDim.x) {
    total[x] += counts[x];
    counts[x] = static_cast<float>(total[x] / steps);
  }
}

// One warp per row: scale[row] = 1 / (sum of the row's probs + 1e-20) (normalized) or 1, and
// lse2[row] = logsumexp(logits row)^2 (when logits is given), in double.
__global__ void __launch_bounds__(kThreads)
    loss_rows_kernel(double* scale, double* lse2, const float* probs, const float* logits,
                     int64_t n, int e, bool normalized) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  if (normalized) {
    double s = 0;
    for (int c = lane; c < e; c += 32) s += probs[row * e + c];
    s = warp_sum(s);
    if (lane == 0) scale[row] = 1.0 / (s + 1e-20);
  } else if (lane == 0) {
    scale[row] = 1.0;
  }
  if (logits == nullptr) return;
  const float* l = logits + row * e;
  float mx = -INFINITY;
  for (int c = lane; c < e; c += 32) mx = fmaxf(mx, l[c]);
  mx = warp_max(mx);
  double s = 0;
  for (int c = lane; c < e; c += 32) s += ::exp(static_cast<double>(l[c]) - mx);
  s = warp_sum(s);
  const double lse = mx + ::log(s);
  if (lane == 0) lse2[row] = lse * lse;
}

// partial[(g * chunks + chunk) * e + c] = the sum of probs[r, c] scale[r] over the chunk's rows of
// group g (groups of group_rows rows, chunks of chunk_rows), in double. Block (32, 8): 32
// columns, 8 strided row slices added in a fixed order.
__global__ void __launch_bounds__(kThreads)
    group_sums_kernel(double* partial, const float* probs, const double* scale, int e,
                      int64_t group_rows, int64_t chunk_rows) {
  __shared__ double slice[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t g = blockIdx.z, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t r0 = g * group_rows + chunk * chunk_rows;
  const int64_t r1 = std::min((g + 1) * group_rows, r0 + chunk_rows);
  double s = 0;
  if (c < e) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += probs[r * e + c] * scale[r];
  }
  slice[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < e) {
    double total = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) total += slice[y][threadIdx.x];
    partial[(g * chunks + chunk) * e + c] = total;
  }
}

// One block: out = balance * sum_{g, c} counts[g, c] * (the chunks of partial for (g, c), in
// order) + z * sum_r lse2[r]. Each thread adds its strided terms in order, thread 0 the threads'
// sums in order.
__global__ void __launch_bounds__(kThreads)
    loss_sum_kernel(double* out, const double* partial, const float* counts, const double* lse2,
                    int64_t groups, int64_t chunks, int e, int64_t n, double balance, double z) {
  __shared__ double part[kThreads][2];
  double b = 0, zz = 0;
  for (int64_t i = threadIdx.x; balance != 0 && i < groups * e; i += blockDim.x) {
    const int64_t g = i / e, c = i % e;
    double col = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) col += partial[(g * chunks + ch) * e + c];
    b += static_cast<double>(counts[i]) * col;
  }
  for (int64_t r = threadIdx.x; z != 0 && r < n; r += blockDim.x) zz += lse2[r];
  part[threadIdx.x][0] = b;
  part[threadIdx.x][1] = zz;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double bs = 0, zs = 0;
  for (unsigned t = 0; t < blockDim.x; ++t) bs += part[t][0], zs += part[t][1];
  *out = balance * bs + z * zs;
}

// router_backward's settings for the kernel below.
struct BackwardArgs {
  double balance;      // loss_scale * RouterLoss::balance (0: no load-balancing term)
  double z2;           // 2 * loss_scale * RouterLoss::z (0: no z-loss)
  bool normalized;     // RouterLoss::normalized: the loss's scores are p / (sum p + 1e-20)
  bool sigmoid;        // sigmoid scores (else softmax)
  bool of_all;         // kSoftmaxOfAll
  bool normalize_w;    // kSigmoidNormalized
  double scaling;      // RouterSpec::scaling
  int64_t group_rows;  // rows per group of counts
};

// One warp per row, in double, the CPU's terms (router.cc's router_backward): the loss's
// gradient gq_x = balance counts[g, x] at the scores; softmax: dl_x = p_x (gq_x - sum p gq) plus
// the routing weights' terms (lane j holds pick j: w_j (dw_j - sum w dw), or for of_all p_x
// (-sum w dw) and p[idx_j] dw_j); sigmoid: ds_x = (gq_x - sum q gq) / S plus the picks' scaling
// (dw_j / S' - sum dw p / S'^2) (S' the chosen scores' sum + 1e-20; scaling dw_j unnormalised),
// dl = ds p (1 - p); the z-loss adds z2 lse softmax(l)_x.
template <typename TD>
__global__ void __launch_bounds__(kThreads)
    router_backward_kernel(TD* dlogits, const float* dtopk_w, const int32_t* topk_idx,
                           const float* topk_w, const float* probs, const float* counts,
                           const float* logits, int64_t n, int e, int k, BackwardArgs a) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* p = probs + row * e;
  const bool picks = lane < k;
  const int32_t idx = picks ? topk_idx[row * k + lane] : -1;
  const bool ok = idx >= 0 && idx < e;
  const double w = picks ? topk_w[row * k + lane] : 0.0;
  const double dw = picks ? dtopk_w[row * k + lane] : 0.0;
  double sel = 0, dot = 0;
  if (a.sigmoid) {
    double sum = 1e-20, dotp = 0;  // in pick order, as the CPU
    for (int j = 0; j < k; ++j) {
      const int32_t ij = __shfl_sync(0xffffffffu, idx, j);
      const double dwj = __shfl_sync(0xffffffffu, dw, j);
      if (ij < 0 || ij >= e) continue;
      sum += p[ij];
      dotp += dwj * p[ij];
    }
    sel = a.normalize_w ? a.scaling * (dw / sum - dotp / (sum * sum)) : a.scaling * dw;
  } else {
    dot = warp_sum(w * dw);
    sel = a.of_all ? w * dw : w * (dw - dot);
  }
  const float* cr = counts != nullptr ? counts + (row / a.group_rows) * e : nullptr;
  double scale = 1, gdot = 0;
  if (cr != nullptr) {
    if (a.normalized) {
      double s = 0;
      for (int c = lane; c < e; c += 32) s += p[c];
      scale = 1.0 / (warp_sum(s) + 1e-20);
    }
    double g = 0;
    for (int c = lane; c < e; c += 32) g += a.balance * cr[c] * p[c] * scale;
    gdot = warp_sum(g);
  }
  double lse = 0;
  const float* l = logits != nullptr ? logits + row * e : nullptr;
  if (l != nullptr) {
    float mx = -INFINITY;
    for (int c = lane; c < e; c += 32) mx = fmaxf(mx, l[c]);
    mx = warp_max(mx);
    double s = 0;
    for (int c = lane; c < e; c += 32) s += ::exp(static_cast<double>(l[c]) - mx);
    lse = mx + ::log(warp_sum(s));
  }
  const int rounds = (e + 31) / 32;
  for (int m = 0; m < rounds; ++m) {
    const int c = lane + 32 * m;
    const bool live = c < e;
    const double pc = live ? p[c] : 0.0;
    double d = 0, ds = 0;
    if (cr != nullptr && live) {
      const double gq = a.balance * cr[c];
      if (a.sigmoid) {
        ds += (gq - gdot) * scale;
      } else {
        d += pc * (gq - gdot);
      }
    }
    if (!a.sigmoid && a.of_all) d += -pc * dot;
    for (int j = 0; j < k; ++j) {
      const int32_t ij = __shfl_sync(0xffffffffu, ok ? idx : -1, j);
      const double sj = __shfl_sync(0xffffffffu, sel, j);
      if (ij != c) continue;
      if (a.sigmoid) {
        ds += sj;
      } else {
        d += sj;
      }
    }
    if (a.sigmoid) d += ds * pc * (1 - pc);
    if (l != nullptr && live) d += a.z2 * lse * ::exp(static_cast<double>(l[c]) - lse);
    if (live) store1(dlogits + row * e + c, static_cast<float>(d));
  }
}

// Checks router_loss_start's and router_backward's loss tensors against probs [n, e] f32;
// returns the groups of counts (0 without a load-balancing term).
int64_t check_router_loss(const char* op, const Tensor& probs, const Tensor& counts,
                          const Tensor& logits, const RouterLoss& loss) {
  const int64_t n = probs.size(0), e = probs.size(1);
  int64_t g = 0;
  if (loss.balance != 0) {
    expect_cuda_rank(op, "counts", counts, {DType::kF32}, 2);
    g = counts.size(0);
    expect_cuda(op, "counts", counts, {DType::kF32}, {g, e});
    TANDEM_CHECK(g >= 1 && n % g == 0, op, ": ", n, " rows do not split into ", g, " groups");
  }
  if (loss.z != 0) expect_cuda(op, "logits", logits, {DType::kF32}, {n, e});
  return g;
}

}  // namespace

void router_aux_counts(const Tensor& counts, const Tensor& probs, int64_t k) {
  const char* op = "router_aux_counts";
  expect_cuda_rank(op, "probs", probs, {DType::kF32}, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  expect_cuda_rank(op, "counts", counts, {DType::kF32}, 2);
  const int64_t g = counts.size(0);
  expect_cuda(op, "counts", counts, {DType::kF32}, {g, e});
  TANDEM_CHECK(k >= 1 && k <= e && k <= kMaxTopK && e <= kMaxExperts, op, ": k = ", k, " over ", e,
               " experts; the GPU takes 1 <= k <= ", kMaxTopK, " and at most ", kMaxExperts,
               " experts");
  TANDEM_CHECK(g >= 1 && n % g == 0, op, ": ", n, " rows do not split into ", g, " groups");
  TANDEM_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), stream()));
  if (n == 0) return;
  aux_counts_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
      counts.data<float>(), probs.data<float>(), n, static_cast<int>(e), static_cast<int>(k),
      n / g);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void router_aux_running_mean(const Tensor& counts, const Tensor& total) {
  const char* op = "router_aux_running_mean";
  expect_cuda_rank(op, "counts", counts, {DType::kF32}, 2);
  const int64_t e = counts.size(1);
  expect_cuda(op, "counts", counts, {DType::kF32}, {1, e});
  expect_cuda(op, "total", total, {DType::kF64}, {e + 1});
  TANDEM_CHECK(e <= INT_MAX, op, ": ", e, " experts is too many");
  running_mean_kernel<<<1, kThreads, 0, stream()>>>(counts.data<float>(), total.data<double>(),
                                                    static_cast<int>(e));
  TANDEM_CUDA_CHECK_LAUNCH();
}

// Per-row scales and lse^2 (loss_rows_kernel), the groups' column sums in fixed chunks
// (group_sums_kernel), their weighted sum by one block (loss_sum_kernel), and its read to the
// host started (Note [Reads to the host ahead of use] in core/host_read.h).
PendingScalar router_loss_start(const Tensor& probs, const Tensor& counts, const Tensor& logits,
                                const RouterLoss& loss) {
  const char* op = "router_loss";
  expect_cuda_rank(op, "probs", probs, {DType::kF32}, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  TANDEM_CHECK(e <= INT_MAX, op, ": ", e, " experts is too many");
  const int64_t g = check_router_loss(op, probs, counts, logits, loss);
  if (n == 0 || e == 0 || (loss.balance == 0 && loss.z == 0)) return PendingScalar(0.0);
  constexpr int64_t kMaxChunks = 64;
  const int64_t group_rows = g > 0 ? n / g : n;
  const int64_t chunk_rows = std::max<int64_t>(256, (group_rows + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (group_rows + chunk_rows - 1) / chunk_rows;
  Scratch scratch(op);
  double* scale = scratch.take<double>(n);
  double* lse2 = scratch.take<double>(n);
  double* partial = scratch.take<double>(std::max<int64_t>(g, 1) * chunks * e);
  loss_rows_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
      scale, lse2, probs.data<float>(), loss.z != 0 ? logits.data<float>() : nullptr, n,
      static_cast<int>(e), loss.normalized);
  TANDEM_CUDA_CHECK_LAUNCH();
  if (g > 0) {
    group_sums_kernel<<<dim3(static_cast<unsigned>((e + 31) / 32), static_cast<unsigned>(chunks),
                             static_cast<unsigned>(g)),
                        dim3(32, 8), 0, stream()>>>(partial, probs.data<float>(), scale,
                                                    static_cast<int>(e), group_rows, chunk_rows);
    TANDEM_CUDA_CHECK_LAUNCH();
  }
  const Tensor sum =
      Tensor::empty({1}, DType::kF64, MemCategory::kOther, "router_loss.sum", Device::kCUDA);
  loss_sum_kernel<<<1, kThreads, 0, stream()>>>(
      sum.data<double>(), partial, g > 0 ? counts.data<float>() : nullptr, lse2, g, chunks,
      static_cast<int>(e), n, loss.balance, loss.z);
  TANDEM_CUDA_CHECK_LAUNCH();
  return PendingScalar(HostRead(sum), 1.0);
}

void router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                     const Tensor& topk_w, const Tensor& probs, const Tensor& counts,
                     const Tensor& logits, const RouterSpec& spec, const RouterLoss& loss,
                     double loss_scale) {
  const char* op = "router_backward";
  expect_cuda_rank(op, "probs", probs, {DType::kF32}, 2);
  expect_cuda_rank(op, "topk_idx", topk_idx, {DType::kI32}, 2);
  const int64_t n = probs.size(0), e = probs.size(1), k = topk_idx.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  TANDEM_CHECK(k <= kMaxTopK && e <= INT_MAX, op, ": k = ", k, " over ", e,
               " experts; the GPU router takes k <= ", kMaxTopK);
  TANDEM_CHECK(spec.sigmoid() || spec.scaling == 1.0, op,
               ": a scaling of the weights needs sigmoid scores");
  expect_cuda(op, "dlogits", dlogits, {DType::kF32, DType::kBF16}, {n, e});
  expect_cuda(op, "dtopk_w", dtopk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "topk_w", topk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "topk_idx", topk_idx, {DType::kI32}, {n, k});
  const int64_t g = check_router_loss(op, probs, counts, logits, loss);
  if (n == 0) return;
  BackwardArgs a{};
  a.balance = loss_scale * loss.balance;
  a.z2 = 2 * loss_scale * loss.z;
  a.normalized = loss.normalized;
  a.sigmoid = spec.sigmoid();
  a.of_all = spec.score == RouterScore::kSoftmaxOfAll;
  a.normalize_w = spec.score == RouterScore::kSigmoidNormalized;
  a.scaling = spec.scaling;
  a.group_rows = g > 0 ? n / g : n;
  auto launch = [&](auto* pd) {
    router_backward_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
        pd, dtopk_w.data<float>(), topk_idx.data<int32_t>(), topk_w.data<float>(),
        probs.data<float>(), g > 0 ? counts.data<float>() : nullptr,
        loss.z != 0 ? logits.data<float>() : nullptr, n, static_cast<int>(e), static_cast<int>(k),
        a);
    TANDEM_CUDA_CHECK_LAUNCH();
  };
  if (dlogits.dtype() == DType::kBF16) {
    launch(static_cast<bf16*>(dlogits.raw_data()));
  } else {
    launch(dlogits.data<float>());
  }
}

}  // namespace tandem::ops::cuda
