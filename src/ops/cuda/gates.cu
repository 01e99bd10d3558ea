// CUDA bias of a product (forward and its column-sum gradient) and the sigmoid gate of a shared
// expert, bf16 activations with fp32 math. Column sums run in a fixed order (row chunks summed
// one after another, no float atomics), so every result is bitwise reproducible.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/scratch.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int64_t kChunkRows = 256;  // rows a bias-gradient block sums

// y[r, c] += b[c].
template <typename TB>
__global__ void __launch_bounds__(kThreads)
    bias_forward_kernel(bf16* y, const TB* b, int64_t m, int64_t n) {
  for (int64_t i = global_thread(); i < m * n; i += grid_threads()) {
    store1(y + i, load1(y + i) + load1(b + i % n));
  }
}

// partial[chunk, c] = sum of dy[r, c] over the chunk's rows, in row order. Block (32, 8): 32
// columns, 8 strided row slices combined in a fixed order.
__global__ void __launch_bounds__(kThreads)
    bias_partial_kernel(float* partial, const bf16* dy, int64_t m, int64_t n) {
  __shared__ float slice[8][33];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * kChunkRows;
  const int64_t r1 = std::min(m, r0 + kChunkRows);
  float s = 0;
  if (c < n) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += load1(dy + r * n + c);
  }
  slice[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float total = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) total += slice[y][threadIdx.x];
    partial[int64_t{blockIdx.y} * n + c] = total;
  }
}

// db[c] += the chunks' partial sums, chunk after chunk.
__global__ void __launch_bounds__(kThreads)
    bias_finish_kernel(float* db, const float* partial, int64_t chunks, int64_t n) {
  for (int64_t c = global_thread(); c < n; c += grid_threads()) {
    float s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * n + c];
    db[c] += s;
  }
}

// One warp per row: gate = sigmoid(logit); y = gate * z.
__global__ void __launch_bounds__(kThreads)
    sigmoid_gate_forward_kernel(bf16* y, float* gate, const bf16* z, const float* logit, int64_t m,
                                int64_t h) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= m) return;
  const float g = 1.0f / (1.0f + expf(-logit[row]));
  if (lane == 0) gate[row] = g;
  for (int64_t c = lane; c < h; c += 32) store1(y + row * h + c, g * load1(z + row * h + c));
}

// One warp per row: dlogit = <dy, z> g (1 - g) (the dot in a fixed order: lanes, then the warp
// tree), then dz = dy * g (dz may be dy: every read of the row comes first).
__global__ void __launch_bounds__(kThreads)
    sigmoid_gate_backward_kernel(bf16* dz, bf16* dlogit, const bf16* dy, const bf16* z,
                                 const float* gate, int64_t m, int64_t h) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= m) return;
  const float g = gate[row];
  float dot = 0;
  for (int64_t c = lane; c < h; c += 32) dot += load1(dy + row * h + c) * load1(z + row * h + c);
  dot = warp_sum(dot);
  __syncwarp();
  for (int64_t c = lane; c < h; c += 32) store1(dz + row * h + c, load1(dy + row * h + c) * g);
  if (lane == 0) store1(dlogit + row, dot * g * (1 - g));
}

}  // namespace

void bias_forward(const Tensor& y, const Tensor& b) {
  const char* op = "bias_forward";
  expect_cuda_rank(op, "y", y, {DType::kBF16}, 2);
  const int64_t m = y.size(0), n = y.size(1);
  expect_cuda(op, "b", b, {DType::kBF16, DType::kF32}, {n});
  if (m * n == 0) return;
  bf16* py = static_cast<bf16*>(y.raw_data());
  if (b.dtype() == DType::kBF16) {
    bias_forward_kernel<<<blocks_for(m * n, kThreads), kThreads, 0, stream()>>>(
        py, static_cast<const bf16*>(b.raw_data()), m, n);
  } else {
    bias_forward_kernel<<<blocks_for(m * n, kThreads), kThreads, 0, stream()>>>(py, b.data<float>(),
                                                                                m, n);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void bias_backward(const Tensor& db, const Tensor& dy) {
  const char* op = "bias_backward";
  expect_cuda_rank(op, "dy", dy, {DType::kBF16}, 2);
  const int64_t m = dy.size(0), n = dy.size(1);
  expect_cuda(op, "db", db, {DType::kF32}, {n});
  if (m * n == 0) return;
  const int64_t chunks = (m + kChunkRows - 1) / kChunkRows;
  TANDEM_CHECK(chunks < 65536 && (n + 31) / 32 < (int64_t{1} << 31), op, ": dy of shape [", m, ", ",
               n, "] is too large");
  Scratch scratch(op);
  float* partial = scratch.take<float>(chunks * n);
  bias_partial_kernel<<<dim3(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(chunks)),
                        dim3(32, 8), 0, stream()>>>(partial,
                                                    static_cast<const bf16*>(dy.raw_data()), m, n);
  TANDEM_CUDA_CHECK_LAUNCH();
  bias_finish_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(db.data<float>(), partial,
                                                                         chunks, n);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void sigmoid_gate_forward(const Tensor& y, const Tensor& gate, const Tensor& z,
                          const Tensor& logit) {
  const char* op = "sigmoid_gate_forward";
  expect_cuda_rank(op, "z", z, {DType::kBF16}, 2);
  const int64_t m = z.size(0), h = z.size(1);
  expect_cuda(op, "y", y, {DType::kBF16}, {m, h});
  expect_cuda(op, "gate", gate, {DType::kF32}, {m});
  expect_cuda(op, "logit", logit, {DType::kF32}, {m});
  if (m == 0) return;
  sigmoid_gate_forward_kernel<<<row_blocks(m, kThreads), kThreads, 0, stream()>>>(
      static_cast<bf16*>(y.raw_data()), gate.data<float>(), static_cast<const bf16*>(z.raw_data()),
      logit.data<float>(), m, h);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void sigmoid_gate_backward(const Tensor& dz, const Tensor& dlogit, const Tensor& dy,
                           const Tensor& z, const Tensor& gate) {
  const char* op = "sigmoid_gate_backward";
  expect_cuda_rank(op, "z", z, {DType::kBF16}, 2);
  const int64_t m = z.size(0), h = z.size(1);
  expect_cuda(op, "dz", dz, {DType::kBF16}, {m, h});
  expect_cuda(op, "dy", dy, {DType::kBF16}, {m, h});
  expect_cuda(op, "dlogit", dlogit, {DType::kBF16}, {m});
  expect_cuda(op, "gate", gate, {DType::kF32}, {m});
  if (m == 0) return;
  sigmoid_gate_backward_kernel<<<row_blocks(m, kThreads), kThreads, 0, stream()>>>(
      static_cast<bf16*>(dz.raw_data()), static_cast<bf16*>(dlogit.raw_data()),
      static_cast<const bf16*>(dy.raw_data()), static_cast<const bf16*>(z.raw_data()),
      gate.data<float>(), m, h);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::ops::cuda
