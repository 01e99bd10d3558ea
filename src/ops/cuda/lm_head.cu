// CUDA LM head fused with cross-entropy (ops.h): rows go in blocks; a block's logits are formed
// by cuBLASLt in fp32 into one workspace, reduced to the log-sum-exp (forward) or turned in place
// into bf16 dlogits (backward, Note [In-place dlogits]; in one pass with the forward when a row
// fits in shared memory, Note [Fused loss rows]), and overwritten by the next block, so the
// [N, V] logits never exist. Forward sums the row losses in double in a fixed order and reads
// the sum back with one copy. The row helpers shared with loss.cu are in rows.cuh.
//
// Why fp32 logits: a bf16 logit is off by up to 2^-9 |logit| (0.03 at |logit| = 16), which would
// land unattenuated in each row's loss and as a ~3% error on its softmax probabilities. The cost
// is 2 more bytes written and read per logit, next to the 2H flops that form it (H = 4096: about
// 13% of the product's time against 7% in bf16).
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

constexpr int kThreads = 256;  // per row

std::atomic<int64_t> g_block_rows_for_testing{0};

// ---- device helpers (the shared ones in rows.cuh) ----

// Four values added to a MaxSum (rows.cuh) at once, their exps summed in pairs.
__device__ __forceinline__ void add_values(MaxSum& a, float4 v) {
  const float mn = fmaxf(a.m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
  a.s = a.s * __expf(a.m - mn) +
        ((__expf(v.x - mn) + __expf(v.y - mn)) + (__expf(v.z - mn) + __expf(v.w - mn)));
  a.m = mn;
}

// For each of the block's rows r (one thread block each): lse[r], row_loss[r] = lse[r] -
// logits[r, targets[r]]; a target outside [0, v) gives loss 0 and lowers *bad_row to row0 + r.
// logits: [rows, ld] f32, rows 16-byte aligned (ld % 4 == 0, aligned base); pointers already
// offset to the block.
__global__ void __launch_bounds__(kThreads)
    lse_kernel(float* lse, float* row_loss, unsigned* bad_row, const float* logits, int64_t ld,
               int64_t v, const int32_t* targets, int64_t row0) {
  const int64_t r = blockIdx.x;
  const float* row = logits + r * ld;
  const auto* vec = reinterpret_cast<const float4*>(row);
  const int64_t nvec = v / 4, stride = blockDim.x;
  MaxSum acc{-FLT_MAX, 0.0f};
  int64_t i = threadIdx.x;
  for (; i + stride < nvec; i += 2 * stride) {  // two loads in flight per thread
    const float4 a = vec[i], b = vec[i + stride];
    add_values(acc, a);
    add_values(acc, b);
  }
  if (i < nvec) add_values(acc, vec[i]);
  for (int64_t j = nvec * 4 + threadIdx.x; j < v; j += stride) add_value(acc, row[j]);
  acc = block_max_sum(acc);
  if (threadIdx.x == 0) {
    const float l = acc.m + logf(acc.s);
    lse[r] = l;
    record_row_loss(row_loss, bad_row, r, l, row, v, targets, row0 + r);
  }
}

// Note [In-place dlogits]: the block's f32 logits [rows, ld] become bf16 dlogits [rows, 2*ld]
// over the same bytes: bf16 row r starts where f32 row r does, and bf16 element j lies inside
// f32 element j/2 of that row. In dlogits_kernel a row goes in chunks of kChunkLoads float4 per
// thread; chunk c (elements [cC, (c+1)C)) writes over f32 elements [cC/2, (c+1)C/2), all of which
// the block has read once every thread has loaded chunk c, hence the one barrier per chunk between
// the loads and the stores; the next chunk's loads start at (c+1)C, past anything written so far.
// loss_rows_kernel has read the whole row into shared memory before its first store, so one
// barrier per row does (Note [Fused loss rows]).
// dlogits[r, j] = (exp(logits[r, j] - lse[r]) - [j == targets[r]]) * scale.
constexpr int kChunkLoads = 2;

__global__ void __launch_bounds__(kThreads)
    dlogits_kernel(float* logits, int64_t ld, int64_t v, const int32_t* targets, const float* lse,
                   float scale) {
  const int64_t r = blockIdx.x;
  float* row = logits + r * ld;
  __nv_bfloat16* drow = reinterpret_cast<__nv_bfloat16*>(row);
  const float l = lse[r];
  const int64_t t = targets[r];
  const int64_t chunk = int64_t{blockDim.x} * 4 * kChunkLoads;
  for (int64_t c0 = 0; c0 < v; c0 += chunk) {
    float x[kChunkLoads][4] = {};
    int64_t j[kChunkLoads];
#pragma unroll
    for (int q = 0; q < kChunkLoads; ++q) {
      j[q] = c0 + (int64_t{q} * blockDim.x + threadIdx.x) * 4;
      if (j[q] + 4 <= v) {
        load_vec(row + j[q], x[q]);
      } else {
        for (int e = 0; e < 4 && j[q] + e < v; ++e) x[q][e] = row[j[q] + e];
      }
    }
    __syncthreads();  // every load of this chunk before any store into its bytes
#pragma unroll
    for (int q = 0; q < kChunkLoads; ++q) {
      float d[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) d[e] = ce_grad(x[q][e], l, j[q] + e, t, scale);
      if (j[q] + 4 <= v) {
        store_vec(drow + j[q], d);  // 8-byte aligned: the row is 16-byte aligned, j % 4 == 0
      } else {
        for (int e = 0; e < 4 && j[q] + e < v; ++e) drow[j[q] + e] = __float2bfloat16_rn(d[e]);
      }
    }
  }
}

// Note [Fused loss rows]: training (lm_head_ce_forward_backward) needs each row's log-sum-exp
// before any of its dlogits, so the two-kernel path reads the f32 logits from HBM twice
// (lse_kernel, then dlogits_kernel) and writes the bf16 dlogits once: 10 bytes per logit, all at
// HBM bandwidth. When a row fits in a block's shared memory (V up to 58044 on the H200: its
// 227 KiB opt-in limit less block_max_sum's 272 bytes), loss_rows_kernel reads it once, 6 bytes
// per logit: cp.async copies the whole row into shared memory (every copy in flight at once, no
// registers held), each thread folds its own float4s into its MaxSum group by group as they land,
// the block reduces, and the dlogits are formed from the shared copy and written over the row's
// global bytes. The barriers of block_max_sum order every copy out of the row before any store
// into it, so Note [In-place dlogits] needs no chunk barriers here. Each thread adds the same
// float4s in the same order as in lse_kernel (same kThreads), and the dlogits are the same
// ce_grad of the same floats, so lse, the row losses and dlogits have the two-kernel path's bits.
// Stores stay 8 bytes a thread (one float4 of logits): a warp's store is 256 contiguous bytes,
// whole sectors; 16-byte stores would read two float4 per thread from shared memory at a 32-byte
// stride (2-way bank conflicts) for the same HBM bytes. A block holds one row of 201 KB at
// V = 50304, so one block per SM: the next row's copies start when the block exits. Rows wider
// than shared memory, and the forward-only op, keep lse_kernel (and dlogits_kernel).
constexpr int kFusedStages = 4;  // cp.async groups per row: the first is summed while the rest land

// lse_kernel and dlogits_kernel of one row in one pass; arguments as theirs. The dynamic shared
// memory holds the row's ceil(v / 4) float4 (the last one may run into the padding, ld % 8 == 0).
__global__ void __launch_bounds__(kThreads)
    loss_rows_kernel(float* logits, float* lse, float* row_loss, unsigned* bad_row, int64_t ld,
                     int64_t v, const int32_t* targets, int64_t row0, float scale) {
  extern __shared__ float4 srow[];  // [ceil(v / 4)]
  const int64_t r = blockIdx.x, nvec = v / 4, ncopy = (v + 3) / 4, stride = blockDim.x;
  float* row = logits + r * ld;
  const auto* gvec = reinterpret_cast<const float4*>(row);
  // Thread t copies float4s t + k stride, k < per; group s holds k in [s per / S, (s+1) per / S).
  const int64_t per = (ncopy + stride - 1) / stride;
#pragma unroll
  for (int st = 0; st < kFusedStages; ++st) {
    for (int64_t k = st * per / kFusedStages; k < (st + 1) * per / kFusedStages; ++k) {
      const int64_t i = threadIdx.x + k * stride;
      if (i < ncopy) __pipeline_memcpy_async(&srow[i], &gvec[i], sizeof(float4));
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
      if (i < nvec) add_values(acc, srow[i]);
    }
  }
  const float* srow_f = reinterpret_cast<const float*>(srow);
  for (int64_t j = nvec * 4 + threadIdx.x; j < v; j += stride) add_value(acc, srow_f[j]);
  acc = block_max_sum(acc);  // its barriers: every copy landed before any store below
  const float l = acc.m + logf(acc.s);
  if (threadIdx.x == 0) {
    lse[r] = l;
    record_row_loss(row_loss, bad_row, r, l, srow_f, v, targets, row0 + r);
  }
  // dlogits over the row's global bytes (Note [In-place dlogits]), from the shared copy.
  __nv_bfloat16* drow = reinterpret_cast<__nv_bfloat16*>(row);
  const int64_t t = targets[r];
  for (int64_t i = threadIdx.x; i < nvec; i += stride) {
    const float4 x = srow[i];
    const float d[4] = {ce_grad(x.x, l, 4 * i, t, scale), ce_grad(x.y, l, 4 * i + 1, t, scale),
                        ce_grad(x.z, l, 4 * i + 2, t, scale), ce_grad(x.w, l, 4 * i + 3, t, scale)};
    store_vec(drow + 4 * i, d);  // 8-byte aligned: the row is 16-byte aligned
  }
  for (int64_t j = nvec * 4 + threadIdx.x; j < v; j += stride) {
    drow[j] = __float2bfloat16_rn(ce_grad(srow_f[j], l, j, t, scale));
  }
}

// ---- host side ----

// The dynamic shared memory loss_rows_kernel needs for rows of v logits, its limit raised to match
// (on the current device), or 0 when a row is more than a block may hold (Note [Fused loss rows]).
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
  const int64_t bytes = (v + 3) / 4 * int64_t{sizeof(float4)};
  if (bytes > limit) return 0;
  TANDEM_CUDA_CHECK(
      cudaFuncSetAttribute(loss_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
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

// The f32 logits' row stride: V rounded up to 8 floats, so every row starts 32-byte aligned
// (vector loads here, aligned operands for cuBLASLt) and the bf16 dlogits' rows 16-byte aligned.
int64_t padded_vocab(int64_t v) { return lm_head_padded_vocab(v); }

// Rows per block: core/footprint.h's lm_head_block_rows (the block's f32 logits within
// kLmHeadMaxBlockBytes, at most kLmHeadMaxBlockRows, blocks as even as that allows: a short last
// block would cost a product launch and, in the weight gradient, one more read and write of the
// f32 [V, H] gradient for few rows), which the planner sizes the loss node's workspace by.
int64_t block_rows(int64_t n, int64_t ld) {
  const int64_t forced = g_block_rows_for_testing.load();
  if (forced > 0) return std::min(forced, n);
  return lm_head_block_rows(n, ld);
}

// A workspace of `rows` x `ld` f32 logits, checked to meet the kernels' 16-byte alignment.
Tensor logits_block(int64_t rows, int64_t ld) {
  Tensor t =
      Tensor::empty({rows, ld}, DType::kF32, MemCategory::kOther, "lm_head.block", Device::kCUDA);
  TANDEM_ASSERT(reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0,
                "the CUDA allocator returned a block that is not 16-byte aligned");
  return t;
}

const __nv_bfloat16* bf16_rows(const Tensor& t, int64_t row0) {
  return static_cast<const __nv_bfloat16*>(t.raw_data()) + row0 * t.size(1);
}

// lse_kernel over the block of `rows` rows starting at batch row r0: lse and row losses of those
// rows from the block's logits [rows, ld].
void launch_lse(const Tensor& logits, int64_t ld, int64_t v, const Tensor& lse,
                const RowLosses& losses, const Tensor& targets, int64_t r0, int64_t rows) {
  lse_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(
      lse.data<float>() + r0, losses.row_loss() + r0, losses.bad_row(), logits.data<float>(), ld,
      v, targets.data<int32_t>() + r0, r0);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

// Declared in lm_head.h.
int64_t set_lm_head_block_rows_for_testing(int64_t rows) {
  return g_block_rows_for_testing.exchange(rows);
}

double lm_head_ce_forward(const Tensor& lse, const Tensor& x, const Tensor& w,
                          const Tensor& targets) {
  const char* op = "lm_head_ce_forward";
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  if (d.n == 0) return 0.0;
  const cudaStream_t s = stream();
  const int64_t ld = padded_vocab(d.v), max_rows = block_rows(d.n, ld);
  const Tensor logits = logits_block(max_rows, ld);  // [rows, ld] f32
  const RowLosses losses(d.n, "lm_head.row_loss", "lm_head.status", s);
  for (int64_t r0 = 0; r0 < d.n; r0 += max_rows) {
    const int64_t rows = std::min(max_rows, d.n - r0);
    // logits[rows, V] = x[r0 : r0 + rows] @ w^T.
    gemm(Trans::kNo, Trans::kYes, rows, d.v, d.h, 1.0f, bf16_rows(x, r0), d.h, w.raw_data(), d.h,
         0.0f, logits.raw_data(), DType::kF32, ld);
    launch_lse(logits, ld, d.v, lse, losses, targets, r0, rows);
  }
  return losses.finish(op, targets, d.v);
}

namespace {

// The backward's blocks: each block's logits formed once, then (with `losses`, the one-call op)
// its log-sum-exp and row losses, then dlogits in place, dx and dw. Arguments checked by the
// callers.
void backward_blocks(const LmHeadDims& d, const Tensor& dx, const Tensor& dw, const Tensor& x,
                     const Tensor& w, const Tensor& targets, const Tensor& lse, double scale,
                     Accumulate acc_dw, const RowLosses* losses) {
  const cudaStream_t s = stream();
  const int64_t ld = padded_vocab(d.v), max_rows = block_rows(d.n, ld);
  const Tensor logits = logits_block(max_rows, ld);  // f32 [rows, ld], then bf16 [rows, 2 ld]
  const int64_t fused_smem = losses != nullptr ? fused_rows_smem(d.v) : 0;
  float dw_beta = acc_dw == Accumulate::kAdd ? 1.0f : 0.0f;
  for (int64_t r0 = 0; r0 < d.n; r0 += max_rows) {
    const int64_t rows = std::min(max_rows, d.n - r0);
    const __nv_bfloat16* xb = bf16_rows(x, r0);  // [rows, H]
    gemm(Trans::kNo, Trans::kYes, rows, d.v, d.h, 1.0f, xb, d.h, w.raw_data(), d.h, 0.0f,
         logits.raw_data(), DType::kF32, ld);
    // With `losses`, a bad target leaves its row's dlogits without the one-hot; the caller's
    // finish() throws before anyone reads dx or dw.
    if (losses != nullptr && fused_smem > 0) {
      loss_rows_kernel<<<static_cast<unsigned>(rows), kThreads, fused_smem, s>>>(
          logits.data<float>(), lse.data<float>() + r0, losses->row_loss() + r0, losses->bad_row(),
          ld, d.v, targets.data<int32_t>() + r0, r0, static_cast<float>(scale));
      TANDEM_CUDA_CHECK_LAUNCH();
    } else {
      if (losses != nullptr) launch_lse(logits, ld, d.v, lse, *losses, targets, r0, rows);
      dlogits_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
          logits.data<float>(), ld, d.v, targets.data<int32_t>() + r0, lse.data<float>() + r0,
          static_cast<float>(scale));
      TANDEM_CUDA_CHECK_LAUNCH();
    }
    const void* dlogits = logits.raw_data();  // bf16 [rows, V], leading dimension 2 ld
    // dx[r0 : r0 + rows] = dlogits @ w.
    gemm(Trans::kNo, Trans::kNo, rows, d.h, d.v, 1.0f, dlogits, 2 * ld, w.raw_data(), d.h, 0.0f,
         static_cast<__nv_bfloat16*>(dx.raw_data()) + r0 * d.h, DType::kBF16, d.h);
    // dw (+)= dlogits^T @ x[r0 : r0 + rows]; later blocks add.
    gemm(Trans::kYes, Trans::kNo, d.v, d.h, rows, 1.0f, dlogits, 2 * ld, xb, d.h, dw_beta,
         dw.raw_data(), DType::kF32, d.h);
    dw_beta = 1.0f;
  }
}

}  // namespace

void lm_head_ce_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                         const Tensor& targets, const Tensor& lse, double scale,
                         Accumulate acc_dw) {
  const char* op = "lm_head_ce_backward";
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  expect_cuda(op, "dx", dx, {DType::kBF16}, {d.n, d.h});
  expect_cuda(op, "dw", dw, {DType::kF32}, {d.v, d.h});
  expect_targets(op, targets, d.v);
  if (d.n == 0) {
    if (acc_dw == Accumulate::kOverwrite) dw.zero_();
    return;
  }
  backward_blocks(d, dx, dw, x, w, targets, lse, scale, acc_dw, nullptr);
}

double lm_head_ce_forward_backward(const Tensor& dx, const Tensor& dw, const Tensor& lse,
                                   const Tensor& x, const Tensor& w, const Tensor& targets,
                                   double scale, Accumulate acc_dw) {
  const char* op = "lm_head_ce_forward_backward";
  const LmHeadDims d = check_lm_head(op, lse, x, w, targets);
  expect_cuda(op, "dx", dx, {DType::kBF16}, {d.n, d.h});
  expect_cuda(op, "dw", dw, {DType::kF32}, {d.v, d.h});
  if (d.n == 0) {
    if (acc_dw == Accumulate::kOverwrite) dw.zero_();
    return 0.0;
  }
  const RowLosses losses(d.n, "lm_head.row_loss", "lm_head.status", stream());
  backward_blocks(d, dx, dw, x, w, targets, lse, scale, acc_dw, &losses);
  return losses.finish(op, targets, d.v);
}

}  // namespace tandem::ops::cuda
