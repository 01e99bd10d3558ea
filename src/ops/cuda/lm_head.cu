// CUDA LM head fused with cross-entropy (ops.h): rows go in blocks; a block's logits are formed
// by cuBLASLt (fp32 accumulation, rounded once to bf16) into one workspace, reduced to the
// log-sum-exp (forward) or turned in place into bf16 dlogits (backward, Note [In-place dlogits];
// in one pass with the forward when a row fits in shared memory, Note [Fused loss rows]), and
// overwritten by the next block, so the [N, V] logits never exist. All the softmax math is fp32.
// Forward sums the row losses in double in a fixed order and reads the sum back with one copy.
// The row helpers shared with loss.cu are in rows.cuh.
//
// Why bf16 logits (as Megatron-LM's bf16 output layer feeding an fp32 cross-entropy): the block
// goes through HBM, so the product writes 2 bytes a logit instead of 4 and the loss kernel moves
// 4 instead of 6, and a row of 50304 takes 100 KB of shared memory, so two rows run per SM (Note
// [Fused loss rows]). The cost: a bf16 logit is off by up to 2^-8 |logit| (half an
// ulp; 0.06 at |logit| = 16), which moves each row's loss by about 2^-8 (|logit at the target| +
// the softmax mean of |logit|) at most and each softmax probability by a factor up to
// e^(2^-8 |logit| + that lse error), a few percent for the largest logits
// (Note [LM head tolerance] in tests/cuda/test_cuda_linear.cc holds the op to these bounds).
#include <cuda_bf16.h>
#include <cuda_pipeline_primitives.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>

#include "core/footprint.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/lm_head.h"
#include "ops/cuda/rows.cuh"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;  // per row
constexpr int kVec = 8;        // bf16 logits per 16-byte vector
// The planner sizes the block by core/footprint.h's element size; the kernels read bf16.
static_assert(kLmHeadLogitBytes == sizeof(bf16));

std::atomic<int64_t> g_block_rows_for_testing{0};

// ---- device helpers (the shared ones in rows.cuh) ----

// One 16-byte vector of logits added to a MaxSum (rows.cuh) at once, its exps summed as a tree.
// Both loss kernels add a row's vectors with this, in the same order per thread
// (Note [Fused loss rows]).
__device__ __forceinline__ void add_values(MaxSum& a, const float (&x)[kVec]) {
  float mn = a.m;
#pragma unroll
  for (int e = 0; e < kVec; ++e) mn = fmaxf(mn, x[e]);
  float ex[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) ex[e] = __expf(x[e] - mn);
  a.s = a.s * __expf(a.m - mn) +
        (((ex[0] + ex[1]) + (ex[2] + ex[3])) + ((ex[4] + ex[5]) + (ex[6] + ex[7])));
  a.m = mn;
}

// Whether this thread takes the row's partial last vector (its v % 8 logits past the nvec full
// ones): the thread whose turn it would be as a full vector, i = nvec, element by element after
// its full vectors. In loss_rows_kernel that is the thread that copied it into shared memory, so
// every logit is read and written by the thread that loaded it (Note [In-place dlogits]).
__device__ __forceinline__ bool takes_tail(int64_t nvec, int64_t v) {
  return v % kVec != 0 && threadIdx.x == nvec % blockDim.x;
}

// dlogits of the 16-byte vector of logits x starting at element j0 of a row (ce_grad of each).
__device__ __forceinline__ void vec_grad(float (&d)[kVec], const float (&x)[kVec], float lse,
                                         int64_t j0, int64_t t, float scale) {
#pragma unroll
  for (int e = 0; e < kVec; ++e) d[e] = ce_grad(x[e], lse, j0 + e, t, scale);
}

