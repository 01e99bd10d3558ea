// The CUDA MoE ops' shared pieces (router.cu: the routers; moe.cu: the token permutation and
// combine): the block size of their kernels (row kernels take one warp per row: warp_row and
// row_blocks in common.cuh and common.h), and the per-expert counts, an integer histogram (its
// order does not matter). Included by those two files only; each gets its own copy
// (an unnamed namespace).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/check.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"

namespace tandem::ops::cuda {
namespace {

constexpr int kThreads = 256;

// counts[id] += occurrences of each id in [0, e) (counts zeroed by the caller). Integer adds:
// the order does not matter.
__global__ void __launch_bounds__(kThreads)
    histogram_kernel(int32_t* counts, const int32_t* ids, int64_t count, int e, bool in_shared) {
  extern __shared__ int hist[];  // [e] when in_shared
  if (in_shared) {
    for (int c = threadIdx.x; c < e; c += blockDim.x) hist[c] = 0;
    __syncthreads();
  }
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const int32_t id = ids[i];
    if (id >= 0 && id < e) atomicAdd(in_shared ? &hist[id] : &counts[id], 1);
  }
  if (in_shared) {
    __syncthreads();
    for (int c = threadIdx.x; c < e; c += blockDim.x) {
      if (hist[c] != 0) atomicAdd(&counts[c], hist[c]);
    }
  }
}

inline void launch_counts(int32_t* counts, const int32_t* ids, int64_t count, int64_t e) {
  TANDEM_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(e) * sizeof(int32_t), stream()));
  if (count == 0) return;
  const bool in_shared = e * int64_t{sizeof(int)} <= 48 * 1024;
  histogram_kernel<<<blocks_for(count, kThreads), kThreads,
                     in_shared ? static_cast<size_t>(e) * sizeof(int) : 0, stream()>>>(
      counts, ids, count, static_cast<int>(e), in_shared);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace tandem::ops::cuda
