// Shared pieces of the CUDA ops (host side): argument checks that throw tandem::Error naming the
// op and the tensor, and launch helpers. Private to src/ops/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/wait.h"
#include "core/tensor.h"

namespace tandem::ops::cuda {

// Throws unless `t` is a defined, live CUDA tensor of exactly `shape` whose dtype is one of
// `dtypes` ("<op>: tensor 'x' is f64, expected bf16 or f32").
void expect_cuda(const char* op, const char* name, const Tensor& t,
                 std::initializer_list<DType> dtypes, const Shape& shape);
// As above with any shape of rank `rank` (any rank when negative).
void expect_cuda_rank(const char* op, const char* name, const Tensor& t,
                      std::initializer_list<DType> dtypes, int64_t rank);

inline cudaStream_t stream() { return tandem::cuda::current_stream(); }

// Whether p lies on a 16-byte boundary (vector loads, cp.async, cuBLAS's grouped kernels).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks for a grid-stride loop over n elements with `threads` per block.
inline unsigned blocks_for(int64_t n, int threads = 256) {
  const int64_t b = (n + threads - 1) / threads;
  const int64_t cap = int64_t{tandem::cuda::multiprocessor_count()} * 32;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

// Blocks of `threads` threads for a warp-per-row kernel over `rows` rows (warp_row in
// common.cuh): one warp a row.
inline unsigned row_blocks(int64_t rows, int threads) {
  const int64_t per_block = threads / 32;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

}  // namespace tandem::ops::cuda