// For each of the block's rows r (one thread block each): lse[r], row_loss[r] = lse[r] -
// logits[r, targets[r]] (0 where mask, if any, is 0); a target outside [0, v) gives loss 0 and
// lowers *bad_row to row0 + r. logits: [rows, ld] bf16, rows 16-byte aligned (ld % 8 == 0,
// aligned base); pointers already offset to the block.
__global__ void __launch_bounds__(kThreads)
    lse_kernel(float* lse, float* row_loss, unsigned* bad_row, const bf16* logits, int64_t ld,
               int64_t v, const int32_t* targets, int64_t row0, const float* mask) {
  const int64_t r = blockIdx.x;
  const bf16* row = logits + r * ld;
  const int64_t nvec = v / kVec, stride = blockDim.x;
  MaxSum acc{-FLT_MAX, 0.0f};
  int64_t i = threadIdx.x;
  for (; i + stride < nvec; i += 2 * stride) {  // two loads in flight per thread
    float a[kVec], b[kVec];
    load_vec(row + i * kVec, a);
    load_vec(row + (i + stride) * kVec, b);
    add_values(acc, a);
    add_values(acc, b);
  }
  if (i < nvec) {
    float a[kVec];
    load_vec(row + i * kVec, a);
    add_values(acc, a);
  }
  if (takes_tail(nvec, v)) {
    for (int64_t j = nvec * kVec; j < v; ++j) add_value(acc, load1(row + j));
  }
  acc = block_max_sum(acc);
  if (threadIdx.x == 0) {
    const float l = acc.m + logf(acc.s);
    lse[r] = l;
    record_row_loss(row_loss, bad_row, r, l, row, v, targets, row0 + r, mask);
  }
}

// Note [In-place dlogits]: the block's bf16 logits [rows, ld] become its bf16 dlogits [rows, ld]
// element for element over the same bytes, so the backward's products read the dlogits with the
// logits' stride. Each thread writes the dlogits of the logits it loaded itself, the partial last
// vector included (takes_tail): dlogits_kernel from registers, right after its loads;
// loss_rows_kernel from the shared copy of what its own cp.async brought in, which it has waited
// for. So no thread overwrites bytes another has yet to read, and neither kernel needs a barrier
// for it.
// dlogits[r, j] = (exp(logits[r, j] - lse[r]) - [j == targets[r]]) * scale (0 where mask, if
// any, is 0).
constexpr int kChunkLoads = 2;  // vectors a thread loads before it stores the first

__global__ void __launch_bounds__(kThreads)
    dlogits_kernel(bf16* logits, int64_t ld, int64_t v, const int32_t* targets, const float* lse,
                   float scale_all, const float* mask) {
  const int64_t r = blockIdx.x;
  bf16* row = logits + r * ld;  // logits in, dlogits out
  const float l = lse[r], scale = row_scale(scale_all, mask, r);
  const int64_t t = targets[r], nvec = v / kVec, stride = blockDim.x;
  for (int64_t i0 = threadIdx.x; i0 < nvec; i0 += kChunkLoads * stride) {
    float x[kChunkLoads][kVec];
#pragma unroll
    for (int q = 0; q < kChunkLoads; ++q) {
      const int64_t i = i0 + q * stride;
      if (i < nvec) load_vec(row + i * kVec, x[q]);
    }
#pragma unroll
    for (int q = 0; q < kChunkLoads; ++q) {
      const int64_t i = i0 + q * stride;
      if (i >= nvec) continue;
      float d[kVec];
      vec_grad(d, x[q], l, i * kVec, t, scale);
      store_vec(row + i * kVec, d);  // 16-byte aligned: the row is, i * kVec % 8 == 0
    }
  }
  if (takes_tail(nvec, v)) {
    for (int64_t j = nvec * kVec; j < v; ++j)
      store1(row + j, ce_grad(load1(row + j), l, j, t, scale));
  }
}

// Note [Fused loss rows]: training (lm_head_ce_forward_backward) needs each row's log-sum-exp
// before any of its dlogits, so the two-kernel path reads the bf16 logits from HBM twice
// (lse_kernel, then dlogits_kernel) and writes the bf16 dlogits once: 6 bytes per logit, all at
// HBM bandwidth. When a row fits in a block's shared memory (V up to 116088 on the H200: its
// 227 KiB opt-in limit less block_max_sum's 272 bytes), loss_rows_kernel reads it once, 4 bytes
// per logit: cp.async copies the whole row into shared memory (every copy in flight at once, no
// registers held), each thread folds its own 16-byte vectors into its MaxSum group by group as
// they land, the block reduces, and the dlogits are formed from the shared copy and written over
// the row's global bytes (Note [In-place dlogits]). Each thread adds the same vectors in the same
// order as in lse_kernel (same kThreads, same add_values), and the dlogits are the same ce_grad
// of the same floats, so lse, the row losses and dlogits have the two-kernel path's bits.
// Loads from shared memory and stores to HBM are 16 bytes a thread: a warp's store is 512
// contiguous bytes, and its shared loads are conflict-free. A row of V = 50304 takes 100 KB, so
// two blocks fit in an SM's 228 KiB (up to V = 57720, with the 1 KiB the SM reserves per block;
// the carveout is set to all shared memory): one row's copies land while the other's dlogits are
// stored. Rows wider than shared memory, and the forward-only op, keep lse_kernel (and
// dlogits_kernel).
constexpr int kFusedStages = 4;  // cp.async groups per row: the first is summed while the rest land

