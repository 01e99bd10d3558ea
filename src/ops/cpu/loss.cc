// CPU cross-entropy over the vocabulary: a numerically stable log-sum-exp per row, reduced in
// double and in row order (bitwise reproducible).
#include <algorithm>
#include <cmath>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"

namespace tandem::ops::cpu {
namespace {

// log(sum_j exp(row[j])) over one row of v logits, in double.
template <typename T>
double row_logsumexp(const T* row, int64_t v) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < v; ++j)
    mx = row[j] > mx ? static_cast<double>(row[j]) : mx;  // NaN skipped
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(static_cast<double>(row[j]) - mx);
  return mx + std::log(s);
}

// Checks logits [N, V] and targets [N] i32 (every target in [0, V)); returns the float dtype.
DType check_ce(const char* op, const Tensor& logits, const Tensor& targets) {
  const DType dt = cpu::float_dtype(op, "logits", logits, 2);
  cpu::expect(op, "targets", targets, DType::kI32, {logits.size(0)});
  cpu::expect_indices(op, "target", targets.data<int32_t>(), logits.size(0), logits.size(1));
  return dt;
}

// The summed cross-entropy of the rows of logits (checked by check_ce, of dtype dt) whose mask is
// 1; mask null: every row.
double cross_entropy_sum(DType dt, const Tensor& logits, const Tensor& targets, const float* mask) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const int32_t* pt = targets.data<int32_t>();
  return cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.data<T>();
    double loss = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (mask != nullptr && mask[r] == 0.0f) continue;
      const T* row = pl + r * v;
      loss += row_logsumexp(row, v) - static_cast<double>(row[pt[r]]);
    }
    return loss;
  });
}

}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets) {
  const DType dt = check_ce("cross_entropy_forward", logits, targets);
  return cross_entropy_sum(dt, logits, targets, nullptr);
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            double scale) {
  const char* op = "cross_entropy_backward";
  const DType dt = check_ce(op, logits, targets);
  cpu::expect(op, "dlogits", dlogits, dt, logits.shape());
  const int64_t n = logits.size(0), v = logits.size(1);
  const int32_t* pt = targets.data<int32_t>();
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.data<T>();
    T* pd = dlogits.data<T>();
    for (int64_t r = 0; r < n; ++r) {
      const T* row = pl + r * v;
      T* drow = pd + r * v;
      const double lse = row_logsumexp(row, v);
      // Each element is read before it is written, so dlogits may alias logits.
      for (int64_t j = 0; j < v; ++j) {
        const double p = std::exp(static_cast<double>(row[j]) - lse);
        drow[j] = static_cast<T>((p - (j == pt[r] ? 1.0 : 0.0)) * scale);
      }
    }
  });
}

double cross_entropy_forward_masked(const Tensor& logits, const Tensor& targets,
                                    const Tensor& loss_mask) {
  const char* op = "cross_entropy_forward";
  const DType dt = check_ce(op, logits, targets);
  return cross_entropy_sum(dt, logits, targets,
                           cpu::expect_loss_mask(op, loss_mask, logits.size(0)));
}

void cross_entropy_backward_masked(const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, double scale, const Tensor& loss_mask) {
  const char* op = "cross_entropy_backward";
  const DType dt = check_ce(op, logits, targets);
  const float* m = cpu::expect_loss_mask(op, loss_mask, logits.size(0));
  cross_entropy_backward(dlogits, logits, targets, scale);
  const int64_t v = logits.size(1);
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t r = 0; r < logits.size(0); ++r) {
      if (m[r] == 0.0f) std::fill(dlogits.data<T>() + r * v, dlogits.data<T>() + (r + 1) * v, T(0));
    }
  });
}

}  // namespace tandem::ops::cpu
