// CPU linear layers without bias through BLAS; weights [out, in] as Hugging Face stores them.
// M may be 0 (an expert that received no token): kOverwrite then still zeroes the output.
#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/row_blocks.h"

namespace tandem::ops::cpu {

using cpu::expect;
using cpu::Trans;

namespace {
double beta_of(Accumulate acc) { return acc == Accumulate::kAdd ? 1.0 : 0.0; }
}  // namespace

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, Accumulate acc) {
  const char* op = "linear_forward";
  const DType dt = cpu::float_dtype(op, "w", w, 2);
  const int64_t out = w.size(0), in = w.size(1);
  cpu::float_dtype(op, "x", x, 2);
  const int64_t m = x.size(0);
  expect(op, "x", x, dt, {m, in});
  expect(op, "y", y, dt, {m, out});
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    // y[M, out] = x[M, in] @ w^T.
    cpu::gemm(Trans::kNo, Trans::kYes, m, out, in, T(1), x.data<T>(), in, w.data<T>(), in,
              static_cast<T>(beta_of(acc)), y.data<T>(), out);
  });
}

void linear_forward_residual(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& r) {
  expect("linear_forward_residual", "r", r, y.dtype(), y.shape());
  if (r.raw_data() != y.raw_data()) y.copy_from(r);
  cpu::linear_forward(y, x, w, Accumulate::kAdd);
}

void linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w, Accumulate acc) {
  const char* op = "linear_backward_input";
  const DType dt = cpu::float_dtype(op, "w", w, 2);
  const int64_t out = w.size(0), in = w.size(1);
  cpu::float_dtype(op, "dy", dy, 2);
  const int64_t m = dy.size(0);
  expect(op, "dy", dy, dt, {m, out});
  expect(op, "dx", dx, dt, {m, in});
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    // dx[M, in] = dy[M, out] @ w[out, in].
    cpu::gemm(Trans::kNo, Trans::kNo, m, in, out, T(1), dy.data<T>(), out, w.data<T>(), in,
              static_cast<T>(beta_of(acc)), dx.data<T>(), in);
  });
}

void linear_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, Accumulate acc) {
  const char* op = "linear_backward_weight";
  const DType dt = cpu::float_dtype(op, "dw", dw, 2);
  const int64_t out = dw.size(0), in = dw.size(1);
  cpu::float_dtype(op, "x", x, 2);
  const int64_t m = x.size(0);
  expect(op, "x", x, dt, {m, in});
  expect(op, "dy", dy, dt, {m, out});
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    // dw[out, in] = dy^T[out, M] @ x[M, in].
    cpu::gemm(Trans::kYes, Trans::kNo, out, in, m, T(1), dy.data<T>(), out, x.data<T>(), in,
              static_cast<T>(beta_of(acc)), dw.data<T>(), in);
  });
}

// The blocks one after another (Note [Grouped expert products] in ops.h).
void grouped_linear_forward(const Tensor& y, const Tensor& x, const std::vector<Tensor>& w,
                            const std::vector<int32_t>& rows) {
  const std::vector<int64_t> starts =
      grouped_block_starts("grouped_linear_forward", rows, w.size(), x.size(0));
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    cpu::linear_forward(y.narrow_rows(starts[e], rows[e]), x.narrow_rows(starts[e], rows[e]), w[e],
                        Accumulate::kOverwrite);
  }
}

void grouped_linear_backward_input(const Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w,
                                   const std::vector<int32_t>& rows) {
  const std::vector<int64_t> starts =
      grouped_block_starts("grouped_linear_backward_input", rows, w.size(), dy.size(0));
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    cpu::linear_backward_input(dx.narrow_rows(starts[e], rows[e]),
                               dy.narrow_rows(starts[e], rows[e]), w[e], Accumulate::kOverwrite);
  }
}

}  // namespace tandem::ops::cpu
