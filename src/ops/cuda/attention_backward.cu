// The tensor-core attention backward (FlashAttention-2): by default in two passes, dk and dv by
// key tiles then dq by query tiles (Note [Deterministic attention backward]), or in one pass
// that sums dq by fp32 atomics; and the backward variant table (Note [Attention variants]).
#include <iterator>
#include <string_view>
#include <utility>

#include "core/footprint.h"
#include "ops/cuda/attention_mma.cuh"

namespace tandem::ops::cuda::attn {

namespace {

// ---------------------------------------------------------------------------------------------
// Tensor-core backward (FlashAttention-2, one pass). A prologue kernel writes delta =
// rowsum(dO * O) and zeros an f32 dq workspace [batch * seq, heads * D]. Main kernel block: 16 keys
// per warp (WARPS warps) of one (batch, KV head), K/V tiles resident in shared memory; it walks the
// query tiles (BR rows, double-buffered with their lse and delta) of every query head of the group,
// from the diagonal on, in the transposed form: S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
// dS^T = P^T (dP^T - delta), dK += dS^T Q; then each warp stores its dS^T rows (bf16) to shared
// memory and the warps split dQ = dS K of the tile by rows (and, for BR < 16 WARPS, columns) and
// add it to the workspace with fp32 atomics. An epilogue kernel writes dq = scale * workspace
// (bf16).
// ---------------------------------------------------------------------------------------------

template <int D, int DV, int WARPS, int BR>
struct BackwardTiles {
  static constexpr int kThreads = 32 * WARPS, kBc = 16 * WARPS, kBr = BR, kPitch = D + 8,
                       kVPitch = DV + 8, kDsPitch = BR + 8;
  static_assert(kBc >= kKeyTile);  // the grid-y limit of check_attention
  static constexpr int kSmemBytes = (kBc + 2 * kBr) * kPitch * int{sizeof(bf16)} +
                                    (kBc + 2 * kBr) * kVPitch * int{sizeof(bf16)} +
                                    kBc * kDsPitch * int{sizeof(bf16)} +
                                    4 * kBr * int{sizeof(float)} + 2 * kBr * int{sizeof(int)};
};

// One (query tile, key tile) step for one warp: dk, dv accumulate, and dp_out (zeros on entry)
// receives this warp's dS^T (unscaled); `stats` holds lse * log2 e in [0, BR) and delta in
// [BR, 2 BR) for the tile's rows, `begins` their first keys; `late`: some row's first key is
// after the block's first key, so the tile needs the document mask
// (Note [Attention document bounds] in attention_mma.cuh).
template <int D, int DV, int BR, bool DOCS>
__device__ __forceinline__ void dkdv_query_tile(float (&dk)[1][D / 8][4], float (&dv)[1][DV / 8][4],
                                                float (&dp_out)[BR / 8][4], const bf16* s_k,
                                                const bf16* s_v, const bf16* s_q, const bf16* s_do,
                                                const float* stats, const int* begins, bool late,
                                                int key0, int q0, const Geometry& g, int lane) {
  constexpr int kP = D + 8, kPv = DV + 8, kNt = BR / 8;
  float s[1][kNt][4] = {};
  float(&dp)[1][kNt][4] = reinterpret_cast<float(&)[1][kNt][4]>(dp_out);
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a[1][4];
    ldmatrix_x4(a[0], s_k + (lane & 15) * kP + kc * 16 + (lane >> 4) * 8);
    mma_nt<1, kNt>(s, a, s_q + kc * 16, kP, lane);
  }
#pragma unroll
  for (int kc = 0; kc < DV / 16; ++kc) {
    uint32_t a[1][4];
    ldmatrix_x4(a[0], s_v + (lane & 15) * kPv + kc * 16 + (lane >> 4) * 8);
    mma_nt<1, kNt>(dp, a, s_do + kc * 16, kPv, lane);
  }
  const bool need_mask = key0 + 15 > q0 || q0 + BR > g.seq || late;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + (lane >> 2) + 8 * (e >> 1);
      const int col = nt * 8 + 2 * (lane & 3) + (e & 1);  // query q0 + col
      float p = fast_exp2(s[0][nt][e] * g.scale_log2 - stats[col]);
      if (need_mask && !(key <= q0 + col && q0 + col < g.seq && (!DOCS || key >= begins[col]))) {
        p = 0.f;
      }
      s[0][nt][e] = p;
      dp[0][nt][e] = p * (dp[0][nt][e] - stats[BR + col]);  // dS^T (unscaled)
    }
  }
