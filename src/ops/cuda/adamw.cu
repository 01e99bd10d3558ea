// CUDA AdamW step: one fused pass over f32 param, grad, m, v (PyTorch's AdamW: decoupled decay
// p -= lr*wd*p, bias correction with the 1-based step). Each element's arithmetic is the CPU
// reference's, operation for operation in f32 with round-to-nearest and no contraction into
// fused multiply-adds, so the two agree bit for bit. adamw_step_flat walks a whole flat buffer in
// one launch, with the clipping coefficient applied to the gradient as it is read and the bf16
// compute copy written as the weights are (Note [Flat AdamW]).
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Note [Flat AdamW]: the parameters of a chunk sit in one flat buffer whose entries alternate
// between decayed (matrices) and not (norms, embeddings) in a few dozen runs. One launch carries
// the run bounds in its parameters (DecayRuns, 2 KiB of the 4 KiB allowed), and each thread keeps
// a cursor into them: its grid-stride loop visits ascending elements, so the cursor only moves
// forward. More bounds than fit take one launch per run. Per parameter the pass reads param, grad,
// m, v (16 B) and writes param, m, v and the bf16 copy (14 B): the separate gradient scaling
// (8 B) and conversion (6 B) passes are gone.
constexpr int kMaxBounds = 256;

// Element i takes weight decay when parity plus the number of bounds <= i is odd.
struct DecayRuns {
  int64_t bound[kMaxBounds];  // ascending
  int count;
  int parity;
};

// The step's scalars, formed in double on the host and rounded to f32 as the CPU op does.
struct AdamWScalars {
  float decay, b1, c1, b2, c2, step_size, inv_sqrt_bc2, eps, grad_scale;
};

__device__ __forceinline__ void adamw_one(float& p, float& m, float& v, float grad, float decay,
                                          const AdamWScalars& k) {
  // g = grad scale; m = b1 m + c1 g; v = b2 v + (c2 g) g;
  // p = p decay - (step_size m) / (sqrt(v) inv + eps).
  const float g = __fmul_rn(grad, k.grad_scale);
  const float mi = __fadd_rn(__fmul_rn(k.b1, m), __fmul_rn(k.c1, g));
  const float vi = __fadd_rn(__fmul_rn(k.b2, v), __fmul_rn(__fmul_rn(k.c2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.inv_sqrt_bc2), k.eps);
  p = __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(k.step_size, mi), denom));
  m = mi;
  v = vi;
}

