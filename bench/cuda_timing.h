// Helpers of the standalone CUDA timing programs (attention_timing, expert_gemm_timing): seeded
// bf16 inputs on the GPU, CUDA-event timing on the current stream, host copies to compare.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace tandem::bench {

// A bf16 GPU tensor of uniform values in [-1, 1) from `seed`.
inline Tensor random_gpu(const Shape& shape, uint64_t seed) {
  Tensor host = Tensor::empty(shape, DType::kF32, MemCategory::kOther, "bench", Device::kCPU);
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    const uint64_t r = splitmix64(seed * 0x9E3779B97F4A7C15ull + uint64_t(i));
    p[i] = static_cast<float>(static_cast<double>(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
  }
  Tensor cast = Tensor::empty(shape, DType::kBF16, MemCategory::kOther, "bench", Device::kCPU);
  ops::convert(cast, host);
  return cast.to(Device::kCUDA);
}

// Milliseconds per call of `fn`, averaged over `iters` calls after `warmup` calls.
template <typename Fn>
double time_ms(int iters, Fn fn, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaStream_t stream = cuda::current_stream();
  cudaEvent_t start, stop;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  TANDEM_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) fn();
  TANDEM_CUDA_CHECK(cudaEventRecord(stop, stream));
  TANDEM_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  TANDEM_CUDA_CHECK(cudaEventDestroy(start));
  TANDEM_CUDA_CHECK(cudaEventDestroy(stop));
  return ms / iters;
}

// Host milliseconds per call of `fn` with the stream held back (a host function on it sleeps
// long enough for every call to be issued), so that the host's issuing is timed and not the
// GPU's running: what paces the GPU where it has nothing queued. A call that waits for the
// stream shows as the hold's length.
template <typename Fn>
double host_issue_ms(int iters, Fn fn, int hold_ms = 300) {
  fn();  // first-call set-up (cuBLAS heuristics, scratch) is not the steady state
  cudaStream_t stream = cuda::current_stream();
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  int hold = hold_ms;  // read by the host function, which has run once the stream is synchronized
  TANDEM_CUDA_CHECK(cudaLaunchHostFunc(
      stream,
      [](void* ms) {
        std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
      },
      &hold));
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const auto end = std::chrono::steady_clock::now();
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return std::chrono::duration<double, std::milli>(end - begin).count() / iters;
}

// `t` (bf16 or f32, on the GPU) as a host f32 tensor.
inline Tensor host_f32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::kF32, MemCategory::kOther, "bench", Device::kCPU);
  ops::convert(out, t.to(Device::kCPU));
  return out;
}

}  // namespace tandem::bench