// lse_kernel and dlogits_kernel of one row in one pass; arguments as theirs. The dynamic shared
// memory holds the row's ceil(v / 8) vectors (the last one may run into the padding, ld % 8 == 0).
__global__ void __launch_bounds__(kThreads, 2)
    loss_rows_kernel(bf16* logits, float* lse, float* row_loss, unsigned* bad_row, int64_t ld,
                     int64_t v, const int32_t* targets, int64_t row0, float scale_all,
                     const float* mask) {
  extern __shared__ uint4 srow[];  // [ceil(v / 8)] vectors of 8 bf16
  const int64_t r = blockIdx.x, nvec = v / kVec, ncopy = (v + kVec - 1) / kVec;
  const int64_t stride = blockDim.x;
  bf16* row = logits + r * ld;
  const auto* gvec = reinterpret_cast<const uint4*>(row);
  // Thread t copies vectors t + k stride, k < per; group s holds k in [s per / S, (s+1) per / S).
  const int64_t per = (ncopy + stride - 1) / stride;
#pragma unroll
  for (int st = 0; st < kFusedStages; ++st) {
    for (int64_t k = st * per / kFusedStages; k < (st + 1) * per / kFusedStages; ++k) {
      const int64_t i = threadIdx.x + k * stride;
      if (i < ncopy) __pipeline_memcpy_async(&srow[i], &gvec[i], sizeof(uint4));
    }
    __pipeline_commit();
  }
  MaxSum acc{-FLT_MAX, 0.0f};
#pragma unroll
  for (int st = 0; st < kFusedStages; ++st) {
    __pipeline_wait_prior(kFusedStages - 1 - st);  // this thread's copies of group st landed
    asm volatile("" ::: "memory");                 // ... before the reads below
    for (int64_t k = st * per / kFusedStages; k < (st + 1) * per / kFusedStages; ++k) {
      const int64_t i = threadIdx.x + k * stride;
      if (i >= nvec) continue;
      float x[kVec];
      unpack8(srow[i], x);
      add_values(acc, x);
    }
  }
  const bf16* srow_h = reinterpret_cast<const bf16*>(srow);
  if (takes_tail(nvec, v)) {  // its own copy, landed
    for (int64_t j = nvec * kVec; j < v; ++j) add_value(acc, load1(srow_h + j));
  }
  acc = block_max_sum(acc);  // its barriers: every copy landed before thread 0 reads the target
  const float l = acc.m + logf(acc.s);
  if (threadIdx.x == 0) {
    lse[r] = l;
    record_row_loss(row_loss, bad_row, r, l, srow_h, v, targets, row0 + r, mask);
  }
  // dlogits over the row's global bytes (Note [In-place dlogits]), from the shared copy.
  const int64_t t = targets[r];
  const float scale = row_scale(scale_all, mask, r);
  for (int64_t i = threadIdx.x; i < nvec; i += stride) {
    float x[kVec], d[kVec];
    unpack8(srow[i], x);
    vec_grad(d, x, l, i * kVec, t, scale);
    store_vec(row + i * kVec, d);  // 16-byte aligned: the row is
  }
  if (takes_tail(nvec, v)) {
    for (int64_t j = nvec * kVec; j < v; ++j)
      store1(row + j, ce_grad(load1(srow_h + j), l, j, t, scale));
  }
}

// ---- host side ----

