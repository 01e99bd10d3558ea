// CUDA cross-entropy over the vocabulary: one block of threads per row reading 16 bytes at a
// time, an online (max, sum) log-sum-exp in fp32; the forward's loss is summed in double in a
// fixed order (run to run identical) and read back with one copy. logits and dlogits are f32 or
// bf16 in any mix; dlogits may alias logits (same dtype, same elements). The row helpers shared
// with lm_head.cu are in rows.cuh.
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/rows.cuh"

namespace tandem::ops::cuda {

namespace {

constexpr int kThreads = 256;  // per row

// ---- device helpers (the shared ones in rows.cuh) ----

// N values added to a MaxSum (rows.cuh) at once: their max first, then their exps in order.
template <int N>
__device__ __forceinline__ void add_values(MaxSum& a, const float (&x)[N]) {
  float mx = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i) mx = fmaxf(mx, x[i]);
  const float mn = fmaxf(a.m, mx);
  float s = a.s * __expf(a.m - mn);
#pragma unroll
  for (int i = 0; i < N; ++i) s += __expf(x[i] - mn);
  a = MaxSum{mn, s};
}

// A row of v elements split into scalars up to the first 16-byte boundary (head), whole 16-byte
// vectors (elements [head, head + vecs * N)), and scalars after them.
struct RowSplit {
  int64_t head, vecs;
};
template <typename T>
__device__ __forceinline__ RowSplit split_row(const T* row, int64_t v) {
  constexpr int64_t kN = 16 / sizeof(T);
  const int64_t off =
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) & 15) / int64_t(sizeof(T));
  const int64_t head = min(v, off == 0 ? int64_t{0} : kN - off);
  return RowSplit{head, (v - head) / kN};
}

// log(sum_j exp(row[j])) over the row, every thread of the block taking part.
template <typename T>
__device__ float row_logsumexp(const T* row, int64_t v) {
  constexpr int kN = 16 / sizeof(T);
  const RowSplit sp = split_row(row, v);
  const int64_t stride = blockDim.x;
  MaxSum acc{-FLT_MAX, 0.0f};
  for (int64_t j = threadIdx.x; j < sp.head; j += stride) add_value(acc, load1(row + j));
  const T* body = row + sp.head;
  int64_t i = threadIdx.x;
  for (; i + stride < sp.vecs; i += 2 * stride) {  // two loads in flight per thread
    float a[kN], b[kN];
    load_vec(body + i * kN, a);
    load_vec(body + (i + stride) * kN, b);
    add_values(acc, a);
    add_values(acc, b);
  }
  if (i < sp.vecs) {
    float a[kN];
    load_vec(body + i * kN, a);
    add_values(acc, a);
  }
  for (int64_t j = sp.head + sp.vecs * kN + threadIdx.x; j < v; j += stride)
    add_value(acc, load1(row + j));
  acc = block_max_sum(acc);
  return acc.m + logf(acc.s);
}

// row_loss[r] = lse(logits[r]) - logits[r, targets[r]] (0 where mask, if any, is 0); a target
// outside [0, v) gives 0 and lowers *bad_row to r.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    ce_forward_kernel(float* row_loss, unsigned* bad_row, const T* logits, int64_t v,
                      const int32_t* targets, const float* mask) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * v;
  const float lse = row_logsumexp(row, v);
  if (threadIdx.x == 0) record_row_loss(row_loss, bad_row, r, lse, row, v, targets, r, mask);
}

// dlogits[r, j] = (exp(logits[r, j] - lse) - [j == target]) * scale (0 where mask, if any, is
// 0). Each element is read and written by the same thread, after the whole row was read for the
// lse, so dlogits may alias logits. Targets were checked on the host.
template <typename Ti, typename To>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(To* dlogits, const Ti* logits, int64_t v, const int32_t* targets,
                       float scale_all, const float* mask) {
  constexpr int kN = 16 / sizeof(Ti);
  constexpr uintptr_t kOutAlign = kN * sizeof(To) < 16 ? kN * sizeof(To) : 16;
  const int64_t r = blockIdx.x;
  const Ti* row = logits + r * v;
  To* drow = dlogits + r * v;
  const float lse = row_logsumexp(row, v);
  const int64_t t = targets[r];
  const float scale = row_scale(scale_all, mask, r);
  const auto grad = [&](int64_t j, float x) { return ce_grad(x, lse, j, t, scale); };
  const RowSplit sp = split_row(row, v);
  const bool vec_out = (reinterpret_cast<uintptr_t>(drow + sp.head) % kOutAlign) == 0;
  for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x)
    store1(drow + j, grad(j, load1(row + j)));
  for (int64_t i = threadIdx.x; i < sp.vecs; i += blockDim.x) {
    const int64_t j0 = sp.head + i * kN;
    float x[kN];
    load_vec(row + j0, x);
#pragma unroll
    for (int e = 0; e < kN; ++e) x[e] = grad(j0 + e, x[e]);
    if (vec_out) {
      store_vec(drow + j0, x);
    } else {
#pragma unroll
      for (int e = 0; e < kN; ++e) store1(drow + j0 + e, x[e]);
    }
  }
  for (int64_t j = sp.head + sp.vecs * kN + threadIdx.x; j < v; j += blockDim.x)
    store1(drow + j, grad(j, load1(row + j)));
}