#pragma unroll
  for (int kc = 0; kc < BR / 16; ++kc) {
    uint32_t a[1][4];
    c_to_a<kNt>(a[0], s[0], kc);
    mma_nn<1, DV / 8>(dv, a, s_do + kc * 16 * kPv, kPv, lane);
    c_to_a<kNt>(a[0], dp[0], kc);
    mma_nn<1, D / 8>(dk, a, s_q + kc * 16 * kP, kP, lane);
  }
}

// Where step `it` of a backward block reads: query head and first row of its query tile.
struct QueryStep {
  int head, q0;
};
__device__ __forceinline__ QueryStep query_step(int it, int first_tile, int per_head, int head0,
                                                int br) {
  return {head0 + it / per_head, (first_tile + it % per_head) * br};
}

// Starts loading the Q and dO tiles of step `st` (cp.async).
template <int D, int DV, int BR, int THREADS>
__device__ __forceinline__ void dkdv_load_tiles(bf16* s_q, bf16* s_do, const bf16* q,
                                                const bf16* dout, int b, QueryStep st,
                                                const Geometry& g) {
  const int64_t q_off = int64_t{b} * g.seq * g.q_stride + int64_t{st.head} * D;
  const int64_t o_off = int64_t{b} * g.seq * g.o_stride + int64_t{st.head} * DV;
  load_tile<BR, D, THREADS>(s_q, q + q_off, g.q_stride, st.q0, g.seq);
  load_tile<BR, DV, THREADS>(s_do, dout + o_off, g.o_stride, st.q0, g.seq);
}

// lse * log2 e, delta and the first key of row `i` of step `st`'s query tile (zeros past seq, and
// first key 0 without document bounds). Loaded into registers a step ahead and stored to shared
// memory after that step's products, so that the global latency hides behind them.
struct StatRow {
  float lse2, delta;
  int begin;
};
template <bool DOCS>
__device__ __forceinline__ StatRow load_stat_row(const float* lse, const float* delta, int b,
                                                 QueryStep st, int i, const Geometry& g) {
  const int row = st.q0 + i;
  if (row >= g.seq) return {0.f, 0.f, 0};
  const int64_t at = (int64_t{b} * g.heads + st.head) * g.seq + row;
  const int begin = DOCS ? g.key_begin[int64_t{b} * g.seq + row] : 0;
  return {lse[at] * kLog2e, delta[at], begin};
}

// delta of every (row, head) and zeros in the dq workspace (when there is one: D == DV, so that
// it has out's layout). DV / 8 threads per (row, head), each on one 16-byte chunk of dout and
// out. `rows` = batch * seq * heads.
template <int DV>
__global__ void __launch_bounds__(256)
    attention_delta_kernel(float* __restrict__ delta, float* __restrict__ dq_acc,
                           const bf16* __restrict__ dout, const bf16* __restrict__ out,
                           int64_t rows, Geometry g) {
  constexpr int kLanes = DV / 8;
  const int64_t chunk = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t rh = chunk / kLanes;  // token row * heads + head
  float part = 0;
  if (rh < rows) {
    const uint4 x = *reinterpret_cast<const uint4*>(dout + chunk * 8);
    const uint4 y = *reinterpret_cast<const uint4*>(out + chunk * 8);
    const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&x);
    const __nv_bfloat162* yh = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = __bfloat1622float2(xh[i]), b = __bfloat1622float2(yh[i]);
      part += a.x * b.x + a.y * b.y;
    }
    if (dq_acc != nullptr) {
      float4* z = reinterpret_cast<float4*>(dq_acc + chunk * 8);
      z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (rh < rows && chunk % kLanes == 0) {
    const int64_t n = rh / g.heads;
    const int h = static_cast<int>(rh % g.heads);
    const int64_t b = n / g.seq, t = n % g.seq;
    delta[(b * g.heads + h) * g.seq + t] = part;
  }
}

// dq = scale * dq_acc in bf16, 8 elements per thread; `n` elements in all (a multiple of 8).
__global__ void __launch_bounds__(256)
    attention_dq_convert_kernel(bf16* __restrict__ dq, const float* __restrict__ dq_acc, int64_t n,
                                float scale) {
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 8;
  if (i >= n) return;
  const float4 a = *reinterpret_cast<const float4*>(dq_acc + i);
  const float4 b = *reinterpret_cast<const float4*>(dq_acc + i + 4);
  uint4 u;
  u.x = pack_bf16x2(a.x * scale, a.y * scale);
  u.y = pack_bf16x2(a.z * scale, a.w * scale);
  u.z = pack_bf16x2(b.x * scale, b.y * scale);
  u.w = pack_bf16x2(b.z * scale, b.w * scale);
  *reinterpret_cast<uint4*>(dq + i) = u;
}