// The dynamic shared memory loss_rows_kernel needs for rows of v logits, its limit raised to match
// and its carveout set to all shared memory (on the current device), or 0 when a row is more than
// a block may hold (Note [Fused loss rows]).
int64_t fused_rows_smem(int64_t v) {
  static const int limit = [] {  // the opt-in maximum less the kernel's static shared memory
    int device = 0, optin = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&device));
    TANDEM_CUDA_CHECK(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attr{};
    TANDEM_CUDA_CHECK(cudaFuncGetAttributes(&attr, loss_rows_kernel));
    return optin - static_cast<int>(attr.sharedSizeBytes);
  }();
  const int64_t bytes = (v + kVec - 1) / kVec * int64_t{sizeof(uint4)};
  if (bytes > limit) return 0;
  TANDEM_CUDA_CHECK(
      cudaFuncSetAttribute(loss_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  // Without it the driver may pick a carveout that holds one row where two would fit.
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(loss_rows_kernel,
                                         cudaFuncAttributePreferredSharedMemoryCarveout,
                                         cudaSharedmemCarveoutMaxShared));
  return bytes;
}

struct LmHeadDims {
  int64_t n, h, v;
};

LmHeadDims check_lm_head(const char* op, const Tensor& lse, const Tensor& x, const Tensor& w,
                         const Tensor& targets) {
  expect_cuda_rank(op, "x", x, {DType::kBF16}, 2);
  expect_cuda_rank(op, "w", w, {DType::kBF16}, 2);
  const int64_t n = x.size(0), h = x.size(1), v = w.size(0);
  expect_cuda(op, "w", w, {DType::kBF16}, {v, h});
  expect_cuda(op, "lse", lse, {DType::kF32}, {n});
  expect_cuda(op, "targets", targets, {DType::kI32}, {n});
  TANDEM_CHECK(v > 0 || n == 0, op, ": the vocabulary is empty (w is ", shape_str(w.shape()),
               ") but there are ", n, " targets");
  TANDEM_CHECK(n < (int64_t{1} << 31), op, ": ", n, " rows, at most 2^31 - 1 are supported");
  return {n, h, v};
}

// The logits' row stride: V rounded up to 8 (core/footprint.h's lm_head_padded_vocab), so every
// bf16 row starts 16-byte aligned (vector loads and stores here, aligned operands for cuBLASLt).
int64_t padded_vocab(int64_t v) { return lm_head_padded_vocab(v); }

// Rows per block: core/footprint.h's lm_head_block_rows (the block's bf16 logits within
// kLmHeadMaxBlockBytes, at most kLmHeadMaxBlockRows, blocks as even as that allows: a short last
// block would cost a product launch and, in the weight gradient, one more read and write of the
// f32 [V, H] gradient for few rows), which the planner sizes the loss node's workspace by.
int64_t block_rows(int64_t n, int64_t ld) {
  const int64_t forced = g_block_rows_for_testing.load();
  if (forced > 0) return std::min(forced, n);
  return lm_head_block_rows(n, ld);
}

// A workspace of `rows` x `ld` bf16 logits, checked to meet the kernels' 16-byte alignment.
Tensor logits_block(int64_t rows, int64_t ld) {
  Tensor t =
      Tensor::empty({rows, ld}, DType::kBF16, MemCategory::kOther, "lm_head.block", Device::kCUDA);
  TANDEM_ASSERT(reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0,
                "the CUDA allocator returned a block that is not 16-byte aligned");
  return t;
}

bf16* bf16_data(const Tensor& t) { return static_cast<bf16*>(t.raw_data()); }

const bf16* bf16_rows(const Tensor& t, int64_t row0) { return bf16_data(t) + row0 * t.size(1); }

// logits[rows, V] (bf16, row stride ld) = x[r0 : r0 + rows] @ w^T, accumulated in fp32.
void form_logits(const Tensor& logits, int64_t ld, const LmHeadDims& d, const Tensor& x,
                 const Tensor& w, int64_t r0, int64_t rows) {
  gemm(Trans::kNo, Trans::kYes, rows, d.v, d.h, 1.0f, bf16_rows(x, r0), d.h, w.raw_data(), d.h,
       0.0f, logits.raw_data(), DType::kBF16, ld);
}

