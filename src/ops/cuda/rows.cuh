// Row helpers of the two cross-entropy ops, loss.cu (logits in memory) and lm_head.cu (logits
// formed a block of rows at a time): the online (max, sum) log-sum-exp reduced over one thread
// block per row, the softmax gradient, the target check and the fixed-order double sum of the row
// losses, and on the host the target check and the forward's one read-back. Each op adds a
// vector of logits to its running MaxSum in its own order (add_values in each file): the two
// orders round differently, so each op keeps its own. Private to src/ops/cuda.
//
// Everything here has internal linkage (an unnamed namespace, against the usual rule for
// headers): each .cu that includes it gets its own copy, and a
// kernel must not be defined with external linkage in two translation units of a whole-program
// (non-rdc) CUDA build, where each registers its own kernels. So each includer must use every
// function here that is not a template or a member: nvcc flags an unreferenced one (#177-D), an
// error under -Werror.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"

namespace tandem::ops::cuda {

namespace {

constexpr int kSumThreads = 1024;  // the one block that sums the row losses

// ---- device side ----

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

// The loss of row r (its v logits at `row`), written by one thread: row_loss[r] = lse -
// row[targets[r]] for a target in [0, v), or 0 where the loss mask (`mask`, indexed as
// targets; null: none) is 0; for any other target, 0, and *bad_row lowered to `batch_row` (row
// r's index in the op's whole batch), masked or not.
template <typename T>
__device__ __forceinline__ void record_row_loss(float* row_loss, unsigned* bad_row, int64_t r,
                                                float lse, const T* row, int64_t v,
                                                const int32_t* targets, int64_t batch_row,
                                                const float* mask) {
  const int32_t t = targets[r];
  if (t >= 0 && t < v) {
    row_loss[r] = mask != nullptr && mask[r] == 0.0f ? 0.0f : lse - load1(row + t);
  } else {
    row_loss[r] = 0.0f;
    atomicMin(bad_row, static_cast<unsigned>(batch_row));
  }
}

// The scale of row r's dlogits: `scale`, or 0 where the loss mask (null: none) is 0.
__device__ __forceinline__ float row_scale(float scale, const float* mask, int64_t r) {
  return mask != nullptr && mask[r] == 0.0f ? 0.0f : scale;
}

// dlogits of element j of a row whose target is t: (exp(x - lse) - [j == t]) * scale.
__device__ __forceinline__ float ce_grad(float x, float lse, int64_t j, int64_t t, float scale) {
  return (__expf(x - lse) - (j == t ? 1.0f : 0.0f)) * scale;
}

// What the forward reads back: the loss, the first row with a bad target (~0u: none) and that
// target.
struct LossStatus {
  double loss;
  uint32_t bad_row;
  int32_t bad_target;
};
static_assert(sizeof(LossStatus) == 16);

// status->loss = the n row losses added in double, in a fixed order; with a bad row, its target
// in status->bad_target.
__global__ void __launch_bounds__(kSumThreads)
    sum_rows_kernel(LossStatus* status, const float* x, const int32_t* targets, int64_t n) {
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
    if (lane == 0) {
      status->loss = acc;
      if (status->bad_row != ~0u) status->bad_target = targets[status->bad_row];
    }
  }
}

// ---- host side ----

// The loss mask's elements (f32 [n] on the GPU, 0 or 1: the values are the caller's to keep,
// Note [Loss mask] in model/end_nodes.cc), or null when it is undefined.
inline const float* loss_mask_rows(const char* op, const Tensor& loss_mask, int64_t n) {
  if (!loss_mask.defined()) return nullptr;
  expect_cuda(op, "loss_mask", loss_mask, {DType::kF32}, {n});
  return loss_mask.data<float>();
}

// Copies the targets to the host once and checks each is in [0, v), as the CPU op does.
void expect_targets(const char* op, const Tensor& targets, int64_t v) {
  std::vector<int32_t> host(static_cast<size_t>(targets.numel()));
  if (host.empty()) return;
  const cudaStream_t s = stream();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(host.data(), targets.raw_data(), host.size() * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, s));
  tandem::cuda::wait_stream(s, "the copy of the loss targets to the host");
  for (size_t r = 0; r < host.size(); ++r) {
    TANDEM_CHECK(host[r] >= 0 && host[r] < v, op, ": target ", host[r], " at row ", r,
                 " is outside [0, ", v, ")");
  }
}

// The per-row losses of a forward over n rows and its status on the device (a LossStatus in an
// i64 [2] tensor), both op workspace. The forward's kernels write row_loss() through
// record_row_loss, which lowers bad_row() (preset to ~0u on `s` here); start() adds the rows up
// and starts reading the status back, finish() waits for it. `s` is the current stream.
class RowLosses {
 public:
  RowLosses(int64_t n, std::string_view row_loss_tag, std::string_view status_tag, cudaStream_t s)
      : row_loss_(
            Tensor::empty({n}, DType::kF32, MemCategory::kOther, row_loss_tag, Device::kCUDA)),
        status_(Tensor::empty({2}, DType::kI64, MemCategory::kOther, status_tag, Device::kCUDA)),
        n_(n),
        s_(s) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(bad_row(), 0xff, sizeof(unsigned), s_));
  }

  float* row_loss() const { return row_loss_.data<float>(); }  // [n]
  unsigned* bad_row() const {
    return reinterpret_cast<unsigned*>(static_cast<char*>(status_.raw_data()) + 8);
  }

  // The row losses added in double in a fixed order, on their way to the host with the first
  // bad row and its target in one copy (Note [Reads to the host ahead of use]); asking for the
  // value throws naming that target, if any (valid targets are [0, v)).
  PendingScalar start(const char* op, const Tensor& targets, int64_t v) const {
    sum_rows_kernel<<<1, kSumThreads, 0, s_>>>(static_cast<LossStatus*>(status_.raw_data()),
                                               row_loss(), targets.data<int32_t>(), n_);
    TANDEM_CUDA_CHECK_LAUNCH();
    return PendingScalar(HostRead(status_), [op, v](HostRead& read) {
      const std::vector<int64_t> words = read.take_as<int64_t>();
      LossStatus host{};
      std::memcpy(&host, words.data(), sizeof(host));
      TANDEM_CHECK(host.bad_row == ~0u, op, ": target ", host.bad_target, " at row ", host.bad_row,
                   " is outside [0, ", v, ")");
      return host.loss;
    });
  }
  // start()'s value, waited for.
  double finish(const char* op, const Tensor& targets, int64_t v) const {
    return start(op, targets, v).get();
  }

 private:
  Tensor row_loss_;  // [n] f32
  Tensor status_;    // [2] i64 holding a LossStatus
  int64_t n_;
  cudaStream_t s_;
};

}  // namespace

}  // namespace tandem::ops::cuda