// This warp's dS^T rows (16 keys x BR queries, C fragments `ds`) to shared memory as bf16.
template <int BR>
__device__ __forceinline__ void store_ds(bf16* s_ds, const float (&ds)[BR / 8][4], int lane) {
  constexpr int kP = BR + 8;
#pragma unroll
  for (int nt = 0; nt < BR / 8; ++nt) {
    bf16* at = s_ds + (lane >> 2) * kP + nt * 8 + 2 * (lane & 3);
    *reinterpret_cast<uint32_t*>(at) = pack_bf16x2(ds[nt][0], ds[nt][1]);
    *reinterpret_cast<uint32_t*>(at + 8 * kP) = pack_bf16x2(ds[nt][2], ds[nt][3]);
  }
}

// dQ of the step's query tile from the block's dS^T (BC x BR in shared memory) and K tile (BC
// keys): warp `warp` takes 16-row groups wr = warp % kRowGroups + WARPS i and columns [kCols wc,
// kCols (wc + 1)) of the tile, and adds them to the workspace rows of (batch b, head) with fp32
// atomics.
template <int D, int WARPS, int BR>
__device__ __forceinline__ void dq_atomic_step(float* dq_acc, const bf16* s_ds, const bf16* s_k,
                                               int b, QueryStep st, int warp, const Geometry& g,
                                               int lane) {
  constexpr int kBc = 16 * WARPS, kRowGroups = BR / 16;
  constexpr int kColGroups = kRowGroups >= WARPS ? 1 : WARPS / kRowGroups, kCols = D / kColGroups;
  constexpr int kPerWarp = kRowGroups >= WARPS ? kRowGroups / WARPS : 1;  // row groups per warp
  constexpr int kP = D + 8, kDsP = BR + 8;
  static_assert(kPerWarp * WARPS == kRowGroups * kColGroups && kCols % 16 == 0);
  const int col0 = (warp / (WARPS / kColGroups)) * kCols;
  float* base =
      dq_acc + int64_t{b} * g.seq * g.q_stride + int64_t{st.head} * D + col0 + 2 * (lane & 3);
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int wr = warp % (WARPS / kColGroups) + WARPS * i;
    float acc[1][kCols / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < kBc / 16; ++kc) {
      uint32_t a[1][4];  // dS rows 16 wr.., keys 16 kc.. (the transpose of the stored dS^T)
      ldmatrix_x4_trans(a[0], s_ds + (kc * 16 + (lane & 7) + ((lane >> 4) << 3)) * kDsP + wr * 16 +
                                  ((lane >> 3) & 1) * 8);
      mma_nn<1, kCols / 8>(acc, a, s_k + kc * 16 * kP + col0, kP, lane);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = st.q0 + wr * 16 + (lane >> 2) + 8 * r;
      if (row >= g.seq) continue;
#pragma unroll
      for (int dn = 0; dn < kCols / 8; ++dn) {
        atomicAdd(reinterpret_cast<float2*>(base + int64_t{row} * g.q_stride + dn * 8),
                  make_float2(acc[0][dn][2 * r], acc[0][dn][2 * r + 1]));
      }
    }
  }
}

// out[i] = bf16(the sum over parts p, in order, of part[p * n + i]): a key split's dk or dv.
__global__ void __launch_bounds__(256)
    attention_split_sum_kernel(bf16* __restrict__ out, const float* __restrict__ part, int64_t n,
                               int split) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0;
    for (int p = 0; p < split; ++p) sum += part[p * n + i];
    out[i] = __float2bfloat16_rn(sum);
  }
}

