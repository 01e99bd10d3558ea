// CPU reference of the LM head fused with cross-entropy (ops.h): blocks of rows, each block's
// logits formed, reduced and dropped before the next, so the [N, V] logits never exist whole.
// Also dtype conversion (f32, f64, bf16 on the host).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"

namespace tandem::ops::cpu {

namespace {

constexpr int64_t kBlockRows = 256;

struct LmHeadDims {
  int64_t n, h, v;
  DType dt;
};

LmHeadDims check_lm_head(const char* op, const Tensor& lse, const Tensor& x, const Tensor& w,
                         const Tensor& targets) {
  const DType dt = float_dtype(op, "x", x, 2);
  const int64_t n = x.size(0), h = x.size(1);
  expect_rank(op, "w", w, 2);
  const int64_t v = w.size(0);
  expect(op, "w", w, dt, {v, h});
  if (lse.dtype() != dt)
    expect(op, "lse", lse, DType::kF32, {n});  // f32, or x's dtype
  else
    expect(op, "lse", lse, dt, {n});
  expect(op, "targets", targets, DType::kI32, {n});
  expect_indices(op, "target", targets.data<int32_t>(), n, v);
  return {n, h, v, dt};
}

// lm_head_ce_forward over the rows whose mask is 1 (mask null: every row); lse of every row.
double forward_rows(const LmHeadDims& d, const Tensor& lse, const Tensor& x, const Tensor& w,
                    const Tensor& targets, const float* mask) {
  const int32_t* pt = targets.data<int32_t>();
  return dispatch_float(d.dt, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> logits(static_cast<size_t>(std::min(kBlockRows, d.n) * d.v));
    double loss = 0;
    for (int64_t r0 = 0; r0 < d.n; r0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, d.n - r0);
      gemm(Trans::kNo, Trans::kYes, rows, d.v, d.h, T(1), x.data<T>() + r0 * d.h, d.h, w.data<T>(),
           d.h, T(0), logits.data(), d.v);
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = logits.data() + r * d.v;
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < d.v; ++j) mx = std::max(mx, static_cast<double>(row[j]));
        for (int64_t j = 0; j < d.v; ++j) s += std::exp(static_cast<double>(row[j]) - mx);
        const double l = mx + std::log(s);
        if (lse.dtype() == DType::kF32)
          lse.data<float>()[r0 + r] = static_cast<float>(l);
        else
          lse.data<T>()[r0 + r] = static_cast<T>(l);
        if (mask == nullptr || mask[r0 + r] != 0.0f)
          loss += l - static_cast<double>(row[pt[r0 + r]]);
      }
    }
    return loss;
  });
}

// lm_head_ce_backward with the dlogits of the rows whose mask is 0 zero (mask null: none).
void backward_rows(const char* op, const LmHeadDims& d, const Tensor& dx, const Tensor& dw,
                   const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& lse,
                   double scale, Accumulate acc_dw, const float* mask) {
  expect(op, "dx", dx, d.dt, {d.n, d.h});
  expect(op, "dw", dw, d.dt, {d.v, d.h});
  const int32_t* pt = targets.data<int32_t>();
  dispatch_float(d.dt, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> dlogits(static_cast<size_t>(std::min(kBlockRows, d.n) * d.v));
    bool dw_started = acc_dw == Accumulate::kAdd;
    if (!dw_started && d.n == 0) dw.zero_();
    for (int64_t r0 = 0; r0 < d.n; r0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, d.n - r0);
      const T* xb = x.data<T>() + r0 * d.h;
      gemm(Trans::kNo, Trans::kYes, rows, d.v, d.h, T(1), xb, d.h, w.data<T>(), d.h, T(0),
           dlogits.data(), d.v);
      for (int64_t r = 0; r < rows; ++r) {
        T* row = dlogits.data() + r * d.v;
        const double l = lse.dtype() == DType::kF32 ? double(lse.data<float>()[r0 + r])
                                                    : double(lse.data<T>()[r0 + r]);
        const bool kept = mask == nullptr || mask[r0 + r] != 0.0f;
        for (int64_t j = 0; j < d.v; ++j) {
          const double p = std::exp(static_cast<double>(row[j]) - l);
          row[j] = kept ? static_cast<T>((p - (j == pt[r0 + r] ? 1.0 : 0.0)) * scale) : T(0);
        }
      }
      gemm(Trans::kNo, Trans::kNo, rows, d.h, d.v, T(1), dlogits.data(), d.v, w.data<T>(), d.h,
           T(0), dx.data<T>() + r0 * d.h, d.h);
      gemm(Trans::kYes, Trans::kNo, d.v, d.h, rows, T(1), dlogits.data(), d.v, xb, d.h,
           dw_started ? T(1) : T(0), dw.data<T>(), d.h);
      dw_started = true;
    }
  });
}

}  // namespace

