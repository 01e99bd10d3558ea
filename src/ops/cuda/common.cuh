// Device-side helpers of the CUDA ops: loads and stores of f32 or bf16 elements chosen at run
// time (a warp-uniform branch), so one kernel serves both storage types without template bloat.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/dtype.h"

namespace tandem::ops::cuda {

// A float array stored as f32 or bf16.
struct FloatPtr {
  void* p;
  bool bf16;
  __device__ __forceinline__ float load(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                : static_cast<const float*>(p)[i];
  }
  __device__ __forceinline__ void store(int64_t i, float v) const {
    if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else static_cast<float*>(p)[i] = v;
  }
};

}  // namespace tandem::ops::cuda
