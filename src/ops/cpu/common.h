// Shared pieces of the CPU reference ops: argument checks that throw tandem::Error naming the op
// and the tensor, f32/f64 dispatch, and a row-major BLAS gemm wrapper. Private to src/ops/cpu.
#pragma once

#include <cblas.h>

#include <climits>
#include <cstdint>

#include "core/tensor.h"

namespace tandem::ops::cpu {

// Throws unless `t` is a defined CPU tensor of rank `rank` (any rank when negative); its dtype
// is not checked here.
void expect_rank(const char* op, const char* name, const Tensor& t, int64_t rank);
// Throws unless `t` is a defined CPU f32 or f64 tensor of rank `rank` (any when negative);
// returns its dtype.
DType float_dtype(const char* op, const char* name, const Tensor& t, int64_t rank);
// Throws unless `t` is a defined CPU tensor of dtype `dtype` and exactly `shape`.
void expect(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& shape);
// Throws unless `v` is at least `lo` (sizes and counts passed as scalars).
void expect_at_least(const char* op, const char* name, int64_t v, int64_t lo);
// Throws unless every ids[n] (n < count) lies in [0, limit); the message names the bad value,
// its row and the valid range ("<op>: <what> 300 at row 5 is outside [0, 256)").
void expect_indices(const char* op, const char* what, const int32_t* ids, int64_t count,
                    int64_t limit);
// Throws unless loss_mask is f32 [n] of 0s and 1s (Note [Loss mask] in model/end_nodes.cc);
// returns its elements.
const float* expect_loss_mask(const char* op, const Tensor& loss_mask, int64_t n);

// Calls f(float{}) or f(double{}) for dtype (which float_dtype has checked); returns its result.
template <typename F>
decltype(auto) dispatch_float(DType dtype, F&& f) {
  if (dtype == DType::kF64) return f(double{});
  return f(float{});
}

// Row-major C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, with leading dimensions in
// elements. beta == 0 never reads C (so C may hold garbage). Sizes must fit BLAS's int.
enum class Trans : uint8_t { kNo, kYes };

inline int blas_int(int64_t v) {
  TANDEM_ASSERT(v >= 0 && v <= INT_MAX, "BLAS dimension ", v, " does not fit an int");
  return static_cast<int>(v);
}

inline CBLAS_TRANSPOSE blas_trans(Trans t) { return t == Trans::kYes ? CblasTrans : CblasNoTrans; }

// Handles the empty cases BLAS implementations disagree on: nothing to write, or k == 0
// (C = beta * C).
template <typename T>
bool gemm_trivial(int64_t m, int64_t n, int64_t k, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return true;
  if (k != 0) return false;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  }
  return true;
}

inline void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (gemm_trivial(m, n, k, beta, c, ldc)) return;
  cblas_sgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), blas_int(m), blas_int(n), blas_int(k),
              alpha, a, blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
}

inline void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (gemm_trivial(m, n, k, beta, c, ldc)) return;
  cblas_dgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), blas_int(m), blas_int(n), blas_int(k),
              alpha, a, blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
}

}  // namespace tandem::ops::cpu
