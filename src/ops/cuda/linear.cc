// CUDA linear layers without bias: one cuBLASLt product each (gemm.h), bf16 operands, fp32
// accumulation, a bf16 or f32 result. Weights are [out, in] as Hugging Face stores them.
// M may be 0 (an expert that received no token); an empty reduction (M == 0 for the weight
// gradient, in == 0 or out == 0 for the others) overwrites with zeros or leaves an adding output.
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/gemm.h"

namespace tandem::ops::cuda {

namespace {
float beta_of(Accumulate acc) { return acc == Accumulate::kAdd ? 1.0f : 0.0f; }

// y[M, out] = x[M, in] @ w[out, in]^T + beta C, C being y itself or, given, r (cuBLASLt's C,
// with y written as its D).
void forward_product(const char* op, const Tensor& y, const Tensor& x, const Tensor& w, float beta,
                     const Tensor* r) {
  expect_cuda_rank(op, "w", w, {DType::kBF16}, 2);
  expect_cuda_rank(op, "x", x, {DType::kBF16}, 2);
  const int64_t out = w.size(0), in = w.size(1), m = x.size(0);
  expect_cuda(op, "x", x, {DType::kBF16}, {m, in});
  expect_cuda(op, "y", y, {DType::kBF16, DType::kF32}, {m, out});
  if (r != nullptr) expect_cuda(op, "r", *r, {y.dtype()}, {m, out});
  gemm(Trans::kNo, Trans::kYes, m, out, in, 1.0f, x.raw_data(), in, w.raw_data(), in, beta,
       y.raw_data(), y.dtype(), out, r != nullptr ? r->raw_data() : nullptr);
}
}  // namespace

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, Accumulate acc) {
  forward_product("linear_forward", y, x, w, beta_of(acc), nullptr);
}

void linear_forward_residual(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& r) {
  forward_product("linear_forward_residual", y, x, w, 1.0f, &r);
}

void linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w, Accumulate acc) {
  const char* op = "linear_backward_input";
  expect_cuda_rank(op, "w", w, {DType::kBF16}, 2);
  expect_cuda_rank(op, "dy", dy, {DType::kBF16}, 2);
  const int64_t out = w.size(0), in = w.size(1), m = dy.size(0);
  expect_cuda(op, "dy", dy, {DType::kBF16}, {m, out});
  expect_cuda(op, "dx", dx, {DType::kBF16, DType::kF32}, {m, in});
  // dx[M, in] = dy[M, out] @ w[out, in].
  gemm(Trans::kNo, Trans::kNo, m, in, out, 1.0f, dy.raw_data(), out, w.raw_data(), in, beta_of(acc),
       dx.raw_data(), dx.dtype(), in);
}

void linear_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, Accumulate acc) {
  const char* op = "linear_backward_weight";
  expect_cuda_rank(op, "dw", dw, {DType::kF32, DType::kBF16}, 2);
  expect_cuda_rank(op, "x", x, {DType::kBF16}, 2);
  const int64_t out = dw.size(0), in = dw.size(1), m = x.size(0);
  expect_cuda(op, "x", x, {DType::kBF16}, {m, in});
  expect_cuda(op, "dy", dy, {DType::kBF16}, {m, out});
  // dw[out, in] = dy^T[out, M] @ x[M, in]; dy is stored [M, out].
  gemm(Trans::kYes, Trans::kNo, out, in, m, 1.0f, dy.raw_data(), out, x.raw_data(), in,
       beta_of(acc), dw.raw_data(), dw.dtype(), in);
}

}  // namespace tandem::ops::cuda