// DQ false: dk and dv only (the deterministic backward's first pass; dq_acc unused). With
// split > 1 (Note [Attention key split] in core/footprint.h) block x is (batch, KV head, part):
// it walks the part's group / split query heads and writes f32 partials to dk_part, dv_part
// ([split, N, kv * D], [split, N, kv * Dv]) instead of dk, dv.
template <int D, int DV, int WARPS, int BR, int MINB, bool DQ, bool DOCS>
__global__ void __launch_bounds__(32 * WARPS, MINB)
    flash_backward_fused_kernel(float* __restrict__ dq_acc, bf16* __restrict__ dk,
                                bf16* __restrict__ dv, const bf16* __restrict__ dout,
                                const bf16* __restrict__ q, const bf16* __restrict__ k,
                                const bf16* __restrict__ v, const float* __restrict__ lse,
                                const float* __restrict__ delta, Geometry g, int split,
                                float* __restrict__ dk_part, float* __restrict__ dv_part) {
  using T = BackwardTiles<D, DV, WARPS, BR>;
  constexpr int kBc = T::kBc, kP = T::kPitch, kPv = T::kVPitch, kDsP = T::kDsPitch,
                kTh = T::kThreads;
  extern __shared__ uint4 smem[];
  bf16* s_k = reinterpret_cast<bf16*>(smem);                     // [kBc][kP]
  bf16* s_v = s_k + kBc * kP;                                    // [kBc][kPv]
  bf16* s_q = s_v + kBc * kPv;                                   // [2][BR][kP]
  bf16* s_do = s_q + 2 * BR * kP;                                // [2][BR][kPv]
  bf16* s_ds = s_do + 2 * BR * kPv;                              // [kBc][kDsP]
  float* s_stats = reinterpret_cast<float*>(s_ds + kBc * kDsP);  // [2][2 * BR]
  int* s_begin = reinterpret_cast<int*>(s_stats + 4 * BR);       // [2][BR]

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int part = static_cast<int>(blockIdx.x) % split;
  const int b = static_cast<int>(blockIdx.x) / split / g.kv_heads;
  const int kvh = static_cast<int>(blockIdx.x) / split % g.kv_heads;
  const int part_heads = g.group / split, head0 = kvh * g.group + part * part_heads;
  const int k0 = static_cast<int>(blockIdx.y) * kBc;  // key tile 0 sees the most queries: first
  const int64_t k_off = int64_t{b} * g.seq * g.kv_stride + int64_t{kvh} * D;
  const int64_t v_off = int64_t{b} * g.seq * g.v_stride + int64_t{kvh} * DV;
  const int first_tile = k0 / BR;
  // Note [Attention document bounds]: the query tiles up to the last query of any of its keys.
  const int last_row = last_attending_row<kTh, DOCS>(g, b, k0, k0 + kBc - 1);
  const int per_head = min((g.seq + BR - 1) / BR, last_row / BR + 1) - first_tile;
  const int n_steps = part_heads * per_head;
  const int tid = static_cast<int>(threadIdx.x);  // threads below BR carry one stats row
  static_assert(BR <= kTh);

  load_tile<kBc, D, kTh>(s_k, k + k_off, g.kv_stride, k0, g.seq);
  load_tile<kBc, DV, kTh>(s_v, v + v_off, g.v_stride, k0, g.seq);
  const QueryStep first = query_step(0, first_tile, per_head, head0, BR);
  dkdv_load_tiles<D, DV, BR, kTh>(s_q, s_do, q, dout, b, first, g);
  cp_async_commit();
  StatRow cur{0.f, 0.f, 0};  // this thread's row of the current step (threads below BR)
  if (tid < BR) {
    cur = load_stat_row<DOCS>(lse, delta, b, first, tid, g);
    s_stats[tid] = cur.lse2;
    s_stats[BR + tid] = cur.delta;
    s_begin[tid] = cur.begin;
  }

  const int key0 = k0 + warp * 16;  // this warp's first key
  float dk_acc[1][D / 8][4] = {}, dv_acc[1][DV / 8][4] = {};
  for (int it = 0; it < n_steps; ++it) {
    const int buf = it & 1;
    const bool more = it + 1 < n_steps;
    StatRow next{0.f, 0.f, 0};
    if (more) {  // prefetch step it + 1 into the buffers freed at the end of step it - 1
      const QueryStep st = query_step(it + 1, first_tile, per_head, head0, BR);
      dkdv_load_tiles<D, DV, BR, kTh>(s_q + (buf ^ 1) * BR * kP, s_do + (buf ^ 1) * BR * kPv, q,
                                      dout, b, st, g);
      if (tid < BR) next = load_stat_row<DOCS>(lse, delta, b, st, tid, g);
    }
    cp_async_commit();
    cp_async_wait<1>();
    // Whether a row of the tile starts its document after the block's first key (the barrier the
    // step needs anyway).
    bool late = false;
    if constexpr (DOCS) {
      late = __syncthreads_or(tid < BR && cur.begin > k0) != 0;
    } else {
      __syncthreads();
    }
    const QueryStep st = query_step(it, first_tile, per_head, head0, BR);
    float ds[BR / 8][4] = {};
    if (key0 <= st.q0 + BR - 1) {  // else every query of the tile is before this warp's keys
      dkdv_query_tile<D, DV, BR, DOCS>(dk_acc, dv_acc, ds, s_k + warp * 16 * kP,
                                       s_v + warp * 16 * kPv, s_q + buf * BR * kP,
                                       s_do + buf * BR * kPv, s_stats + buf * 2 * BR,
                                       s_begin + buf * BR, late, key0, st.q0, g, lane);
    }
    if constexpr (DQ) {
      store_ds<BR>(s_ds + warp * 16 * kDsP, ds, lane);
      __syncthreads();
      dq_atomic_step<D, WARPS, BR>(dq_acc, s_ds, s_k, b, st, warp, g, lane);
    }
    if (more && tid < BR) {
      s_stats[(buf ^ 1) * 2 * BR + tid] = next.lse2;
      s_stats[(buf ^ 1) * 2 * BR + BR + tid] = next.delta;
      s_begin[(buf ^ 1) * BR + tid] = next.begin;
    }
    cur = next;
    __syncthreads();
  }
  if (split == 1) {
    store_rows<D>(dk + k_off, g.kv_stride, key0, g.seq, dk_acc[0], g.scale, lane);
    store_rows<DV>(dv + v_off, g.v_stride, key0, g.seq, dv_acc[0], 1.f, lane);
    return;
  }
  const int64_t rows = int64_t{g.batch} * g.seq;
  store_rows<D>(dk_part + part * rows * g.kv_stride + k_off, g.kv_stride, key0, g.seq, dk_acc[0],
                g.scale, lane);
  store_rows<DV>(dv_part + part * rows * g.v_stride + v_off, g.v_stride, key0, g.seq, dv_acc[0],
                 1.f, lane);
}