double lm_head_ce_forward(const Tensor& lse, const Tensor& x, const Tensor& w,
                          const Tensor& targets) {
  const LmHeadDims d = check_lm_head("lm_head_ce_forward", lse, x, w, targets);
  return forward_rows(d, lse, x, w, targets, nullptr);
}

void lm_head_ce_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                         const Tensor& targets, const Tensor& lse, double scale,
                         Accumulate acc_dw) {
  const char* op = "lm_head_ce_backward";
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  backward_rows(op, d, dx, dw, x, w, targets, lse, scale, acc_dw, nullptr);
}

PendingScalar lm_head_ce_forward_backward(const Tensor& dx, const Tensor& dw, const Tensor& lse,
                                          const Tensor& x, const Tensor& w, const Tensor& targets,
                                          double scale, Accumulate acc_dw) {
  // The reference composes the two (the GPU shares one product per block between them).
  const double loss = cpu::lm_head_ce_forward(lse, x, w, targets);
  cpu::lm_head_ce_backward(dx, dw, x, w, targets, lse, scale, acc_dw);
  return PendingScalar(loss);
}

double lm_head_ce_forward_masked(const Tensor& lse, const Tensor& x, const Tensor& w,
                                 const Tensor& targets, const Tensor& loss_mask) {
  const char* op = "lm_head_ce_forward";
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  return forward_rows(d, lse, x, w, targets, expect_loss_mask(op, loss_mask, d.n));
}

void lm_head_ce_backward_masked(const Tensor& dx, const Tensor& dw, const Tensor& x,
                                const Tensor& w, const Tensor& targets, const Tensor& lse,
                                double scale, const Tensor& loss_mask, Accumulate acc_dw) {
  const char* op = "lm_head_ce_backward";
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  backward_rows(op, d, dx, dw, x, w, targets, lse, scale, acc_dw,
                expect_loss_mask(op, loss_mask, d.n));
}

PendingScalar lm_head_ce_forward_backward_masked(const Tensor& dx, const Tensor& dw,
                                                 const Tensor& lse, const Tensor& x,
                                                 const Tensor& w, const Tensor& targets,
                                                 double scale, const Tensor& loss_mask,
                                                 Accumulate acc_dw) {
  const double loss = cpu::lm_head_ce_forward_masked(lse, x, w, targets, loss_mask);
  cpu::lm_head_ce_backward_masked(dx, dw, x, w, targets, lse, scale, loss_mask, acc_dw);
  return PendingScalar(loss);
}

void convert(const Tensor& dst, const Tensor& src) {
  const char* op = "convert";
  expect_rank(op, "dst", dst, -1);
  expect_rank(op, "src", src, -1);
  TANDEM_CHECK(dst.numel() == src.numel(), op, ": dst has ", dst.numel(), " elements, src ",
               src.numel());
  auto is_float = [](DType t) { return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16; };
  TANDEM_CHECK(is_float(dst.dtype()) && is_float(src.dtype()), op,
               ": converts between f32, f64 "
               "and bf16, not ",
               dtype_name(src.dtype()), " -> ", dtype_name(dst.dtype()));
  const int64_t n = src.numel();
  auto load = [&](int64_t i) -> double {
    switch (src.dtype()) {
      case DType::kF64:
        return src.data<double>()[i];
      case DType::kBF16:
        return bf16_to_float(src.data<BF16>()[i]);
      default:
        return src.data<float>()[i];
    }
  };
  for (int64_t i = 0; i < n; ++i) {
    const double v = load(i);
    switch (dst.dtype()) {
      case DType::kF64:
        dst.data<double>()[i] = v;
        break;
      case DType::kBF16:
        dst.data<BF16>()[i] = bf16_from_float(static_cast<float>(v));
        break;
      default:
        dst.data<float>()[i] = static_cast<float>(v);
        break;
    }
  }
}

}  // namespace tandem::ops::cpu
