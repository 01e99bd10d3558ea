// CUDA AdamW step: one fused pass over f32 param, grad, m, v (PyTorch's AdamW: decoupled decay
// p -= lr*wd*p, bias correction with the 1-based step). Each element's arithmetic is the CPU
// reference's, operation for operation in f32 with round-to-nearest and no contraction into
// fused multiply-adds, so the two agree bit for bit.
#include <cmath>
#include <cstdint>

#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

constexpr int kThreads = 256;

// The step's scalars, formed in double on the host and rounded to f32 as the CPU op does.
struct AdamWScalars {
  float decay, b1, c1, b2, c2, step_size, inv_sqrt_bc2, eps;
};

__device__ __forceinline__ void adamw_one(float& p, float& m, float& v, float g,
                                          const AdamWScalars& k) {
  // m = b1 m + c1 g; v = b2 v + (c2 g) g; p = p decay - (step_size m) / (sqrt(v) inv + eps).
  const float mi = __fadd_rn(__fmul_rn(k.b1, m), __fmul_rn(k.c1, g));
  const float vi = __fadd_rn(__fmul_rn(k.b2, v), __fmul_rn(__fmul_rn(k.c2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.inv_sqrt_bc2), k.eps);
  p = __fsub_rn(__fmul_rn(p, k.decay), __fdiv_rn(__fmul_rn(k.step_size, mi), denom));
  m = mi;
  v = vi;
}

// Four elements per float4; every pointer 16-byte aligned. Grid-stride over n4 vectors.
__global__ void __launch_bounds__(kThreads)
    adamw_vec4_kernel(float4* param, float4* m, float4* v, const float4* grad, int64_t n4,
                      AdamWScalars k) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 p = param[i], mi = m[i], vi = v[i];
    const float4 g = grad[i];
    adamw_one(p.x, mi.x, vi.x, g.x, k);
    adamw_one(p.y, mi.y, vi.y, g.y, k);
    adamw_one(p.z, mi.z, vi.z, g.z, k);
    adamw_one(p.w, mi.w, vi.w, g.w, k);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}

// Elements [begin, n) one at a time (the tail after the vectors, or everything when unaligned).
__global__ void __launch_bounds__(kThreads)
    adamw_scalar_kernel(float* param, float* m, float* v, const float* grad, int64_t begin,
                        int64_t n, AdamWScalars k) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = begin + int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    adamw_one(param[i], m[i], v[i], grad[i], k);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWParams& hp) {
  const char* op = "adamw_step";
  expect_cuda_rank(op, "param", param, {DType::kF32}, -1);
  expect_cuda(op, "grad", grad, {DType::kF32}, param.shape());
  expect_cuda(op, "m", m, {DType::kF32}, param.shape());
  expect_cuda(op, "v", v, {DType::kF32}, param.shape());
  TANDEM_CHECK(hp.step >= 1, op, ": step is ", hp.step, ", expected at least 1");
  const int64_t n = param.numel();
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const AdamWScalars k{static_cast<float>(1.0 - hp.lr * hp.weight_decay),
                       static_cast<float>(hp.beta1),
                       static_cast<float>(1.0 - hp.beta1),
                       static_cast<float>(hp.beta2),
                       static_cast<float>(1.0 - hp.beta2),
                       static_cast<float>(hp.lr / bc1),
                       static_cast<float>(1.0 / std::sqrt(bc2)),
                       static_cast<float>(hp.eps)};
  float* pp = param.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  const float* pg = grad.data<float>();
  const cudaStream_t s = stream();
  const bool vec = aligned16(pp) && aligned16(pm) && aligned16(pv) && aligned16(pg);
  const int64_t n4 = vec ? n / 4 : 0;
  if (n4 > 0) {
    adamw_vec4_kernel<<<blocks_for(n4, kThreads), kThreads, 0, s>>>(
        reinterpret_cast<float4*>(pp), reinterpret_cast<float4*>(pm), reinterpret_cast<float4*>(pv),
        reinterpret_cast<const float4*>(pg), n4, k);
    TANDEM_CUDA_CHECK_LAUNCH();
  }
  if (n4 * 4 < n) {
    adamw_scalar_kernel<<<blocks_for(n - n4 * 4, kThreads), kThreads, 0, s>>>(pp, pm, pv, pg,
                                                                              n4 * 4, n, k);
    TANDEM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace tandem::ops::cuda