// ---------------------------------------------------------------------------------------------
// Note [Deterministic attention backward]: the fused backward above sums each dq row over key
// tiles with fp32 atomics, in whatever order the blocks arrive, so two runs of the same step can
// differ in the last bits (and, through the router, in everything after). The two-pass backward
// is FlashAttention-2's other form: the fused kernel without its dq part gives dk and dv, and a
// query-tile kernel gives dq. Its block holds WARPS warps x 16 MT query rows of one (batch, head)
// with their Q and dO fragments in registers and walks the key tiles up to the diagonal (K and V
// double-buffered, as the forward): S = Q K^T, P = exp2(S scale log2 e - lse log2 e),
// dP = dO V^T, dS = P (dP - delta), dQ += dS K (dS as bf16, as the fused kernel's). Each dq row
// is one warp's, summed in key order: the same bits on every run. It recomputes S and forms dP a
// second time (the fused kernel forms both per key tile already), so it costs a few percent more
// time (bench/results/gpu_single.md), and it needs no f32 dq workspace. It is the default;
// --attention-backward-variant w4_q64_k64_m2 (or another variant) takes the one-pass form
// (Note [Attention variants]).
// ---------------------------------------------------------------------------------------------

template <int D, int DV, int WARPS, int MT, int BC>
struct DqTiles {
  static constexpr int kThreads = 32 * WARPS, kBr = WARPS * 16 * MT, kBc = BC, kPitch = D + 8,
                       kVPitch = DV + 8;
  static constexpr int kSmemBytes =
      ((kBr + 2 * kBc) * kPitch + (kBr + 2 * kBc) * kVPitch) * int{sizeof(bf16)};
};

// One key tile for one warp: dq += dS K for its rows; lse2 (lse log2 e) and dlt (delta) per row
// of its C fragments.
template <int D, int DV, int MT, int BC>
__device__ __forceinline__ void dq_key_tile(float (&dq)[MT][D / 8][4],
                                            const uint32_t (&qf)[D / 16][MT][4],
                                            const uint32_t (&dof)[DV / 16][MT][4],
                                            const float (&lse2)[MT][2], const float (&dlt)[MT][2],
                                            const bf16* s_k, const bf16* s_v, int k0, int row0,
                                            const RowBounds& rb, const Geometry& g, int lane) {
  constexpr int kP = D + 8, kNt = BC / 8;
  float s[MT][kNt][4] = {}, dp[MT][kNt][4] = {};
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    mma_nt<MT, kNt>(s, qf[kc], s_k + kc * 16, kP, lane);
    if (kc < DV / 16) mma_nt<MT, kNt>(dp, dof[kc], s_v + kc * 16, DV + 8, lane);
  }
  // Note [Attention document bounds] in attention_mma.cuh, as the forward's.
  const bool need_mask = k0 + BC - 1 > row0 || k0 + BC > g.seq || k0 < rb.hi;
  int lo[MT][2];  // each row's first key
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + mt * 16 + (lane >> 2) + 8 * r;
      lo[mt][r] = need_mask && row < g.seq ? rb.first_key(row) : 0;
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int row = row0 + mt * 16 + (lane >> 2) + 8 * r;
        const int col = k0 + nt * 8 + 2 * (lane & 3) + (e & 1);
        float p = fast_exp2(s[mt][nt][e] * g.scale_log2 - lse2[mt][r]);
        if (need_mask && !(col <= row && col < g.seq && col >= lo[mt][r])) p = 0.f;
        s[mt][nt][e] = p * (dp[mt][nt][e] - dlt[mt][r]);  // dS (unscaled)
      }
    }
  }
  mma_c_nn<MT, BC / 16, D / 8>(dq, s, s_k, kP, lane);  // dq += dS K
}

