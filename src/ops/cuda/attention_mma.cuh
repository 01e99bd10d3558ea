// What the tensor-core attention kernels share (attention.cu: the forward, the checks and the
// dispatch; attention_backward.cu: the backward): the mma.sync / ldmatrix / cp.async helpers,
// tile loads and stores, the key-tile walk, launch helpers and the variant tables' types.
// Private to src/ops/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"

namespace tandem::ops::cuda::attn {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Keys per block of the dk/dv pass; no block of any pass covers fewer rows (grid y limit).
constexpr int kKeyTile = 64;

// ---------------------------------------------------------------------------------------------
// Device helpers (and pack_bf16x2, warp_sum from common.cuh).
// Note [mma fragments]: PTX ISA, mma.m16n8k16 .bf16; g = lane / 4, t = lane % 4.
//   A 16x16 (row major), 4 regs of 2 bf16: r0 (g, 2t..2t+1), r1 (g+8, 2t..), r2 (g, 2t+8..),
//     r3 (g+8, 2t+8..); the low half holds the lower column.
//   B 16x8 (k x n), 2 regs: r0 (k 2t..2t+1, n g), r1 (k 2t+8.., n g).
//   C 16x8 f32, 4 regs: c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
// ldmatrix.x4 loads four 8x8 b16 matrices whose row addresses come from lanes 8i..8i+7; lane l
// receives from matrix i (row l/4, columns 2(l%4)..+1) in register i (.trans: the transpose).
// So an A fragment is rows (l & 15), column block (l >> 4) of a 16x16 window; the C fragments of
// two adjacent n8 tiles, packed to bf16, are the A fragment of one k16 step (used for P and dS).
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared; writes zeros instead when !valid (`src` must still
// be a mapped address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// c += a * b for one m16n8k16 step (Note [mma fragments]).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {  // exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The A fragment of k16 step `kc` from C fragments c[2kc], c[2kc+1] (Note [mma fragments]).
template <int NT>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[NT][4], int kc) {
  a[0] = pack_bf16x2(c[2 * kc][0], c[2 * kc][1]);
  a[1] = pack_bf16x2(c[2 * kc][2], c[2 * kc][3]);
  a[2] = pack_bf16x2(c[2 * kc + 1][0], c[2 * kc + 1][1]);
  a[3] = pack_bf16x2(c[2 * kc + 1][2], c[2 * kc + 1][3]);
}

// c[mt][nt] += a[mt] * B for one k16 step, where B (16 x NT*8) is the transpose of a window of a
// shared tile: `rows` points at (n row 0, k column 0) of NT*8 rows, k contiguous.
template <int MT, int NT>
__device__ __forceinline__ void mma_nt(float (&c)[MT][NT][4], const uint32_t (&a)[MT][4],
                                       const bf16* rows, int pitch, int lane) {
  static_assert(NT % 2 == 0);
#pragma unroll
  for (int nb = 0; nb < NT / 2; ++nb) {
    uint32_t b[4];
    ldmatrix_x4(b,
                rows + (nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * pitch + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma_bf16(c[mt][2 * nb], a[mt], b[0], b[1]);
      mma_bf16(c[mt][2 * nb + 1], a[mt], b[2], b[3]);
    }
  }
}

// c[mt][nt] += a[mt] * B for one k16 step, where B (16 x NT*8) is a window of a shared tile
// stored k-major: `rows` points at (k row 0, n column 0), n contiguous (ldmatrix.trans).
template <int MT, int NT>
__device__ __forceinline__ void mma_nn(float (&c)[MT][NT][4], const uint32_t (&a)[MT][4],
                                       const bf16* rows, int pitch, int lane) {
  static_assert(NT % 2 == 0);
#pragma unroll
  for (int nb = 0; nb < NT / 2; ++nb) {
    uint32_t b[4];
    ldmatrix_x4_trans(
        b, rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * pitch + nb * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma_bf16(c[mt][2 * nb], a[mt], b[0], b[1]);
      mma_bf16(c[mt][2 * nb + 1], a[mt], b[2], b[3]);
    }
  }
}

// acc[mt] += c[mt] B over K = 16 KT: c's C fragments (KT k16 steps of two n8 tiles) rounded to
// bf16 as A fragments, B a k-major shared tile of 16 KT rows (mma_nn). P V, dS K.
template <int MT, int KT, int NT>
__device__ __forceinline__ void mma_c_nn(float (&acc)[MT][NT][4], const float (&c)[MT][2 * KT][4],
                                         const bf16* rows, int pitch, int lane) {
#pragma unroll
  for (int kc = 0; kc < KT; ++kc) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) c_to_a<2 * KT>(a[mt], c[mt], kc);
    mma_nn<MT, NT>(acc, a, rows + kc * 16 * pitch, pitch, lane);
  }
}

