// FP8 round trip on the GPU (ops/fp8.h): one block a tile. The block finds the tile's amax (NaN
// kept, as core/fp8.h's nan_max), one thread turns it into the scale with core/fp8.h's float
// arithmetic, and every thread rounds its elements through CUDA's saturating FP8 conversion, whose
// bits core/fp8.h's from_float reproduces. A tile of the whole tensor (the tensorwise recipe) is
// one block: correct, not yet fast.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/fp8.h"

namespace tandem::ops::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float nan_max(float a, float b) {
  return isnan(a) || isnan(b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}

__device__ float block_nan_max(float v, float* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kThreads / 32 ? shared[threadIdx.x & 31] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// core/fp8.h scale_from_amax, operation for operation.
__device__ __forceinline__ float scale_from_amax(float amax, float max, bool power_of_two) {
  if (isinf(amax) || amax == 0.0f) return 1.0f;
  float scale = __fdiv_rn(max, amax);
  if (isinf(scale)) scale = FLT_MAX;
  if (power_of_two) scale = __uint_as_float(__float_as_uint(scale) & 0xff800000u);
  return scale;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    round_trip_kernel(T* out, const T* x, int64_t rows, int64_t cols, int64_t tile_rows,
                      int64_t tile_cols, int64_t tiles_per_row, __nv_fp8_interpretation_t kind,
                      float max, bool power_of_two) {
  __shared__ float shared[32];
  __shared__ float scale_shared;
  const int64_t r0 = (int64_t{blockIdx.x} / tiles_per_row) * tile_rows;
  const int64_t c0 = (int64_t{blockIdx.x} % tiles_per_row) * tile_cols;
  const int64_t h = min(tile_rows, rows - r0), w = min(tile_cols, cols - c0);
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < h * w; i += kThreads) {
    m = nan_max(m, fabsf(load1(x + (r0 + i / w) * cols + c0 + i % w)));
  }
  m = block_nan_max(m, shared);
  if (threadIdx.x == 0) scale_shared = scale_from_amax(m, max, power_of_two);
  __syncthreads();
  const float scale = scale_shared, inv = __fdiv_rn(1.0f, scale);
  for (int64_t i = threadIdx.x; i < h * w; i += kThreads) {
    T* o = out + (r0 + i / w) * cols + c0 + i % w;
    const float v = __fmul_rn(load1(x + (r0 + i / w) * cols + c0 + i % w), scale);
    const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind);
    const float back = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, kind)));
    store1(o, __fmul_rn(back, inv));
  }
}

}  // namespace

void fp8_round_trip(const Tensor& out, const Tensor& x, const Fp8Tiles& tiles) {
  const char* op = "fp8_round_trip";
  expect_cuda_rank(op, "x", x, {DType::kBF16, DType::kF32}, 2);
  expect_cuda(op, "out", out, {x.dtype()}, x.shape());
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  const int64_t tiles_per_row = (cols + tiles.tile_cols - 1) / tiles.tile_cols;
  const int64_t tile_count = (rows + tiles.tile_rows - 1) / tiles.tile_rows * tiles_per_row;
  TANDEM_CHECK(tile_count <= INT32_MAX, op, ": ", tile_count, " tiles, more than one launch holds");
  const __nv_fp8_interpretation_t kind = tiles.format == fp8::Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  dispatch_act(x.dtype(), [&](auto tx) {
    using T = typename decltype(tx)::type;
    round_trip_kernel<T><<<static_cast<unsigned>(tile_count), kThreads, 0, stream()>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(x.raw_data()), rows, cols,
        tiles.tile_rows, tiles.tile_cols, tiles_per_row, kind, fp8::max_finite(tiles.format),
        tiles.power_of_two);
    TANDEM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tandem::ops::cuda
