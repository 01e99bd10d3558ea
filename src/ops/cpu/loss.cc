// CPU cross-entropy over the vocabulary: a numerically stable log-sum-exp per row, reduced in
// double and in row order (bitwise reproducible).
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

}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets) {
  const DType dt = check_ce("cross_entropy_forward", logits, targets);
  const int64_t n = logits.size(0), v = logits.size(1);
  const int32_t* pt = targets.data<int32_t>();
  return cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.data<T>();
    double loss = 0;
    for (int64_t r = 0; r < n; ++r) {
      const T* row = pl + r * v;
      loss += row_logsumexp(row, v) - static_cast<double>(row[pt[r]]);
    }
    return loss;
  });
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

}  // namespace tandem::ops::cpu