// Starts copying rows [row0, row0 + ROWS) of a [seq, D] slice (row stride `stride` elements) into
// a shared tile of pitch D + 8 (the pad spreads ldmatrix rows over all banks), THREADS threads
// sharing the work; rows at or past seq become zeros, so masked products never meet garbage
// (0 * NaN).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* base, int64_t stride, int row0,
                                          int seq) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert((ROWS * kChunks) % THREADS == 0);
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / THREADS; ++i) {
    const int c = i * THREADS + static_cast<int>(threadIdx.x);
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + r < seq;
    const bf16* src = base + (valid ? int64_t{row0 + r} * stride : 0) + col;
    cp_async_16(tile + r * (D + 8) + col, src, valid);
  }
}

// Two adjacent elements of an output row: bf16 (the op's outputs) or f32 (a key split's partial
// dk, dv: Note [Attention key split] in core/footprint.h).
__device__ __forceinline__ void store_pair(bf16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void store_pair(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}

// Stores the C fragments of one 16-row warp tile (rows row0 + g, row0 + g + 8 of a [seq, D] slice)
// as bf16 or f32 (T) times `mul`, skipping rows at or past seq.
template <int D, typename T>
__device__ __forceinline__ void store_rows(T* base, int64_t stride, int row0, int seq,
                                           const float (&c)[D / 8][4], float mul, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + (lane >> 2) + 8 * r;
    if (row >= seq) continue;
    T* dst = base + int64_t{row} * stride + 2 * (lane & 3);
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
      store_pair(dst + dn * 8, c[dn][2 * r] * mul, c[dn][2 * r + 1] * mul);
  }
}

// Note [Attention document bounds]: with AttentionShape::key_begin (Geometry::key_begin) the
// query at position i attends keys key_begin[i] .. i of its sequence (Note [Document masking] in
// data/document_masks.h). The kernels mask a score by those bounds wherever a tile may hold a
// key outside them (the diagonal tiles, and the tiles below a row's first key), and skip what no
// query of theirs attends, so that a masked call costs about the keys it attends:
//   - a query block (the forward, the dq pass) starts its key walk at the tile of the smallest
//     first key of its rows (block_min), and each warp skips the tiles below its own rows' first
//     keys (RowBounds::lo) as it skips those above its diagonal;
//   - a key block (the dk/dv pass) walks the query tiles up to the last query that attends any
//     of its keys (last_attending_row) instead of up to the sequence's end.
// With short documents that is the block-diagonal band of the score matrix. Each kernel takes
// DOCS, whether it is given bounds: launched without them (DOCS false) every bound is a constant
// the compiler folds, so that plain causal attention runs the code it ran before bounds existed
// (no bounds in registers, no block-wide minimum, no shared memory for them).
// The first keys of one warp's query rows [row0, row0 + ROWS) of sequence `b`: begin (the
// sequence's key_begin, null without bounds), and the smallest (lo, clamped at 0; INT_MAX when no
// row is below seq) and largest (hi) of the rows below seq; without bounds null, 0 and 0.
struct RowBounds {
  const int32_t* begin;
  int lo, hi;
  // The first key of row `row` (below seq).
  __device__ __forceinline__ int first_key(int row) const {
    return begin != nullptr ? begin[row] : 0;
  }
};
template <int ROWS, bool DOCS>
__device__ __forceinline__ RowBounds warp_row_bounds(const Geometry& g, int b, int row0, int lane) {
  static_assert(ROWS <= 32);
  if constexpr (!DOCS) {
    return {nullptr, 0, 0};
  } else {
    const int32_t* begin = g.key_begin + int64_t{b} * g.seq;
    const int row = row0 + lane;
    const bool valid = lane < ROWS && row < g.seq;
    const int x = valid ? begin[row] : 0;
    return {begin, static_cast<int>(__reduce_min_sync(~0u, valid ? max(x, 0) : INT_MAX)),
            static_cast<int>(__reduce_max_sync(~0u, x))};
  }
}