// lse_kernel over the block of `rows` rows starting at batch row r0: lse and row losses of those
// rows from the block's logits [rows, ld].
// mask: the loss mask of every row (null: none).
void launch_lse(const Tensor& logits, int64_t ld, int64_t v, const Tensor& lse,
                const RowLosses& losses, const Tensor& targets, int64_t r0, int64_t rows,
                const float* mask) {
  lse_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(
      lse.data<float>() + r0, losses.row_loss() + r0, losses.bad_row(), bf16_data(logits), ld, v,
      targets.data<int32_t>() + r0, r0, mask != nullptr ? mask + r0 : nullptr);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

// Declared in lm_head.h.
int64_t set_lm_head_block_rows_for_testing(int64_t rows) {
  return g_block_rows_for_testing.exchange(rows);
}

namespace {

// The ops below over the rows whose loss mask is 1 (undefined loss_mask: every row).
double forward_rows(const char* op, const Tensor& lse, const Tensor& x, const Tensor& w,
                    const Tensor& targets, const Tensor& loss_mask) {
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  const float* mask = loss_mask_rows(op, loss_mask, d.n);
  if (d.n == 0) return 0.0;
  const cudaStream_t s = stream();
  const int64_t ld = padded_vocab(d.v), max_rows = block_rows(d.n, ld);
  const Tensor logits = logits_block(max_rows, ld);  // [rows, ld] bf16
  const RowLosses losses(d.n, "lm_head.row_loss", "lm_head.status", s);
  for (int64_t r0 = 0; r0 < d.n; r0 += max_rows) {
    const int64_t rows = std::min(max_rows, d.n - r0);
    form_logits(logits, ld, d, x, w, r0, rows);
    launch_lse(logits, ld, d.v, lse, losses, targets, r0, rows, mask);
  }
  return losses.finish(op, targets, d.v);
}

// The backward's blocks: each block's logits formed once, then (with `losses`, the one-call op)
// its log-sum-exp and row losses, then dlogits in place, dx and dw. Arguments checked by the
// callers.
void backward_blocks(const LmHeadDims& d, const Tensor& dx, const Tensor& dw, const Tensor& x,
                     const Tensor& w, const Tensor& targets, const Tensor& lse, double scale,
                     Accumulate acc_dw, const RowLosses* losses, const float* mask) {
  const cudaStream_t s = stream();
  const int64_t ld = padded_vocab(d.v), max_rows = block_rows(d.n, ld);
  const Tensor logits = logits_block(max_rows, ld);  // bf16 [rows, ld]: logits, then dlogits
  const int64_t fused_smem = losses != nullptr ? fused_rows_smem(d.v) : 0;
  float dw_beta = acc_dw == Accumulate::kAdd ? 1.0f : 0.0f;
  for (int64_t r0 = 0; r0 < d.n; r0 += max_rows) {
    const int64_t rows = std::min(max_rows, d.n - r0);
    form_logits(logits, ld, d, x, w, r0, rows);
    // With `losses`, a bad target leaves its row's dlogits without the one-hot; the loss the
    // caller's start() returns throws when asked for, which the trainers do before the
    // optimizer reads dw (the step's end).
    if (losses != nullptr && fused_smem > 0) {
      loss_rows_kernel<<<static_cast<unsigned>(rows), kThreads, fused_smem, s>>>(
          bf16_data(logits), lse.data<float>() + r0, losses->row_loss() + r0, losses->bad_row(), ld,
          d.v, targets.data<int32_t>() + r0, r0, static_cast<float>(scale),
          mask != nullptr ? mask + r0 : nullptr);
      TANDEM_CUDA_CHECK_LAUNCH();
    } else {
      if (losses != nullptr) launch_lse(logits, ld, d.v, lse, *losses, targets, r0, rows, mask);
      dlogits_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
          bf16_data(logits), ld, d.v, targets.data<int32_t>() + r0, lse.data<float>() + r0,
          static_cast<float>(scale), mask != nullptr ? mask + r0 : nullptr);
      TANDEM_CUDA_CHECK_LAUNCH();
    }
    const void* dlogits = logits.raw_data();  // bf16 [rows, V], leading dimension ld
    // dx[r0 : r0 + rows] = dlogits @ w.
    gemm(Trans::kNo, Trans::kNo, rows, d.h, d.v, 1.0f, dlogits, ld, w.raw_data(), d.h, 0.0f,
         static_cast<bf16*>(dx.raw_data()) + r0 * d.h, DType::kBF16, d.h);
    // dw (+)= dlogits^T @ x[r0 : r0 + rows]; later blocks add.
    gemm(Trans::kYes, Trans::kNo, d.v, d.h, rows, 1.0f, dlogits, ld, bf16_rows(x, r0), d.h, dw_beta,
         dw.raw_data(), DType::kF32, d.h);
    dw_beta = 1.0f;
  }
}

void backward_op(const char* op, const Tensor& dx, const Tensor& dw, const Tensor& x,
                 const Tensor& w, const Tensor& targets, const Tensor& lse, double scale,
                 Accumulate acc_dw, const Tensor& loss_mask) {
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  const float* mask = loss_mask_rows(op, loss_mask, d.n);
  expect_cuda(op, "dx", dx, {DType::kBF16}, {d.n, d.h});
  expect_cuda(op, "dw", dw, {DType::kF32}, {d.v, d.h});
  expect_targets(op, targets, d.v);
  if (d.n == 0) {
    if (acc_dw == Accumulate::kOverwrite) dw.zero_();
    return;
  }
  backward_blocks(d, dx, dw, x, w, targets, lse, scale, acc_dw, nullptr, mask);
}

PendingScalar forward_backward_op(const char* op, const Tensor& dx, const Tensor& dw,
                                  const Tensor& lse, const Tensor& x, const Tensor& w,
                                  const Tensor& targets, double scale, Accumulate acc_dw,
                                  const Tensor& loss_mask) {
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  const float* mask = loss_mask_rows(op, loss_mask, d.n);
  expect_cuda(op, "dx", dx, {DType::kBF16}, {d.n, d.h});
  expect_cuda(op, "dw", dw, {DType::kF32}, {d.v, d.h});
  if (d.n == 0) {
    if (acc_dw == Accumulate::kOverwrite) dw.zero_();
    return PendingScalar(0.0);
  }
  const RowLosses losses(d.n, "lm_head.row_loss", "lm_head.status", stream());
  backward_blocks(d, dx, dw, x, w, targets, lse, scale, acc_dw, &losses, mask);
  return losses.start(op, targets, d.v);
}

}  // namespace

