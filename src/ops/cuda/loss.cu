// CUDA cross-entropy over the vocabulary: one block of threads per row reading 16 bytes at a
// time, an online (max, sum) log-sum-exp in fp32; the forward's loss is summed in double in a
// fixed order (run to run identical) and read back with one copy. logits and dlogits are f32 or
// bf16 in any mix; dlogits may alias logits (same dtype, same elements).
// The row helpers here have twins in lm_head.cu (kept private to each file, which keep no
// shared device header); change both together.
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

constexpr int kThreads = 256;      // per row
constexpr int kSumThreads = 1024;  // the one block that sums the row losses

// ---- device helpers ----

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store_one(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_one(__nv_bfloat16* p, float x) {
  *p = __float2bfloat16_rn(x);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

// 16 bytes at p (16-byte aligned) as floats.
__device__ __forceinline__ void load_vec(const float* p, float (&x)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
__device__ __forceinline__ void load_vec(const __nv_bfloat16* p, float (&x)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 h;
    memcpy(&h, &w[i], sizeof(h));
    const float2 f = __bfloat1622float2(h);
    x[2 * i] = f.x, x[2 * i + 1] = f.y;
  }
}

// N floats stored at p as T; p aligned to min(16, N * sizeof(T)) bytes.
__device__ __forceinline__ void store_vec(float* p, const float (&x)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ void store_vec(float* p, const float (&x)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float (&x)[4]) {
  *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]));
}
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float (&x)[8]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
                                            pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
}

// A running max m and sum s of exp(x - m). Starting from m = -FLT_MAX (not -inf) keeps every
// exponent argument a number: rows of -inf give s = 0 and lse = -inf, NaN propagates into s.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ void add_value(MaxSum& a, float x) {
  const float mn = fmaxf(a.m, x);
  a.s = a.s * __expf(a.m - mn) + __expf(x - mn);
  a.m = mn;
}
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
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float mn = fmaxf(a.m, b.m);
  return MaxSum{mn, a.s * __expf(a.m - mn) + b.s * __expf(b.m - mn)};
}

// The block's combined MaxSum, returned to every thread (blockDim.x a multiple of 32). Call once
// per kernel: it ends with a barrier, so what the threads read before it is read by all.
__device__ MaxSum block_max_sum(MaxSum a) {
  __shared__ MaxSum warp_part[32];
  __shared__ MaxSum total;
  for (int off = 16; off > 0; off /= 2)
    a = merge(a, MaxSum{__shfl_xor_sync(~0u, a.m, off), __shfl_xor_sync(~0u, a.s, off)});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_part[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < int(blockDim.x / 32) ? warp_part[lane] : MaxSum{-FLT_MAX, 0.0f};
    for (int off = 16; off > 0; off /= 2)
      a = merge(a, MaxSum{__shfl_xor_sync(~0u, a.m, off), __shfl_xor_sync(~0u, a.s, off)});
    if (lane == 0) total = a;
  }
  __syncthreads();
  return total;
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
  for (int64_t j = threadIdx.x; j < sp.head; j += stride) add_value(acc, to_float(row[j]));
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
    add_value(acc, to_float(row[j]));
  acc = block_max_sum(acc);
  return acc.m + logf(acc.s);
}

// row_loss[r] = lse(logits[r]) - logits[r, targets[r]]; a target outside [0, v) gives 0 and
// lowers *bad_row to r.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    ce_forward_kernel(float* row_loss, unsigned* bad_row, const T* logits, int64_t v,
                      const int32_t* targets) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * v;
  const float lse = row_logsumexp(row, v);
  if (threadIdx.x == 0) {
    const int32_t t = targets[r];
    if (t >= 0 && t < v) {
      row_loss[r] = lse - to_float(row[t]);
    } else {
      row_loss[r] = 0.0f;
      atomicMin(bad_row, static_cast<unsigned>(r));
    }
  }
}

// dlogits[r, j] = (exp(logits[r, j] - lse) - [j == target]) * scale. Each element is read and
// written by the same thread, after the whole row was read for the lse, so dlogits may alias
// logits. Targets were checked on the host.
template <typename Ti, typename To>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(To* dlogits, const Ti* logits, int64_t v, const int32_t* targets,
                       float scale) {
  constexpr int kN = 16 / sizeof(Ti);
  constexpr uintptr_t kOutAlign = kN * sizeof(To) < 16 ? kN * sizeof(To) : 16;
  const int64_t r = blockIdx.x;
  const Ti* row = logits + r * v;
  To* drow = dlogits + r * v;
  const float lse = row_logsumexp(row, v);
  const int64_t t = targets[r];
  const auto grad = [&](int64_t j, float x) {
    return (__expf(x - lse) - (j == t ? 1.0f : 0.0f)) * scale;
  };
  const RowSplit sp = split_row(row, v);
  const bool vec_out = (reinterpret_cast<uintptr_t>(drow + sp.head) % kOutAlign) == 0;
  for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x)
    store_one(drow + j, grad(j, to_float(row[j])));
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
      for (int e = 0; e < kN; ++e) store_one(drow + j0 + e, x[e]);
    }
  }
  for (int64_t j = sp.head + sp.vecs * kN + threadIdx.x; j < v; j += blockDim.x)
    store_one(drow + j, grad(j, to_float(row[j])));
}

