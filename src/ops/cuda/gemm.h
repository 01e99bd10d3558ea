// The one matrix product of the CUDA ops: a row-major cuBLASLt GEMM with bf16 operands, fp32
// accumulation and a bf16 or f32 result, enqueued on the current stream (Note [Current stream]).
// Descriptors and the heuristic's algorithm are cached per shape, so a repeated shape costs one
// map look-up. Private to src/ops/cuda.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tandem::ops::cuda {

enum class Trans : uint8_t { kNo, kYes };

// C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, all row-major.
//   a: bf16, stored [m, k] (kNo) or [k, m] (kYes), lda elements between its rows (>= its width);
//   b: bf16, stored [k, n] (kNo) or [n, k] (kYes), ldb likewise;
//   c: `c_dtype` (f32 or bf16), [m, n] with ldc >= n; read only when beta != 0;
//   c_in: when given, beta * c_in is added instead of beta * C (the same layout; c_in may be c),
//   so C = alpha op(A) op(B) + beta c_in.
// Accumulates in fp32 (CUBLAS_COMPUTE_32F); a bf16 C is rounded once, at the end (split-k
// partial sums stay fp32). m == 0 or n == 0 does nothing; k == 0 sets C = beta * C (beta 0 or 1
// only). Throws tandem::Error for a bad argument or when cuBLASLt has no algorithm for it.
void gemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          int64_t lda, const void* b, int64_t ldb, float beta, void* c, DType c_dtype, int64_t ldc,
          const void* c_in = nullptr);

// The front of the stream's cuBLASLt workspace that gemm_batched leaves alone, for its
// caller's pointer arrays (the op scratch, Note [Op scratch] in scratch.h).
constexpr size_t kPointerArrayBytes = size_t{64} << 10;

// C_i[m, n] = op(A_i)[m, k] @ op(B_i)[k, n] for i < batch, row-major as gemm(), bf16 C, no C
// read (beta 0): cuBLASLt's pointer-array batch mode. a, b and c are device arrays of `batch`
// pointers (each array on a 16-byte boundary), every matrix on a 16-byte boundary. cuBLASLt
// works in the stream's workspace past its first kPointerArrayBytes. The plan is cached per
// shape and batch, the algorithm per bucket of them (Note [Algorithm buckets] in gemm.cc), so a
// call with sizes not met before costs the host its layouts, not a heuristic query.
void gemm_batched(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k,
                  const void* const* a, int64_t lda, const void* const* b, int64_t ldb, void** c,
                  int64_t ldc, int64_t batch);

// Adds to count[0] (a device u32) the number of 32-bit words at which the device buffers a and
// b (`words` each) differ, on the current stream: how the tuner compares a candidate's output
// with the first choice's without copying either to the host (Note [Tuned algorithms]).
void count_differing_words(const void* a, const void* b, int64_t words, uint32_t* count);

// Rate of a bf16 [m, k] @ [k, n] product with a bf16 result on this GPU, in TFLOP/s (2mnk flops
// per product): `iters` products timed with CUDA events on the current stream after a warm-up.
// Allocates its operands (counted as other memory) and synchronises the current stream.
double measure_bf16_matmul_tflops(int64_t m, int64_t n, int64_t k, int iters);

}  // namespace tandem::ops::cuda