// ---- host side ----

// Checks logits [N, V] (f32 or bf16) and targets [N] i32; returns N. Rows go to the grid's x.
int64_t check_ce(const char* op, const Tensor& logits, const Tensor& targets) {
  expect_cuda_rank(op, "logits", logits, {DType::kF32, DType::kBF16}, 2);
  const int64_t n = logits.size(0);
  expect_cuda(op, "targets", targets, {DType::kI32}, {n});
  TANDEM_CHECK(n < (int64_t{1} << 31), op, ": ", n, " rows, at most 2^31 - 1 are supported");
  return n;
}

// cross_entropy_forward over the rows whose loss mask is 1 (undefined: every row).
double forward_rows(const char* op, const Tensor& logits, const Tensor& targets,
                    const Tensor& loss_mask) {
  const int64_t n = check_ce(op, logits, targets);
  const float* mask = loss_mask_rows(op, loss_mask, n);
  const int64_t v = logits.size(1);
  if (n == 0) return 0.0;
  const cudaStream_t s = stream();
  const RowLosses losses(n, "ce.row_loss", "ce.status", s);
  dispatch_act(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    ce_forward_kernel<T><<<static_cast<unsigned>(n), kThreads, 0, s>>>(
        losses.row_loss(), losses.bad_row(), static_cast<const T*>(logits.raw_data()), v,
        targets.data<int32_t>(), mask);
    TANDEM_CUDA_CHECK_LAUNCH();
  });
  return losses.finish(op, targets, v);
}

// cross_entropy_backward with the rows whose loss mask is 0 zero (undefined: none).
void backward_rows(const char* op, const Tensor& dlogits, const Tensor& logits,
                   const Tensor& targets, double scale, const Tensor& loss_mask) {
  const int64_t n = check_ce(op, logits, targets);
  const float* mask = loss_mask_rows(op, loss_mask, n);
  const int64_t v = logits.size(1);
  expect_cuda(op, "dlogits", dlogits, {DType::kF32, DType::kBF16}, logits.shape());
  {
    // In place is the same elements in the same dtype; any other overlap would be read after
    // it is written.
    const auto lo = reinterpret_cast<uintptr_t>(logits.raw_data());
    const auto dlo = reinterpret_cast<uintptr_t>(dlogits.raw_data());
    const bool overlap =
        lo < dlo + uintptr_t(dlogits.nbytes()) && dlo < lo + uintptr_t(logits.nbytes());
    TANDEM_CHECK(!overlap || (lo == dlo && logits.dtype() == dlogits.dtype()), op,
                 ": dlogits overlaps logits without being the same elements in the same dtype");
  }
  expect_targets(op, targets, v);
  if (n == 0 || v == 0) return;
  const cudaStream_t s = stream();
  const auto fscale = static_cast<float>(scale);
  dispatch_act(logits.dtype(), [&](auto in_tag) {
    using Ti = typename decltype(in_tag)::type;
    dispatch_act(dlogits.dtype(), [&](auto out_tag) {
      using To = typename decltype(out_tag)::type;
      ce_backward_kernel<Ti, To><<<static_cast<unsigned>(n), kThreads, 0, s>>>(
          static_cast<To*>(dlogits.raw_data()), static_cast<const Ti*>(logits.raw_data()), v,
          targets.data<int32_t>(), fscale, mask);
      TANDEM_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets) {
  return forward_rows("cross_entropy_forward", logits, targets, Tensor());
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            double scale) {
  backward_rows("cross_entropy_backward", dlogits, logits, targets, scale, Tensor());
}

double cross_entropy_forward_masked(const Tensor& logits, const Tensor& targets,
                                    const Tensor& loss_mask) {
  return forward_rows("cross_entropy_forward_masked", logits, targets, loss_mask);
}

void cross_entropy_backward_masked(const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, double scale, const Tensor& loss_mask) {
  backward_rows("cross_entropy_backward_masked", dlogits, logits, targets, scale, loss_mask);
}

}  // namespace tandem::ops::cuda