// *sum = the n row losses added in double, in a fixed order.
__global__ void __launch_bounds__(kSumThreads)
    sum_rows_kernel(double* sum, const float* x, int64_t n) {
  __shared__ double warp_part[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(~0u, acc, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_part[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < int(blockDim.x / 32) ? warp_part[lane] : 0.0;
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(~0u, acc, off);
    if (lane == 0) *sum = acc;
  }
}

// ---- host side ----

// What the forward reads back: the loss and the first row with a bad target (~0u: none).
struct LossStatus {
  double loss;
  uint32_t bad_row;
  uint32_t unused;
};
static_assert(sizeof(LossStatus) == 16);

template <typename F>
void dispatch_float(DType t, F&& f) {
  if (t == DType::kBF16)
    f(std::type_identity<__nv_bfloat16>{});
  else
    f(std::type_identity<float>{});
}

// Checks logits [N, V] (f32 or bf16) and targets [N] i32; returns N. Rows go to the grid's x.
int64_t check_ce(const char* op, const Tensor& logits, const Tensor& targets) {
  expect_cuda_rank(op, "logits", logits, {DType::kF32, DType::kBF16}, 2);
  const int64_t n = logits.size(0);
  expect_cuda(op, "targets", targets, {DType::kI32}, {n});
  TANDEM_CHECK(n < (int64_t{1} << 31), op, ": ", n, " rows, at most 2^31 - 1 are supported");
  return n;
}

// Copies the targets to the host once and checks each is in [0, v), as the CPU op does.
void expect_targets(const char* op, const Tensor& targets, int64_t v) {
  std::vector<int32_t> host(static_cast<size_t>(targets.numel()));
  if (host.empty()) return;
  const cudaStream_t s = stream();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(host.data(), targets.raw_data(), host.size() * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, s));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  for (size_t r = 0; r < host.size(); ++r) {
    TANDEM_CHECK(host[r] >= 0 && host[r] < v, op, ": target ", host[r], " at row ", r,
                 " is outside [0, ", v, ")");
  }
}

}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets) {
  const char* op = "cross_entropy_forward";
  const int64_t n = check_ce(op, logits, targets);
  const int64_t v = logits.size(1);
  if (n == 0) return 0.0;
  const cudaStream_t s = stream();
  const Tensor row_loss =
      Tensor::empty({n}, DType::kF32, MemCategory::kOther, "ce.row_loss", Device::kCUDA);
  const Tensor status =
      Tensor::empty({2}, DType::kI64, MemCategory::kOther, "ce.status", Device::kCUDA);
  auto* sum = static_cast<double*>(status.raw_data());
  auto* bad_row = reinterpret_cast<unsigned*>(static_cast<char*>(status.raw_data()) + 8);
  TANDEM_CUDA_CHECK(cudaMemsetAsync(bad_row, 0xff, sizeof(unsigned), s));
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    ce_forward_kernel<T><<<static_cast<unsigned>(n), kThreads, 0, s>>>(
        row_loss.data<float>(), bad_row, static_cast<const T*>(logits.raw_data()), v,
        targets.data<int32_t>());
    TANDEM_CUDA_CHECK_LAUNCH();
  });
  sum_rows_kernel<<<1, kSumThreads, 0, s>>>(sum, row_loss.data<float>(), n);
  TANDEM_CUDA_CHECK_LAUNCH();
  LossStatus host{};
  TANDEM_CUDA_CHECK(
      cudaMemcpyAsync(&host, status.raw_data(), sizeof(host), cudaMemcpyDeviceToHost, s));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  if (host.bad_row != ~0u) {
    int32_t t = 0;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(&t, targets.data<int32_t>() + host.bad_row, sizeof(t),
                                      cudaMemcpyDeviceToHost, s));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
    TANDEM_CHECK(false, op, ": target ", t, " at row ", host.bad_row, " is outside [0, ", v, ")");
  }
  return host.loss;
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            double scale) {
  const char* op = "cross_entropy_backward";
  const int64_t n = check_ce(op, logits, targets);
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
  dispatch_float(logits.dtype(), [&](auto in_tag) {
    using Ti = typename decltype(in_tag)::type;
    dispatch_float(dlogits.dtype(), [&](auto out_tag) {
      using To = typename decltype(out_tag)::type;
      ce_backward_kernel<Ti, To><<<static_cast<unsigned>(n), kThreads, 0, s>>>(
          static_cast<To*>(dlogits.raw_data()), static_cast<const Ti*>(logits.raw_data()), v,
          targets.data<int32_t>(), fscale);
      TANDEM_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace tandem::ops::cuda