template <int D, int DV, int WARPS, int MT, int BC, int MINB, bool DOCS>
__global__ void __launch_bounds__(32 * WARPS, MINB)
    flash_backward_dq_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout,
                             const bf16* __restrict__ q, const bf16* __restrict__ k,
                             const bf16* __restrict__ v, const float* __restrict__ lse,
                             const float* __restrict__ delta, Geometry g) {
  using T = DqTiles<D, DV, WARPS, MT, BC>;
  constexpr int kBr = T::kBr, kBc = T::kBc, kP = T::kPitch, kPv = T::kVPitch, kTh = T::kThreads;
  extern __shared__ uint4 smem[];
  bf16* s_q = reinterpret_cast<bf16*>(smem);  // [kBr][kP]
  bf16* s_do = s_q + kBr * kP;                // [kBr][kPv]
  bf16* s_k = s_do + kBr * kPv;               // [2][kBc][kP]
  bf16* s_v = s_k + 2 * kBc * kP;             // [2][kBc][kPv]

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const auto [b, h, q0, q_off, o_off, k_off, v_off, n_tiles] = query_tile<D, DV, kBr, kBc>(g);

  const int row0 = q0 + warp * 16 * MT;  // this warp's first query row
  load_tile<kBr, D, kTh>(s_q, q + q_off, g.q_stride, q0, g.seq);
  load_tile<kBr, DV, kTh>(s_do, dout + o_off, g.o_stride, q0, g.seq);
  cp_async_commit();
  // Note [Attention document bounds] in attention_mma.cuh: from the first attended key tile.
  const RowBounds rb = warp_row_bounds<16 * MT, DOCS>(g, b, row0, lane);
  const int first_tile = first_key_tile<kBc, DOCS>(rb.lo, n_tiles);
  load_tile<kBc, D, kTh>(s_k, k + k_off, g.kv_stride, first_tile * kBc, g.seq);
  load_tile<kBc, DV, kTh>(s_v, v + v_off, g.v_stride, first_tile * kBc, g.seq);
  cp_async_commit();

  float lse2[MT][2], dlt[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + mt * 16 + (lane >> 2) + 8 * r;
      const int64_t at = (int64_t{b} * g.heads + h) * g.seq + row;
      lse2[mt][r] = row < g.seq ? lse[at] * kLog2e : 0.f;
      dlt[mt][r] = row < g.seq ? delta[at] : 0.f;
    }
  }
  cp_async_wait<1>();  // the Q and dO tiles
  __syncthreads();
  uint32_t qf[D / 16][MT][4], dof[DV / 16][MT][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row = warp * 16 * MT + mt * 16 + (lane & 15), col = kc * 16 + (lane >> 4) * 8;
      ldmatrix_x4(qf[kc][mt], s_q + row * kP + col);
      if (kc < DV / 16) ldmatrix_x4(dof[kc][mt], s_do + row * kPv + col);
    }
  }
  float acc[MT][D / 8][4] = {};
  walk_key_tiles<kBc, D, DV, kTh>(
      s_k, s_v, k, v, k_off, v_off, first_tile, n_tiles, rb.lo, row0 + 16 * MT - 1, g,
      [&](const bf16* tk, const bf16* tv, int k0) {
        dq_key_tile<D, DV, MT, BC>(acc, qf, dof, lse2, dlt, tk, tv, k0, row0, rb, g, lane);
      });
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    store_rows<D>(dq + q_off, g.q_stride, row0 + mt * 16, g.seq, acc[mt], g.scale, lane);
  }
}

// delta and the zeroed f32 dq workspace, the single-pass kernel, then dq from the workspace.
template <int D, int WARPS, int BR, int MINB>  // D == DV only (the dq workspace zeroed as out)
void launch_backward_fused(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                           const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& delta, const Geometry& g) {
  using T = BackwardTiles<D, D, WARPS, BR>;
  // Note [Attention document bounds]: the kernel with bounds only for a call that has them.
  auto* plain = flash_backward_fused_kernel<D, D, WARPS, BR, MINB, true, false>;
  auto* documents = flash_backward_fused_kernel<D, D, WARPS, BR, MINB, true, true>;
  static const bool configured =
      (allow_smem(plain, T::kSmemBytes), allow_smem(documents, T::kSmemBytes), true);
  (void)configured;
  // dq_acc: [batch * seq, heads * D] f32 (the layout of dq); op workspace like delta.
  const Tensor dq_acc =
      Tensor::empty({int64_t{g.batch} * g.seq, int64_t{g.heads} * D}, DType::kF32,
                    MemCategory::kOther, "attention_backward.dq_acc", Device::kCUDA);
  const int64_t rows = int64_t{g.batch} * g.seq * g.heads, chunks = rows * (D / 8);
  attention_delta_kernel<D><<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream()>>>(
      delta.data<float>(), dq_acc.data<float>(), cptr(dout), cptr(out), rows, g);
  TANDEM_CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>(g.batch * g.kv_heads), tiles(g.seq, T::kBc));
  (g.key_begin != nullptr ? documents : plain)<<<grid, T::kThreads, T::kSmemBytes, stream()>>>(
      dq_acc.data<float>(), mptr(dk), mptr(dv), cptr(dout), cptr(q), cptr(k), cptr(v),
      lse.data<float>(), delta.data<float>(), g, 1, nullptr, nullptr);
  TANDEM_CUDA_CHECK_LAUNCH();
  attention_dq_convert_kernel<<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream()>>>(
      mptr(dq), dq_acc.data<float>(), chunks * 8, g.scale);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// Note [Deterministic attention backward]: delta, dk and dv (the fused kernel without dq), then