// The number of bounds <= i (binary search; a thread's starting point).
__device__ __forceinline__ int bounds_at_or_below(const DecayRuns& r, int64_t i) {
  int lo = 0, hi = r.count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (r.bound[mid] <= i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The decay factor of element i, moving `cursor` (bounds <= the thread's previous element) on.
__device__ __forceinline__ float decay_at(int64_t i, int& cursor, const DecayRuns& r,
                                          const AdamWScalars& k) {
  while (cursor < r.count && r.bound[cursor] <= i) ++cursor;
  return ((cursor + r.parity) & 1) != 0 ? k.decay : 1.0f;
}

// n elements: n4 float4 vectors (every pointer 16-byte aligned, copy 8-byte aligned; n4 = 0
// otherwise), then the scalar tail. copy: the bf16 compute copy, or null.
__global__ void __launch_bounds__(kThreads)
    adamw_flat_kernel(float* param, float* m, float* v, const float* grad, uint16_t* copy,
                      int64_t n, int64_t n4, AdamWScalars k,
                      const __grid_constant__ DecayRuns runs) {
  const int64_t t = global_thread(), stride = grid_threads();
  int cursor = bounds_at_or_below(runs, t < n4 ? 4 * t : 4 * n4 + t);
  for (int64_t i = t; i < n4; i += stride) {
    float4 p = reinterpret_cast<float4*>(param)[i], mi = reinterpret_cast<float4*>(m)[i],
           vi = reinterpret_cast<float4*>(v)[i];
    const float4 g = reinterpret_cast<const float4*>(grad)[i];
    const int64_t e = 4 * i;
    adamw_one(p.x, mi.x, vi.x, g.x, decay_at(e, cursor, runs, k), k);
    adamw_one(p.y, mi.y, vi.y, g.y, decay_at(e + 1, cursor, runs, k), k);
    adamw_one(p.z, mi.z, vi.z, g.z, decay_at(e + 2, cursor, runs, k), k);
    adamw_one(p.w, mi.w, vi.w, g.w, decay_at(e + 3, cursor, runs, k), k);
    reinterpret_cast<float4*>(param)[i] = p;
    reinterpret_cast<float4*>(m)[i] = mi;
    reinterpret_cast<float4*>(v)[i] = vi;
    if (copy != nullptr) {
      reinterpret_cast<uint2*>(copy)[i] =
          make_uint2(bf16_bits(p.x) | (uint32_t{bf16_bits(p.y)} << 16),
                     bf16_bits(p.z) | (uint32_t{bf16_bits(p.w)} << 16));
    }
  }
  for (int64_t i = 4 * n4 + t; i < n; i += stride) {
    adamw_one(param[i], m[i], v[i], grad[i], decay_at(i, cursor, runs, k), k);
    if (copy != nullptr) copy[i] = bf16_bits(param[i]);
  }
}

AdamWScalars scalars_of(const AdamWParams& hp, double grad_scale) {
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  return {static_cast<float>(1.0 - hp.lr * hp.weight_decay),
          static_cast<float>(hp.beta1),
          static_cast<float>(1.0 - hp.beta1),
          static_cast<float>(hp.beta2),
          static_cast<float>(1.0 - hp.beta2),
          static_cast<float>(hp.lr / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(hp.eps),
          static_cast<float>(grad_scale)};
}

// Elements [begin, begin + n) of the buffers in one launch; runs' bounds are relative to begin.
void launch_flat(float* param, float* m, float* v, const float* grad, uint16_t* copy, int64_t begin,
                 int64_t n, const AdamWScalars& k, const DecayRuns& runs) {
  if (n == 0) return;
  param += begin;
  m += begin;
  v += begin;
  grad += begin;
  if (copy != nullptr) copy += begin;
  const bool vec = aligned16(param) && aligned16(m) && aligned16(v) && aligned16(grad) &&
                   reinterpret_cast<uintptr_t>(copy) % 8 == 0;
  const int64_t n4 = vec ? n / 4 : 0;
  adamw_flat_kernel<<<blocks_for(n4 > 0 ? n4 : n, kThreads), kThreads, 0, stream()>>>(
      param, m, v, grad, copy, n, n4, k, runs);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWParams& hp) {
  const char* op = "adamw_step";
  expect_cuda_rank(op, "param", param, {DType::kF32}, -1);
  expect_cuda(op, "grad", grad, {DType::kF32}, param.shape());
  expect_cuda(op, "m", m, {DType::kF32}, param.shape());
  expect_cuda(op, "v", v, {DType::kF32}, param.shape());
  TANDEM_CHECK(hp.step >= 1, op, ": step is ", hp.step, ", expected at least 1");
  DecayRuns all{};
  all.parity = 1;  // every element decays
  launch_flat(param.data<float>(), m.data<float>(), v.data<float>(), grad.data<float>(), nullptr, 0,
              param.numel(), scalars_of(hp, 1.0), all);
}

void adamw_step_flat(const Tensor& param, const Tensor& m, const Tensor& v,
                     const Tensor& param_bf16, const Tensor& grad,
                     const std::vector<int64_t>& decayed, double grad_scale,
                     const AdamWParams& hp) {
  const char* op = "adamw_step_flat";
  expect_cuda_rank(op, "param", param, {DType::kF32}, 1);
  expect_cuda(op, "m", m, {DType::kF32}, param.shape());
  expect_cuda(op, "v", v, {DType::kF32}, param.shape());
  expect_cuda(op, "grad", grad, {DType::kF32}, param.shape());
  if (param_bf16.defined()) {
    expect_cuda(op, "param_bf16", param_bf16, {DType::kBF16}, param.shape());
  }
  TANDEM_CHECK(hp.step >= 1, op, ": step is ", hp.step, ", expected at least 1");
  const int64_t n = param.numel();
  const AdamWScalars k = scalars_of(hp, grad_scale);
  float* pp = param.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  const float* pg = grad.data<float>();
  uint16_t* pc = param_bf16.defined() ? static_cast<uint16_t*>(param_bf16.raw_data()) : nullptr;
  DecayRuns runs{};
  if (decayed.size() <= static_cast<size_t>(kMaxBounds)) {
    for (size_t i = 0; i < decayed.size(); ++i) runs.bound[i] = decayed[i];
    runs.count = static_cast<int>(decayed.size());
    launch_flat(pp, pm, pv, pg, pc, 0, n, k, runs);
    return;
  }
  int64_t at = 0;  // Note [Flat AdamW]: too many bounds for one launch; one per run
  for (size_t r = 0; r <= decayed.size(); ++r) {
    const int64_t end = r < decayed.size() ? decayed[r] : n;
    runs.parity = static_cast<int>(r % 2);
    launch_flat(pp, pm, pv, pg, pc, at, end - at, k, runs);
    at = end;
  }
}

}  // namespace tandem::ops::cuda