double lm_head_ce_forward(const Tensor& lse, const Tensor& x, const Tensor& w,
                          const Tensor& targets) {
  return forward_rows("lm_head_ce_forward", lse, x, w, targets, Tensor());
}

void lm_head_ce_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                         const Tensor& targets, const Tensor& lse, double scale,
                         Accumulate acc_dw) {
  backward_op("lm_head_ce_backward", dx, dw, x, w, targets, lse, scale, acc_dw, Tensor());
}

PendingScalar lm_head_ce_forward_backward(const Tensor& dx, const Tensor& dw, const Tensor& lse,
                                          const Tensor& x, const Tensor& w, const Tensor& targets,
                                          double scale, Accumulate acc_dw) {
  return forward_backward_op("lm_head_ce_forward_backward", dx, dw, lse, x, w, targets, scale,
                             acc_dw, Tensor());
}

double lm_head_ce_forward_masked(const Tensor& lse, const Tensor& x, const Tensor& w,
                                 const Tensor& targets, const Tensor& loss_mask) {
  return forward_rows("lm_head_ce_forward_masked", lse, x, w, targets, loss_mask);
}

void lm_head_ce_backward_masked(const Tensor& dx, const Tensor& dw, const Tensor& x,
                                const Tensor& w, const Tensor& targets, const Tensor& lse,
                                double scale, const Tensor& loss_mask, Accumulate acc_dw) {
  backward_op("lm_head_ce_backward_masked", dx, dw, x, w, targets, lse, scale, acc_dw, loss_mask);
}

PendingScalar lm_head_ce_forward_backward_masked(const Tensor& dx, const Tensor& dw,
                                                 const Tensor& lse, const Tensor& x,
                                                 const Tensor& w, const Tensor& targets,
                                                 double scale, const Tensor& loss_mask,
                                                 Accumulate acc_dw) {
  return forward_backward_op("lm_head_ce_forward_backward_masked", dx, dw, lse, x, w, targets,
                             scale, acc_dw, loss_mask);
}

}  // namespace tandem::ops::cuda