// dq by query tiles.
template <int D, int DV, int WARPS, int BR, int MINB, int DQ_WARPS, int DQ_MT, int DQ_BC,
          int DQ_MINB>
void launch_backward_two_pass(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& delta,
                              const Geometry& g) {
  using T = BackwardTiles<D, DV, WARPS, BR>;
  using TQ = DqTiles<D, DV, DQ_WARPS, DQ_MT, DQ_BC>;
  // Note [Attention document bounds]: the kernels with bounds only for a call that has them.
  const bool docs = g.key_begin != nullptr;
  auto* dkdv_plain = flash_backward_fused_kernel<D, DV, WARPS, BR, MINB, false, false>;
  auto* dkdv_docs = flash_backward_fused_kernel<D, DV, WARPS, BR, MINB, false, true>;
  auto* dq_plain = flash_backward_dq_kernel<D, DV, DQ_WARPS, DQ_MT, DQ_BC, DQ_MINB, false>;
  auto* dq_docs = flash_backward_dq_kernel<D, DV, DQ_WARPS, DQ_MT, DQ_BC, DQ_MINB, true>;
  static const bool configured =
      (allow_smem(dkdv_plain, T::kSmemBytes), allow_smem(dkdv_docs, T::kSmemBytes),
       allow_smem(dq_plain, TQ::kSmemBytes), allow_smem(dq_docs, TQ::kSmemBytes), true);
  (void)configured;
  auto* dkdv = docs ? dkdv_docs : dkdv_plain;
  auto* dq_kernel = docs ? dq_docs : dq_plain;
  const int64_t rows = int64_t{g.batch} * g.seq * g.heads, chunks = rows * (DV / 8);
  attention_delta_kernel<DV><<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream()>>>(
      delta.data<float>(), nullptr, cptr(dout), cptr(out), rows, g);
  TANDEM_CUDA_CHECK_LAUNCH();
  // Note [Attention key split]: the partial dk, dv of each part, summed in part order.
  const int split = static_cast<int>(
      attention_key_split(g.batch, g.seq, g.kv_heads, g.group, g.head_dim, g.v_dim));
  Tensor dk_part, dv_part;
  if (split > 1) {
    const int64_t rows = int64_t{g.batch} * g.seq;
    dk_part = Tensor::empty({split, rows, g.kv_stride}, DType::kF32, MemCategory::kOther,
                            "attention_backward.dk_part", Device::kCUDA);
    dv_part = Tensor::empty({split, rows, g.v_stride}, DType::kF32, MemCategory::kOther,
                            "attention_backward.dv_part", Device::kCUDA);
  }
  const dim3 grid(static_cast<unsigned>(g.batch * g.kv_heads * split), tiles(g.seq, T::kBc));
  dkdv<<<grid, T::kThreads, T::kSmemBytes, stream()>>>(
      nullptr, mptr(dk), mptr(dv), cptr(dout), cptr(q), cptr(k), cptr(v), lse.data<float>(),
      delta.data<float>(), g, split, split > 1 ? dk_part.data<float>() : nullptr,
      split > 1 ? dv_part.data<float>() : nullptr);
  TANDEM_CUDA_CHECK_LAUNCH();
  if (split > 1) {
    for (const auto& [out, part] : {std::pair{&dk, &dk_part}, std::pair{&dv, &dv_part}}) {
      const int64_t n = out->numel();
      attention_split_sum_kernel<<<blocks_for(n), 256, 0, stream()>>>(
          mptr(*out), part->data<float>(), n, split);
      TANDEM_CUDA_CHECK_LAUNCH();
    }
  }
  const dim3 dq_grid(static_cast<unsigned>(g.batch * g.heads), tiles(g.seq, TQ::kBr));
  dq_kernel<<<dq_grid, TQ::kThreads, TQ::kSmemBytes, stream()>>>(
      mptr(dq), cptr(dout), cptr(q), cptr(k), cptr(v), lse.data<float>(), delta.data<float>(), g);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// Backward: keys per block = 16 x warps; query rows per step BR.
// Index 0, the default, is the deterministic two-pass form
// (Note [Deterministic attention backward]): dk/dv blocks of 64 keys walking 64-row query tiles, dq
// blocks of 64 query rows walking 32-key tiles (156 registers, three blocks a multiprocessor; the
// fastest of the three tilings timed, the other two kept as variants; all three give the same
// bits). The others sum dq by atomics: 1 is the fastest of all (bench/attention_timing.cc times
// them).
constexpr Variant<BackwardLaunch> kBackwardVariants[] = {
    {"deterministic", launch_backward_two_pass<64, 64, 4, 64, 2, 4, 1, 32, 3>},
    {"w4_q64_k64_m2", launch_backward_fused<64, 4, 64, 2>},
    {"w8_q64_k128_m1", launch_backward_fused<64, 8, 64, 1>},
    {"w8_q128_k128_m1", launch_backward_fused<64, 8, 128, 1>},
    {"w4_q128_k64_m1", launch_backward_fused<64, 4, 128, 1>},
    {"deterministic_dq_w4_q64_k64", launch_backward_two_pass<64, 64, 4, 64, 2, 4, 1, 64, 2>},
    {"deterministic_dq_w8_q128_k64", launch_backward_two_pass<64, 64, 4, 64, 2, 8, 1, 64, 1>},
};

// D 128's deterministic backward in a few tilings (Note [Attention variants]): dk/dv blocks of
// 16 x warps keys walking query tiles of q rows, then dq blocks walking key tiles of k keys.
// Index 0, the default and the fastest timed at shape (c) (bench/results/families.md): 64-key
// dk/dv blocks walking 64-row query tiles, one block a multiprocessor, and dq blocks of 64 rows
// walking 64-key tiles; 32-row query tiles at two blocks a multiprocessor (index 1, it spills 24
// bytes) ran 5% slower.
constexpr Variant<BackwardLaunch> kBackward128Variants[] = {
    {"kv_w4_q64_m1+dq_w4_k64_m1", launch_backward_two_pass<128, 128, 4, 64, 1, 4, 1, 64, 1>},
    {"kv_w4_q32_m2+dq_w4_k64_m1", launch_backward_two_pass<128, 128, 4, 32, 2, 4, 1, 64, 1>},
    {"kv_w4_q32_m2+dq_w4_k32_m2", launch_backward_two_pass<128, 128, 4, 32, 2, 4, 1, 32, 2>},
    {"kv_w4_q32_m2+dq_w8_k64_m1", launch_backward_two_pass<128, 128, 4, 32, 2, 8, 1, 64, 1>},
    {"kv_w8_q32_m1+dq_w4_k64_m1", launch_backward_two_pass<128, 128, 8, 32, 1, 4, 1, 64, 1>},
    {"kv_w4_q64_m1+dq_w4_k32_m2", launch_backward_two_pass<128, 128, 4, 64, 1, 4, 1, 32, 2>},
};

// Whether a variant is one of the two-pass (deterministic) forms: the name says so.
constexpr bool is_deterministic(int variant) {
  return std::string_view(kBackwardVariants[variant].name).starts_with("deterministic");
}
static_assert(is_deterministic(0), "the default backward (index 0) is the deterministic form");

}  // namespace

