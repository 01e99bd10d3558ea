// Helpers shared by the ops tests: seeded random tensors, flat copies, and fp64 central finite
// differences with one relative tolerance per comparison kind.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace tandem::ops::test {

// Analytic vs fp64 central difference (step kFdStep): max |a - n| / max |n|. The difference's
// own error is about 1e-16 * |loss| / h + h^2 |f'''| ~ 1e-9, far below this.
constexpr double kGradTol = 1e-6;
constexpr double kFdStep = 1e-6;
// f32 result vs the same op in f64, relative to the largest |f64| element.
constexpr double kF32Tol = 1e-5;
// Forward vs an independent naive fp64 reference (differences only from summation order).
constexpr double kF64Tol = 1e-12;

inline Tensor make(const Shape& shape, DType dt) {
  return Tensor::zeros(shape, dt, MemCategory::kOther, "test");
}

// Uniform values in [lo, hi) from the caller's seeded generator.
inline Tensor random(const Shape& shape, DType dt, std::mt19937_64& rng, double lo = -1.0,
                     double hi = 1.0) {
  Tensor t = make(shape, dt);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::kF64) {
      t.data<double>()[i] = u(rng);
    } else {
      t.data<float>()[i] = static_cast<float>(u(rng));
    }
  }
  return t;
}

inline Tensor i32(const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = make(shape, DType::kI32);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

inline Tensor f64(const Shape& shape, const std::vector<double>& v) {
  Tensor t = make(shape, DType::kF64);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

// Every element as double (f32, f64 or i32).
inline std::vector<double> values(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::kF64) {
      out[static_cast<size_t>(i)] = t.data<double>()[i];
    } else if (t.dtype() == DType::kF32) {
      out[static_cast<size_t>(i)] = t.data<float>()[i];
    } else {
      out[static_cast<size_t>(i)] = t.data<int32_t>()[i];
    }
  }
  return out;
}

// An f32 copy of an f64 tensor.
inline Tensor to_f32(const Tensor& t) {
  Tensor out = make(t.shape(), DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i)
    out.data<float>()[i] = static_cast<float>(t.data<double>()[i]);
  return out;
}

inline Tensor clone(const Tensor& t) {
  Tensor out = make(t.shape(), t.dtype());
  out.copy_from(t);
  return out;
}

// sum_i a_i * b_i of two f64 tensors: the scalar loss <out, upstream> of a gradient check.
inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// max |a - b| / max |b|; b is the reference.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m / std::max(max_abs(b), 1e-300);
}

// d loss / d x for every element of the f64 tensor x, by central differences; x is restored.
inline std::vector<double> numeric_grad(const Tensor& x, const std::function<double()>& loss) {
  std::vector<double> g(static_cast<size_t>(x.numel()));
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double keep = p[i];
    p[i] = keep + kFdStep;
    const double up = loss();
    p[i] = keep - kFdStep;
    const double down = loss();
    p[i] = keep;
    g[static_cast<size_t>(i)] = (up - down) / (2 * kFdStep);
  }
  return g;
}

// The analytic gradient matches the numeric one, and the numeric one is not trivially small (so
// the comparison could fail).
inline void expect_grad(const Tensor& analytic, const std::vector<double>& numeric,
                        const char* what) {
  EXPECT_GT(max_abs(numeric), 1e-3) << what << ": numeric gradient is ~0, the check is vacuous";
  EXPECT_LE(rel_err(values(analytic), numeric), kGradTol) << what;
}

// An f32 result matches its f64 counterpart.
inline void expect_f32_close(const Tensor& f32_result, const Tensor& f64_result, const char* what) {
  EXPECT_GT(max_abs(values(f64_result)), 0.0) << what;
  EXPECT_LE(rel_err(values(f32_result), values(f64_result)), kF32Tol) << what;
}

}  // namespace tandem::ops::test
