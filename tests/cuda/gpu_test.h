// Helpers of the GPU tests: random host tensors, copies to and from the GPU, and the tolerance
// table per dtype that every CUDA op is held to against the CPU reference.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace tandem::testing_gpu {

// A stream of the test's own, never destroyed (a handle never comes back as another stream).
inline cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// Tolerances of a CUDA result against the CPU reference (f32 on the CPU, inputs already rounded
// to the GPU's storage dtype): |gpu - ref| <= atol + rtol * |ref| elementwise.
//   f32 outputs: fp32 arithmetic in another order (and fp32-accumulated bf16 products).
//   bf16 outputs: one bf16 rounding of the output (2^-8 relative) plus accumulation order.
struct Tolerance {
  double rtol, atol;
};
inline Tolerance tolerance_for(DType output) {
  switch (output) {
    case DType::kF32:
      return {1e-4, 1e-5};
    case DType::kBF16:
      return {1.6e-2, 1e-3};
    default:
      return {0, 0};
  }
}

// A host f32 tensor of uniform values in [-scale, scale) from `seed`.
inline Tensor random_host(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, DType::kF32, MemCategory::kOther, "random", Device::kCPU);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u =
        static_cast<double>(splitmix64(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)) >> 11) *
        (1.0 / 9007199254740992.0);
    p[i] = static_cast<float>((2 * u - 1) * scale);
  }
  return t;
}

// `host` (f32) rounded to `dtype` and placed on the GPU.
inline Tensor to_gpu(const Tensor& host, DType dtype) {
  Tensor cast = Tensor::empty(host.shape(), dtype, MemCategory::kOther, "cast", Device::kCPU);
  ops::convert(cast, host);
  return cast.to(Device::kCUDA);
}

// A GPU tensor (f32 or bf16) back on the host as f32.
inline Tensor to_host_f32(const Tensor& gpu) {
  Tensor host = gpu.to(Device::kCPU);
  if (host.dtype() == DType::kF32) return host;
  Tensor f = Tensor::empty(host.shape(), DType::kF32, MemCategory::kOther, "f32", Device::kCPU);
  ops::convert(f, host);
  return f;
}

// The host f32 tensor as the GPU sees it after rounding to `dtype` (the reference's input).
inline Tensor rounded(const Tensor& host, DType dtype) {
  if (dtype == DType::kF32) return host;
  Tensor cast = Tensor::empty(host.shape(), dtype, MemCategory::kOther, "cast", Device::kCPU);
  ops::convert(cast, host);
  Tensor back = Tensor::empty(host.shape(), DType::kF32, MemCategory::kOther, "f32", Device::kCPU);
  ops::convert(back, cast);
  return back;
}

// Asserts |got - want| <= atol + rtol |want| for every element (host f32 tensors); reports the
// worst element.
inline void expect_close(const Tensor& got, const Tensor& want, Tolerance tol,
                         const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  int64_t worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double err = std::fabs(double(g[i]) - double(w[i]));
    const double bound = tol.atol + tol.rtol * std::fabs(double(w[i]));
    if (!(err <= bound) && (worst < 0 || err - bound > worst_excess)) {
      worst = i;
      worst_excess = err - bound;
    }
  }
  EXPECT_LT(worst, 0) << what << ": element " << worst << " is " << (worst >= 0 ? g[worst] : 0)
                      << ", reference " << (worst >= 0 ? w[worst] : 0) << " (rtol " << tol.rtol
                      << ", atol " << tol.atol << ")";
}

// Zeros on the host, f32 unless said.
inline Tensor host(const Shape& shape, DType dt = DType::kF32) {
  return Tensor::zeros(shape, dt, MemCategory::kOther, "host", Device::kCPU);
}

// Uniform ids in [0, limit) from `seed` (repeats likely when limit is small).
inline Tensor random_ids(const Shape& shape, int64_t limit, uint64_t seed) {
  Tensor t = host(shape, DType::kI32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] =
        static_cast<int32_t>(splitmix64(seed * 1000003 + uint64_t(i)) % uint64_t(limit));
  }
  return t;
}

// The values of an i32 tensor, on the host or the GPU.
inline std::vector<int32_t> ints(const Tensor& t) {
  Tensor h = t.device() == Device::kCPU ? t : t.to(Device::kCPU);
  const int32_t* p = h.data<int32_t>();
  return std::vector<int32_t>(p, p + h.numel());
}

inline std::string name(DType dt) { return std::string(dtype_name(dt)); }

}  // namespace tandem::testing_gpu
