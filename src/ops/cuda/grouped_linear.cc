// An experts node's products as cuBLAS grouped calls (Note [Grouped expert products] in ops.h):
// row block e of the operands with expert e's weight. The experts' first rows, as many for each
// as most of them have, go to one batched call of one shape, the rest to one grouped call
// (Note [Batched bulk of the experts' products]). bf16 operands and outputs, fp32 accumulation
// (cuBLAS's grouped call takes no f32 output for bf16 operands).
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/cuda/check.h"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/gemm.h"
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

// Note [Batched bulk of the experts' products]: cuBLAS's grouped call runs its problems (one per
// expert, sizes differing by the rows) on kernels slower than the ones it picks for many
// problems of one shape (cublasGemmBatchedEx): at shape (c)'s 128 experts of about 256 rows the
// grouped forward reached about a third of the matrix rate (bench/results/families.md). So the
// rows are split in two calls: a common count n, chosen to cover the most rows (n times the
// experts with at least n rows; rounded down where a remainder would start off a 16-byte
// boundary), of the first rows of every expert with at least n, in one
// batched call; each expert's remaining rows (all of them for experts with fewer than n) in one
// grouped call. Every output row is one problem's column either way, formed from the same row
// and weight; only the kernel, so the summation order, depends on the split.
// The batched call goes through cuBLASLt's pointer-array mode (gemm_batched in gemm.h), whose
// algorithm we choose once per bucket of row counts and experts: cuBLAS's own batched call
// (cublasGemmBatchedEx) ran a heuristic query for every shape it had not met, and the row
// counts are new every micro-batch and layer, and such a call also waited for the stream.
// Issued behind 300 ms of held-back work, 20 calls with new counts took the host 15.6 ms each
// (the whole hold), against 0.05 ms through gemm_batched (`expert_gemm_timing`, "counts new
// each call"; bench/results/families.md). The experts' node is issued right after the host
// reads the routing counts, with the GPU idle (Note [Routing counts on the host] in
// model/nodes.h), so the host's time here was the GPU's.

// The products of one grouped-products op, column-major as cuBLAS sees them (gemm.cc's mapping:
// a row-major [r, c] matrix is the column-major [c, r] one with the same leading dimension):
// every problem is op_a(A_e) [m, k] times op_b(B_e) [k, cols_e] into C_e [m, cols_e], one shape
// but for the columns (an expert's rows), A the expert's weight.
struct Products {
  cublasOperation_t ta, tb;
  int64_t m, k, lda, ldb, ldc;
  std::vector<const char*> a, b;
  std::vector<char*> c;
  std::vector<int64_t> cols;

  void add(const void* pa, const void* pb, void* pc, int64_t n) {
    a.push_back(static_cast<const char*>(pa));
    b.push_back(static_cast<const char*>(pb));
    c.push_back(static_cast<char*>(pc));
    cols.push_back(n);
  }

  // The common count of Note [Batched bulk of the experts' products]: the n maximizing n times
  // the problems with at least n columns (0 when no problem has any).
  // With the counts in descending order the i-th is n for at least i + 1 problems (exactly, at
  // its last repeat); the first n of the largest cover wins a tie. The host issues this node
  // with the GPU idle (Note [Routing counts on the host]), so no quadratic pass over the experts.
  int64_t bulk_cols() const {
    std::vector<int64_t> desc(cols);
    std::sort(desc.begin(), desc.end(), std::greater<>());
    int64_t best = 0, covered = 0;
    for (size_t i = 0; i < desc.size(); ++i) {
      const int64_t n = desc[i], cover = n * static_cast<int64_t>(i + 1);
      if (cover > covered) {
        covered = cover;
        best = n;
      }
    }
    return best;
  }

