// An experts node's products as cuBLAS grouped calls (Note [Grouped expert products] in ops.h):
// row block e of the operands with expert e's weight, every expert with rows one group of one
// problem, one cublasGemmGroupedBatchedEx a product. bf16 operands and outputs, fp32 accumulation
// (cuBLAS's grouped call takes no f32 output for bf16 operands).
#include <cublas_v2.h>

#include <vector>

#include "core/cuda/check.h"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/scratch.h"
#include "ops/row_blocks.h"

namespace tandem::ops::cuda {

namespace {

// One cuBLAS handle per host thread (a handle is not safe to share between threads issuing at
// once); its stream is set before each call.
cublasHandle_t blas_handle() {
  thread_local const cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    TANDEM_CUBLAS_CHECK(cublasCreate(&h));
    return h;
  }();
  return handle;
}

// The problems of one grouped call, column-major as cuBLAS sees them (gemm.cc's mapping: a
// row-major [r, c] matrix is the column-major [c, r] one with the same leading dimension).
struct Grouped {
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, one;
  std::vector<float> alpha, beta;
  std::vector<const void*> a, b;
  std::vector<void*> c;

  void add(cublasOperation_t op_a, cublasOperation_t op_b, int64_t rows_m, int64_t cols_n,
           int64_t inner, const void* pa, int64_t la, const void* pb, int64_t lb, void* pc,
           int64_t lc) {
    ta.push_back(op_a);
    tb.push_back(op_b);
    m.push_back(static_cast<int>(rows_m));
    n.push_back(static_cast<int>(cols_n));
    k.push_back(static_cast<int>(inner));
    lda.push_back(static_cast<int>(la));
    ldb.push_back(static_cast<int>(lb));
    ldc.push_back(static_cast<int>(lc));
    one.push_back(1);
    alpha.push_back(1.0f);
    beta.push_back(0.0f);
    a.push_back(pa);
    b.push_back(pb);
    c.push_back(pc);
  }

  // The pointer arrays go to the device through the op scratch (Note [Op scratch]); the copy
  // is ordered on the stream before the call that reads them. cuBLAS's grouped kernels load
  // 16-byte vectors from every group's matrices once the first group's allow it, so a call with
  // any matrix off a 16-byte boundary (a weight after a parameter of odd length in the flat
  // buffer, say) runs its problems one cublasGemmEx each instead.
  void run(const char* op) const {
    const size_t count = a.size();
    if (count == 0) return;
    const cublasHandle_t h = blas_handle();
    TANDEM_CUBLAS_CHECK(cublasSetStream(h, stream()));
    bool aligned = true;
    for (size_t i = 0; i < count; ++i)
      aligned = aligned && aligned16(a[i]) && aligned16(b[i]) && aligned16(c[i]);
    if (!aligned) {
      for (size_t i = 0; i < count; ++i) {
        TANDEM_CUBLAS_CHECK(cublasGemmEx(h, ta[i], tb[i], m[i], n[i], k[i], &alpha[i], a[i],
                                         CUDA_R_16BF, lda[i], b[i], CUDA_R_16BF, ldb[i], &beta[i],
                                         c[i], CUDA_R_16BF, ldc[i], CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
      }
      return;
    }
    Scratch scratch(op);
    void** ptrs = scratch.take<void*>(static_cast<int64_t>(3 * count));
    std::vector<const void*> all(a);
    all.insert(all.end(), b.begin(), b.end());
    all.insert(all.end(), c.begin(), c.end());
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(ptrs, all.data(), all.size() * sizeof(void*),
                                      cudaMemcpyHostToDevice, stream()));
    TANDEM_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
        reinterpret_cast<const void* const*>(ptrs), CUDA_R_16BF, lda.data(),
        reinterpret_cast<const void* const*>(ptrs + count), CUDA_R_16BF, ldb.data(), beta.data(),
        ptrs + 2 * count, CUDA_R_16BF, ldc.data(), static_cast<int>(count), one.data(),
        CUBLAS_COMPUTE_32F));
  }
};

// grouped_block_starts (ops/row_blocks.h), and each weight [out, in] bf16 on the GPU.
std::vector<int64_t> block_starts(const char* op, const std::vector<int32_t>& rows, int64_t total,
                                  const std::vector<Tensor>& w, int64_t out, int64_t in) {
  for (const Tensor& we : w) expect_cuda(op, "w", we, {DType::kBF16}, {out, in});
  return grouped_block_starts(op, rows, w.size(), total);
}

const char* row_bytes(const Tensor& t, int64_t row) {
  return static_cast<const char*>(t.raw_data()) + row * t.size(1) * dtype_size(t.dtype());
}

}  // namespace

void grouped_linear_forward(const Tensor& y, const Tensor& x, const std::vector<Tensor>& w,
                            const std::vector<int32_t>& rows) {
  const char* op = "grouped_linear_forward";
  if (w.empty()) return;
  expect_cuda_rank(op, "x", x, {DType::kBF16}, 2);
  const int64_t out = w[0].size(0), in = w[0].size(1), total = x.size(0);
  expect_cuda(op, "x", x, {DType::kBF16}, {total, in});
  expect_cuda(op, "y", y, {DType::kBF16}, {total, out});
  const std::vector<int64_t> starts = block_starts(op, rows, total, w, out, in);
  Grouped g;
  // y_e^T [out, r] = W_e (column-major [in, out], transposed) x_e^T (column-major [in, r]).
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    g.add(CUBLAS_OP_T, CUBLAS_OP_N, out, rows[e], in, w[e].raw_data(), in, row_bytes(x, starts[e]),
          in, const_cast<char*>(row_bytes(y, starts[e])), out);
  }
  g.run(op);
}

void grouped_linear_backward_input(const Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w,
                                   const std::vector<int32_t>& rows) {
  const char* op = "grouped_linear_backward_input";
  if (w.empty()) return;
  expect_cuda_rank(op, "dy", dy, {DType::kBF16}, 2);
  const int64_t out = w[0].size(0), in = w[0].size(1), total = dy.size(0);
  expect_cuda(op, "dy", dy, {DType::kBF16}, {total, out});
  expect_cuda(op, "dx", dx, {DType::kBF16}, {total, in});
  const std::vector<int64_t> starts = block_starts(op, rows, total, w, out, in);
  Grouped g;
  // dx_e^T [in, r] = W_e (column-major [in, out]) dy_e^T (column-major [out, r]).
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    g.add(CUBLAS_OP_N, CUBLAS_OP_N, in, rows[e], out, w[e].raw_data(), in, row_bytes(dy, starts[e]),
          out, const_cast<char*>(row_bytes(dx, starts[e])), in);
  }
  g.run(op);
}

}  // namespace tandem::ops::cuda