std::vector<const char*> backward_variant_names() { return variant_names(kBackwardVariants); }
std::vector<const char*> backward128_variant_names() { return variant_names(kBackward128Variants); }

void launch_tensor_core_backward(int variant, int variant128, const Tensor& dq, const Tensor& dk,
                                 const Tensor& dv, const Tensor& dout, const Tensor& q,
                                 const Tensor& k, const Tensor& v, const Tensor& out,
                                 const Tensor& lse, const Tensor& delta, const Geometry& g) {
  // D 128: the table above for a deterministic D 64 choice, else the one-pass form.
  // q/k 192 with v 128: the deterministic form, 32-row query tiles and dq blocks of 64 rows
  // walking 32-key tiles (its Q, dO fragments and dq accumulator take most registers).
  if (g.head_dim == 64) {
    kBackwardVariants[variant].launch(dq, dk, dv, dout, q, k, v, out, lse, delta, g);
  } else if (g.head_dim == 192) {
    launch_backward_two_pass<192, 128, 4, 32, 1, 4, 1, 32, 1>(dq, dk, dv, dout, q, k, v, out, lse,
                                                              delta, g);
  } else if (is_deterministic(variant)) {
    kBackward128Variants[variant128].launch(dq, dk, dv, dout, q, k, v, out, lse, delta, g);
  } else {
    launch_backward_fused<128, 4, 32, 2>(dq, dk, dv, dout, q, k, v, out, lse, delta, g);
  }
}

}  // namespace tandem::ops::cuda::attn
