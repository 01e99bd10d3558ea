// Times the GPU flash attention (ops::attention_forward / backward on CUDA tensors) with CUDA
// events on the two benchmark shapes (and one D 128 shape) and prints TFLOP/s. Causal FLOPs:
// forward 2*2*b*h*s*s*D/2 (the two products over the lower triangle), backward 2.5x that.
// Standalone (no Google Benchmark): `attention_timing [iterations]`.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace {

using tandem::ops::AttentionShape;
using tandem::Device;
using tandem::DType;
using tandem::MemCategory;
using tandem::Shape;
using tandem::Tensor;

// A bf16 GPU tensor of uniform values in [-1, 1) from `seed`.
Tensor random_gpu(const Shape& shape, uint64_t seed) {
  Tensor host = Tensor::empty(shape, DType::kF32, MemCategory::kOther, "bench", Device::kCPU);
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    const uint64_t r = tandem::splitmix64(seed * 0x9E3779B97F4A7C15ull + uint64_t(i));
    p[i] = static_cast<float>(static_cast<double>(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
  }
  Tensor cast = Tensor::empty(shape, DType::kBF16, MemCategory::kOther, "bench", Device::kCPU);
  tandem::ops::convert(cast, host);
  return cast.to(Device::kCUDA);
}

// Milliseconds per call of `fn`, averaged over `iters` calls after 3 warm-up calls.
template <typename Fn>
double time_ms(int iters, Fn fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaStream_t stream = tandem::cuda::current_stream();
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

void bench(const AttentionShape& s, int iters) {
  const int64_t n = s.batch * s.seq, qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  const Tensor q = random_gpu({n, qw}, 1), k = random_gpu({n, kw}, 2), v = random_gpu({n, kw}, 3);
  const Tensor dout = random_gpu({n, qw}, 4);
  const auto gpu = [](const Shape& shape, DType dtype) {
    return Tensor::empty(shape, dtype, MemCategory::kOther, "bench", Device::kCUDA);
  };
  const Tensor out = gpu({n, qw}, DType::kBF16), lse = gpu({s.batch, s.heads, s.seq}, DType::kF32);
  const Tensor dq = gpu({n, qw}, DType::kBF16), dk = gpu({n, kw}, DType::kBF16),
               dv = gpu({n, kw}, DType::kBF16);

  const double fwd_ms = time_ms(iters, [&] { tandem::ops::attention_forward(out, lse, q, k, v, s); });
  const double bwd_ms = time_ms(iters, [&] {
    tandem::ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
  });
  const double fwd_flops = 2.0 * 2.0 * double(s.batch) * double(s.heads) * double(s.seq) *
                           double(s.seq) * double(s.head_dim) / 2.0;
  const double bwd_flops = 2.5 * fwd_flops;
  std::printf("batch %3lld seq %5lld heads %3lld kv %3lld D %3lld | fwd %8.3f ms %7.1f TFLOP/s | "
              "bwd %8.3f ms %7.1f TFLOP/s\n",
              static_cast<long long>(s.batch), static_cast<long long>(s.seq),
              static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads),
              static_cast<long long>(s.head_dim), fwd_ms, fwd_flops / (fwd_ms * 1e9), bwd_ms,
              bwd_flops / (bwd_ms * 1e9));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    if (iters < 1) {
      std::fprintf(stderr, "usage: attention_timing [iterations >= 1]\n");
      return 2;
    }
    tandem::cuda::initialize(0);
    std::printf("GPU: %s, %d iterations\n", tandem::cuda::device_description().c_str(), iters);
    bench({8, 1024, 12, 12, 64}, iters);
    bench({2, 2048, 16, 8, 64}, iters);
    bench({4, 1024, 16, 16, 128}, iters);  // D 128 (the other tensor-core path)
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_timing: %s\n", e.what());
    return 1;
  }
}