  // The pointer arrays go to the device through the op scratch (Note [Op scratch]); the copy
  // is ordered on the stream before the call that reads them. cuBLAS's grouped and batched
  // kernels load 16-byte vectors from every problem's matrices once the first one's allow it,
  // so with any matrix off a 16-byte boundary (a weight after a parameter of odd length in the
  // flat buffer, say) the problems run one cublasGemmEx each instead.
  void run(const char* op) const {
    const size_t count = a.size();
    if (count == 0) return;
    const cublasHandle_t h = blas_handle();
    TANDEM_CUBLAS_CHECK(cublasSetStream(h, stream()));
    const float one = 1.0f, zero = 0.0f;
    bool aligned = true;
    for (size_t i = 0; i < count; ++i)
      aligned = aligned && aligned16(a[i]) && aligned16(b[i]) && aligned16(c[i]);
    if (!aligned) {
      for (size_t i = 0; i < count; ++i) {
        TANDEM_CUBLAS_CHECK(
            cublasGemmEx(h, ta, tb, static_cast<int>(m), static_cast<int>(cols[i]),
                         static_cast<int>(k), &one, a[i], CUDA_R_16BF, static_cast<int>(lda), b[i],
                         CUDA_R_16BF, static_cast<int>(ldb), &zero, c[i], CUDA_R_16BF,
                         static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      return;
    }
    // The remainders start `bulk` columns on, at B_e + bulk ldb and C_e + bulk ldc bf16: a count
    // that keeps them on 16-byte boundaries (as the check above found the problems' own).
    int64_t bulk = bulk_cols();
    while (bulk > 0 && ((bulk * ldb) % 8 != 0 || (bulk * ldc) % 8 != 0)) --bulk;
    const auto bf16_bytes = static_cast<int64_t>(sizeof(uint16_t));
    const int64_t b_step = bulk * ldb * bf16_bytes, c_step = bulk * ldc * bf16_bytes;
    std::vector<const void*> bulk_ptrs[3], rest_ptrs[3];
    std::vector<int> rest_cols;
    for (size_t i = 0; i < count; ++i) {
      int64_t first = 0;
      if (bulk > 0 && cols[i] >= bulk) {
        bulk_ptrs[0].push_back(a[i]);
        bulk_ptrs[1].push_back(b[i]);
        bulk_ptrs[2].push_back(c[i]);
        first = bulk;
      }
      if (cols[i] > first) {
        rest_ptrs[0].push_back(a[i]);
        rest_ptrs[1].push_back(first ? b[i] + b_step : b[i]);
        rest_ptrs[2].push_back(first ? c[i] + c_step : c[i]);
        rest_cols.push_back(static_cast<int>(cols[i] - first));
      }
    }
    const size_t batched = bulk_ptrs[0].size(), grouped = rest_ptrs[0].size();
    // Six arrays, each on a 256-byte boundary (padded to 32 pointers), in the front of the
    // stream's workspace that gemm_batched leaves to its caller (kPointerArrayBytes).
    const auto padded = [](size_t n) { return (n + 31) / 32 * 32; };
    const size_t stride[2] = {padded(batched), padded(grouped)};
    std::vector<const void*> all;
    for (const auto* part : {bulk_ptrs, rest_ptrs}) {
      for (int j = 0; j < 3; ++j) {
        all.insert(all.end(), part[j].begin(), part[j].end());
        all.resize(padded(all.size()), nullptr);
      }
    }
    TANDEM_CHECK(all.size() * sizeof(void*) <= kPointerArrayBytes, op, ": ", count,
                 " experts' pointer arrays exceed the ", kPointerArrayBytes,
                 " bytes the workspace keeps for them");
    Scratch scratch(op);
    void** ptrs = scratch.take<void*>(static_cast<int64_t>(all.size()));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(ptrs, all.data(), all.size() * sizeof(void*),
                                      cudaMemcpyHostToDevice, stream()));
    const auto arrays = [](void** base, size_t n, int j) {
      return reinterpret_cast<const void* const*>(base + j * n);
    };
    if (batched > 0) {
      // gemm_batched is row-major (gemm.h): the column-major C_e [m, n] = op(A_e) op(B_e) is the
      // row-major C_e^T [n, m] = op(B_e)^T op(A_e)^T, so its A is our B (the rows) and its B
      // our A (the weight), each with its transpose.
      const auto row_major = [](cublasOperation_t t) {
        return t == CUBLAS_OP_T ? Trans::kYes : Trans::kNo;
      };
      gemm_batched(row_major(tb), row_major(ta), bulk, m, k, arrays(ptrs, stride[0], 1), ldb,
                   arrays(ptrs, stride[0], 0), lda, ptrs + 2 * stride[0], ldc,
                   static_cast<int64_t>(batched));
    }
    if (grouped == 0) return;
    void** rest = ptrs + 3 * stride[0];
    const auto same = [grouped](auto v) { return std::vector<decltype(v)>(grouped, v); };
    const std::vector<cublasOperation_t> tas = same(ta), tbs = same(tb);
    const std::vector<int> ms = same(static_cast<int>(m)), ks = same(static_cast<int>(k)),
                           ldas = same(static_cast<int>(lda)), ldbs = same(static_cast<int>(ldb)),
                           ldcs = same(static_cast<int>(ldc)), ones = same(1);
    const std::vector<float> alphas = same(1.0f), betas = same(0.0f);
    TANDEM_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        h, tas.data(), tbs.data(), ms.data(), rest_cols.data(), ks.data(), alphas.data(),
        arrays(rest, stride[1], 0), CUDA_R_16BF, ldas.data(), arrays(rest, stride[1], 1),
        CUDA_R_16BF, ldbs.data(), betas.data(), rest + 2 * stride[1], CUDA_R_16BF, ldcs.data(),
        static_cast<int>(grouped), ones.data(), CUBLAS_COMPUTE_32F));
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
  // y_e^T [out, r] = W_e (column-major [in, out], transposed) x_e^T (column-major [in, r]).
  Products p{CUBLAS_OP_T, CUBLAS_OP_N, out, in, in, in, out, {}, {}, {}, {}};
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    p.add(w[e].raw_data(), row_bytes(x, starts[e]), const_cast<char*>(row_bytes(y, starts[e])),
          rows[e]);
  }
  p.run(op);
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
  // dx_e^T [in, r] = W_e (column-major [in, out]) dy_e^T (column-major [out, r]).
  Products p{CUBLAS_OP_N, CUBLAS_OP_N, in, out, in, out, in, {}, {}, {}, {}};
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    p.add(w[e].raw_data(), row_bytes(dy, starts[e]), const_cast<char*>(row_bytes(dx, starts[e])),
          rows[e]);
  }
  p.run(op);
}

}  // namespace tandem::ops::cuda
