// The generic attention kernels (any head dims up to 256, any alignment), for what the
// tensor-core kernels (attention.cu, attention_backward.cu) do not take: one warp per row, lane
// i holding head-dim elements i + 32 j; keys one at a time with an fp32 online softmax. Slow
// but plainly the equations. The backward is deterministic: one pass owns the dq rows (and
// writes delta), a second the dk/dv rows. With document bounds (Geometry::key_begin) a query row
// walks its own keys only, and a key row the queries that attend it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // a block: 4 warps, a row each
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = kMaxGenericDim / 32;  // head-dim elements a lane holds

__device__ __forceinline__ void load_row(float (&x)[kPerLane], const bf16* row, int dim, int lane) {
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = lane + 32 * j;
    x[j] = d < dim ? __bfloat162float(row[d]) : 0.f;
  }
}
__device__ __forceinline__ float dot_row(const float (&x)[kPerLane], const float (&y)[kPerLane]) {
  float acc = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) acc += x[j] * y[j];
  return warp_sum(acc);
}
__device__ __forceinline__ void store_row(bf16* row, const float (&x)[kPerLane], float mul, int dim,
                                          int lane) {
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < dim) row[d] = __float2bfloat16_rn(x[j] * mul);
  }
}

// The (batch, head, token) of this warp's row, index r = (b * heads + h) * seq + t.
struct RowId {
  int64_t r;
  int b, h, t;
};
__device__ __forceinline__ RowId warp_row(int heads, int seq) {
  const int64_t r = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  const int64_t bh = r / seq;
  return {r, static_cast<int>(bh / heads), static_cast<int>(bh % heads), static_cast<int>(r % seq)};
}

// The first key of query t of sequence b: key_begin's (at least 0), else 0.
__device__ __forceinline__ int first_key(const Geometry& g, int b, int t) {
  return g.key_begin != nullptr ? max(g.key_begin[int64_t{b} * g.seq + t], 0) : 0;
}

__global__ void __launch_bounds__(kThreads)
    generic_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                           Geometry g) {
  const RowId id = warp_row(g.heads, g.seq);
  if (id.b >= g.batch) return;  // whole warps only
  const int lane = static_cast<int>(threadIdx.x) % 32, dim = g.head_dim, vdim = g.v_dim;
  const int64_t q_row = (int64_t{id.b} * g.seq + id.t) * g.q_stride + int64_t{id.h} * dim;
  const int64_t o_row = (int64_t{id.b} * g.seq + id.t) * g.o_stride + int64_t{id.h} * vdim;
  const int64_t k0 = int64_t{id.b} * g.seq * g.kv_stride + int64_t{id.h / g.group} * dim;
  const int64_t v0 = int64_t{id.b} * g.seq * g.v_stride + int64_t{id.h / g.group} * vdim;
  float qv[kPerLane], kv[kPerLane], vv[kPerLane], acc[kPerLane] = {};
  load_row(qv, q + q_row, dim, lane);
  float m = -INFINITY, l = 0;
  for (int j = first_key(g, id.b, id.t); j <= id.t; ++j) {
    load_row(kv, k + k0 + j * g.kv_stride, dim, lane);
    load_row(vv, v + v0 + j * g.v_stride, vdim, lane);
    const float s = dot_row(qv, kv) * g.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] = acc[i] * corr + p * vv[i];
    m = m_new;
  }
  store_row(out + o_row, acc, 1.f / l, vdim, lane);
  if (lane == 0) lse[id.r] = m + logf(l);
}

