// The CUDA routers' per-row pieces (router.cu: the choice and weights; router_loss.cu: the
// losses): one warp a row, lane l holding experts l + 32 m. A pick is a warp arg-max under
// `beats`: the higher value, ties (and unordered NaN) to the lower index, the serial scan's
// winner on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::ops::cuda {

constexpr int kRouterThreads = 256;
constexpr int kMaxTopK = 32;          // one lane per selected expert
constexpr int kMaxExperts = 64 * 32;  // a 64-bit mask of taken experts per lane

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Whether candidate (v, i) beats (bv, bi): higher value, ties (and unordered NaN) to the lower
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

// The k largest of one row of e values (row[c], read by every lane), in descending order: lane
// j < k returns pick j's index and value in idx and v (other lanes: -1).
__device__ __forceinline__ void warp_topk(int& idx, float& v, const float* row, int e, int k) {
  const int lane = threadIdx.x & 31;
  const int rounds = (e + 31) / 32;
  uint64_t taken = 0;  // bit m: expert lane + 32 m already picked
  idx = -1;
  v = 0;
  for (int j = 0; j < k; ++j) {
    float bv = 0;
    int bi = -1;
    for (int m = 0; m < rounds; ++m) {
      const int c = lane + 32 * m;
      if (c < e && !((taken >> m) & 1u) && beats(row[c], c, bv, bi)) bv = row[c], bi = c;
    }
    warp_best(bv, bi);
    if ((bi & 31) == lane) taken |= uint64_t{1} << (bi >> 5);
    if (lane == j) idx = bi, v = bv;
  }
}

}  // namespace tandem::ops::cuda