// The smallest `x` of the block's threads; every thread calls it (it synchronizes the block), at
// most once per kernel.
__device__ __forceinline__ int block_min(int x) {
  __shared__ int s_min;
  if (threadIdx.x == 0) s_min = INT_MAX;
  __syncthreads();
  x = __reduce_min_sync(~0u, x);
  if (threadIdx.x % 32 == 0) atomicMin(&s_min, x);
  __syncthreads();
  return s_min;
}

// The last query row of sequence `b` that attends any key in [k0, k_last]: the largest i >= k0
// with key_begin[i] <= k_last (Note [Attention document bounds]); seq - 1 without bounds. Every
// thread of the block calls it (block_min).
template <int THREADS, bool DOCS>
__device__ __forceinline__ int last_attending_row(const Geometry& g, int b, int k0, int k_last) {
  if constexpr (!DOCS) {
    return g.seq - 1;
  } else {
    const int32_t* begin = g.key_begin + int64_t{b} * g.seq;
    int last = k0;  // the query at k0 attends key k0
    for (int i = k0 + static_cast<int>(threadIdx.x); i < g.seq; i += THREADS) {
      if (begin[i] <= k_last) last = i;
    }
    return -block_min(-last);
  }
}

// The key tiles [first_tile, n_tiles) of a query block, BC keys each, K and V double-buffered in
// s_k and s_v (2 x BC rows of pitch D + 8 and DV + 8; tile first_tile already loading into
// buffer 0): prefetches tile j + 1, waits for tile j, and runs step(k tile, v tile, first key) on
// it unless every key of the tile is above `last_row` (the calling warp's last query row) or
// below `first_key` (the smallest first key of the warp's rows:
// Note [Attention document bounds]).
template <int BC, int D, int DV, int THREADS, typename Step>
__device__ __forceinline__ void walk_key_tiles(bf16* s_k, bf16* s_v, const bf16* k, const bf16* v,
                                               int64_t k_off, int64_t v_off, int first_tile,
                                               int n_tiles, int first_key, int last_row,
                                               const Geometry& g, Step&& step) {
  constexpr int kP = D + 8, kPv = DV + 8;
  for (int j = first_tile; j < n_tiles; ++j) {
    const int buf = (j - first_tile) & 1;
    if (j + 1 < n_tiles) {  // prefetch the next tile into the buffer freed at the end of j - 1
      load_tile<BC, D, THREADS>(s_k + (buf ^ 1) * BC * kP, k + k_off, g.kv_stride, (j + 1) * BC,
                                g.seq);
      load_tile<BC, DV, THREADS>(s_v + (buf ^ 1) * BC * kPv, v + v_off, g.v_stride, (j + 1) * BC,
                                 g.seq);
    }
    cp_async_commit();
    cp_async_wait<1>();  // tile j
    __syncthreads();
    if (j * BC <= last_row && j * BC + BC > first_key) {
      step(s_k + buf * BC * kP, s_v + buf * BC * kPv, j * BC);
    }
    __syncthreads();
  }
}

// The first key tile of a query block whose warps' rows have the smallest first keys `lo`
// (RowBounds::lo): the tile of the block's smallest, below n_tiles; 0 without bounds. Every
// thread of the block calls it.
template <int BC, bool DOCS>
__device__ __forceinline__ int first_key_tile(int lo, int n_tiles) {
  if constexpr (!DOCS) {
    return 0;
  } else {
    return min(block_min(lo) / BC, n_tiles - 1);
  }
}