// dq of one query row, and its delta = rowsum(dout * out).
__global__ void __launch_bounds__(kThreads)
    generic_backward_dq_kernel(bf16* dq, float* delta, const bf16* dout, const bf16* q,
                               const bf16* k, const bf16* v, const bf16* out, const float* lse,
                               Geometry g) {
  const RowId id = warp_row(g.heads, g.seq);
  if (id.b >= g.batch) return;
  const int lane = static_cast<int>(threadIdx.x) % 32, dim = g.head_dim, vdim = g.v_dim;
  const int64_t q_row = (int64_t{id.b} * g.seq + id.t) * g.q_stride + int64_t{id.h} * dim;
  const int64_t o_row = (int64_t{id.b} * g.seq + id.t) * g.o_stride + int64_t{id.h} * vdim;
  const int64_t k0 = int64_t{id.b} * g.seq * g.kv_stride + int64_t{id.h / g.group} * dim;
  const int64_t v0 = int64_t{id.b} * g.seq * g.v_stride + int64_t{id.h / g.group} * vdim;
  float qv[kPerLane], dov[kPerLane], kv[kPerLane], vv[kPerLane], acc[kPerLane] = {};
  load_row(qv, q + q_row, dim, lane);
  load_row(dov, dout + o_row, vdim, lane);
  load_row(vv, out + o_row, vdim, lane);
  const float dlt = dot_row(dov, vv), row_lse = lse[id.r];
  if (lane == 0) delta[id.r] = dlt;
  for (int j = first_key(g, id.b, id.t); j <= id.t; ++j) {
    load_row(kv, k + k0 + j * g.kv_stride, dim, lane);
    load_row(vv, v + v0 + j * g.v_stride, vdim, lane);
    const float p = expf(dot_row(qv, kv) * g.scale - row_lse);
    const float ds = p * (dot_row(dov, vv) - dlt);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] += ds * kv[i];
  }
  store_row(dq + q_row, acc, g.scale, dim, lane);
}

// dk, dv of one key row of a KV head: sums over the group's query heads and the later tokens.
__global__ void __launch_bounds__(kThreads)
    generic_backward_dkdv_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                 const bf16* v, const float* lse, const float* delta, Geometry g) {
  const RowId id = warp_row(g.kv_heads, g.seq);  // id.h is the KV head, id.t the key
  if (id.b >= g.batch) return;
  const int lane = static_cast<int>(threadIdx.x) % 32, dim = g.head_dim, vdim = g.v_dim;
  const int64_t k_row = (int64_t{id.b} * g.seq + id.t) * g.kv_stride + int64_t{id.h} * dim;
  const int64_t v_row = (int64_t{id.b} * g.seq + id.t) * g.v_stride + int64_t{id.h} * vdim;
  float kv[kPerLane], vv[kPerLane], qv[kPerLane], dov[kPerLane];
  float dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
  load_row(kv, k + k_row, dim, lane);
  load_row(vv, v + v_row, vdim, lane);
  for (int h = id.h * g.group; h < (id.h + 1) * g.group; ++h) {
    const int64_t stat0 = (int64_t{id.b} * g.heads + h) * g.seq;
    for (int t = id.t; t < g.seq; ++t) {
      if (first_key(g, id.b, t) > id.t) continue;  // query t does not attend this key
      const int64_t q_row = (int64_t{id.b} * g.seq + t) * g.q_stride + int64_t{h} * dim;
      const int64_t o_row = (int64_t{id.b} * g.seq + t) * g.o_stride + int64_t{h} * vdim;
      load_row(qv, q + q_row, dim, lane);
      load_row(dov, dout + o_row, vdim, lane);
      const float p = expf(dot_row(kv, qv) * g.scale - lse[stat0 + t]);
      const float ds = p * (dot_row(vv, dov) - delta[stat0 + t]);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        dv_acc[i] += p * dov[i];
        dk_acc[i] += ds * qv[i];
      }
    }
  }
  store_row(dk + k_row, dk_acc, g.scale, dim, lane);
  store_row(dv + v_row, dv_acc, 1.f, vdim, lane);
}

unsigned generic_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarps - 1) / kWarps);
}

}  // namespace

void generic_attention_forward(const Geometry& g, bf16* out, float* lse, const bf16* q,
                               const bf16* k, const bf16* v) {
  generic_forward_kernel<<<generic_blocks(int64_t{g.batch} * g.heads * g.seq), kThreads, 0,
                           stream()>>>(out, lse, q, k, v, g);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void generic_attention_backward(const Geometry& g, bf16* dq, bf16* dk, bf16* dv, float* delta,
                                const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                                const bf16* out, const float* lse) {
  generic_backward_dq_kernel<<<generic_blocks(int64_t{g.batch} * g.heads * g.seq), kThreads, 0,
                               stream()>>>(dq, delta, dout, q, k, v, out, lse, g);
  TANDEM_CUDA_CHECK_LAUNCH();
  generic_backward_dkdv_kernel<<<generic_blocks(int64_t{g.batch} * g.kv_heads * g.seq), kThreads, 0,
                                 stream()>>>(dk, dv, dout, q, k, v, lse, delta, g);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::ops::cuda