// The query tile of a forward or pass-1 block: (batch b, head h) from blockIdx.x, rows [q0, q0 +
// BR) from blockIdx.y, the last tile first (its rows see the most keys); the offsets of that
// (batch, head) in q (and dq), in out (and dout), and of its KV head in k and in v; the key tiles
// of BC keys that reach its last row.
struct QueryTile {
  int b, h, q0;
  int64_t q_off, o_off, k_off, v_off;
  int n_tiles;
};
template <int D, int DV, int BR, int BC>
__device__ __forceinline__ QueryTile query_tile(const Geometry& g) {
  const int b = static_cast<int>(blockIdx.x) / g.heads, h = static_cast<int>(blockIdx.x) % g.heads;
  const int q0 = static_cast<int>(gridDim.y - 1 - blockIdx.y) * BR;
  return {b,
          h,
          q0,
          int64_t{b} * g.seq * g.q_stride + int64_t{h} * D,
          int64_t{b} * g.seq * g.o_stride + int64_t{h} * DV,
          int64_t{b} * g.seq * g.kv_stride + int64_t{h / g.group} * D,
          int64_t{b} * g.seq * g.v_stride + int64_t{h / g.group} * DV,
          min((q0 + BR + BC - 1) / BC, (g.seq + BC - 1) / BC)};
}

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------

inline const bf16* cptr(const Tensor& t) { return static_cast<const bf16*>(t.raw_data()); }
inline bf16* mptr(const Tensor& t) { return static_cast<bf16*>(t.raw_data()); }

// Raises a kernel's dynamic shared-memory limit once per process (above the default 48 KiB).
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  TANDEM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

inline unsigned tiles(int seq, int tile) { return static_cast<unsigned>((seq + tile - 1) / tile); }

// Note [Attention variants]: the D 64 tensor-core kernels come in a few tile shapes, so that one
// benchmark run on the GPU can time them all (bench/attention_timing). Index 0 is the default;
// --attention-forward-variant / --attention-backward-variant (Note [Performance settings] in
// core/tuning.h) pick another, and select_attention_variants (benchmarks, tests) overrides both.
// D 128 (and q/k 192 with v 128) has a forward table of its own (--attention-forward128-variant,
// select_attention_forward128_variant), and takes the backward form (deterministic or one-pass)
// the D 64 choice names; its deterministic backward has tilings of its own
// (--attention-backward128-variant, select_attention_backward128_variant).
// Names: w<warps>_q<query rows>_k<keys>_m<blocks per SM (__launch_bounds__)>.
using ForwardLaunch = void (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Geometry&);
using BackwardLaunch = void (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&, const Geometry&);
template <typename Launch>
struct Variant {
  const char* name;
  Launch launch;
};
template <typename Launch, size_t N>
std::vector<const char*> variant_names(const Variant<Launch> (&table)[N]) {
  std::vector<const char*> names;
  for (const Variant<Launch>& v : table) names.push_back(v.name);
  return names;
}

// attention_backward.cu: the backward table's names (index 0, the default, is the two-pass
// form), and the tensor-core backward (fast_path's head dims) of `variant`: D 64 the table's
// entry, D 128 its deterministic form for a deterministic entry and its one-pass form otherwise,
// q/k 192 with v 128 the deterministic form always.
std::vector<const char*> backward_variant_names();
// The D 128 deterministic backward's tilings (index 0 the default).
std::vector<const char*> backward128_variant_names();
void launch_tensor_core_backward(int variant, int variant128, const Tensor& dq, const Tensor& dk,
                                 const Tensor& dv, const Tensor& dout, const Tensor& q,
                                 const Tensor& k, const Tensor& v, const Tensor& out,
                                 const Tensor& lse, const Tensor& delta, const Geometry& g);

}  // namespace tandem::ops::cuda::attn
