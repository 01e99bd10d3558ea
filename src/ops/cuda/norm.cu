// CUDA RMSNorm, bf16 activations with fp32 math (rope: rope.cu). The norm's dg is reduced per
// block and then across blocks in a fixed order, so every result is bitwise reproducible run to
// run on one GPU (no float atomics).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements of a vector: 16 bytes of bf16, two float4 of f32 (common.cuh)
constexpr int kRowsPerBlock = kThreads / 32;  // warp-per-row kernels: rows a block holds (their
                                              // stride and the dx kernel's shared dg rows)
constexpr int kMaxWarpCache = 4;  // warp-per-row kernels: up to 32 * 8 * 4 = 1024 columns

// ---- rmsnorm forward: one warp per row ----

// Rows of at most 32 * 8 * kMaxWarpCache columns (the dense models): a grid of one wave of
// resident blocks whose warps stride over the rows, as the backward's
// (Note [Norm backward grid]). A warp holds g as f32 in registers for all its rows and loads its
// next row before it reduces the current one, so every warp keeps a row's loads in flight until its
// last row.
template <typename TG, int kCache>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_warp_kernel(bf16* y, float* rstd, const bf16* x, const TG* g, int64_t n,
                                int64_t h, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = h / kVec, stride = int64_t{gridDim.x} * kRowsPerBlock;
  int64_t row = warp_row();
  if (row >= n) return;  // no barriers below
  // Lane l holds groups of 8 l + 32 m (m < kCache), which cover the row.
  auto load_row = [&](int64_t r, uint4(&raw)[kCache]) {
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) raw[m] = *reinterpret_cast<const uint4*>(x + r * h + c * kVec);
    }
  };
  uint4 cur[kCache], next[kCache] = {};
  load_row(row, cur);
  float gv[kCache][kVec];
#pragma unroll
  for (int m = 0; m < kCache; ++m) {
    const int64_t c = lane + 32 * m;
    if (c < groups) load_vec(g + c * kVec, gv[m]);
  }
  for (; row < n; row += stride) {
    if (row + stride < n) load_row(row + stride, next);
    float ss = 0;
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      if (lane + 32 * m < groups) {
        float v[kVec];
        unpack8(cur[m], v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) ss = fmaf(v[j], v[j], ss);
      }
    }
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
    if (lane == 0) rstd[row] = rs;
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) {
        float v[kVec], out[kVec];
        unpack8(cur[m], v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) out[j] = v[j] * rs * gv[m][j];
        store_vec(y + row * h + c * kVec, out);
      }
    }
#pragma unroll
    for (int m = 0; m < kCache; ++m) cur[m] = next[m];
  }
}

// Wider rows, one warp per row and a block per 8 rows. kCache > 0: the row's groups of 8
// (lane + 32 m, m < kCache) stay in registers between the two passes; 0: the second pass reloads
// them (rows wider than 32 * 8 * 16).
template <typename TG, int kCache>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_vec_kernel(bf16* y, float* rstd, const bf16* x, const TG* g, int64_t n,
                               int64_t h, float eps) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const int64_t groups = h / kVec;
  const bf16* xr = x + row * h;
  bf16* yr = y + row * h;
  uint4 cache[kCache > 0 ? kCache : 1];
  float ss = 0;
  if constexpr (kCache > 0) {
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) {
        cache[m] = *reinterpret_cast<const uint4*>(xr + c * kVec);
        float v[kVec];
        unpack8(cache[m], v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) ss = fmaf(v[j], v[j], ss);
      }
    }
  } else {
#pragma unroll 4
    for (int64_t c = lane; c < groups; c += 32) {
      float v[kVec];
      load_vec(xr + c * kVec, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) ss = fmaf(v[j], v[j], ss);
    }
  }
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
  if (lane == 0) rstd[row] = rs;
  auto finish = [&](int64_t c, const float(&v)[kVec]) {
    float gv[kVec], out[kVec];
    load_vec(g + c * kVec, gv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = v[j] * rs * gv[j];
    store_vec(yr + c * kVec, out);
  };
  if constexpr (kCache > 0) {
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) {
        float v[kVec];
        unpack8(cache[m], v);
        finish(c, v);
      }
    }
  } else {
    for (int64_t c = lane; c < groups; c += 32) {
      float v[kVec];
      load_vec(xr + c * kVec, v);
      finish(c, v);
    }
  }
}

// Any width and alignment: scalar loads, the second pass reloads.
template <typename TG>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_scalar_kernel(bf16* y, float* rstd, const bf16* x, const TG* g, int64_t n,
                                  int64_t h, float eps) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const bf16* xr = x + row * h;
  bf16* yr = y + row * h;
  float ss = 0;
  for (int64_t c = lane; c < h; c += 32) {
    const float v = load1(xr + c);
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
  if (lane == 0) rstd[row] = rs;
  for (int64_t c = lane; c < h; c += 32) store1(yr + c, load1(xr + c) * rs * load1(g + c));
}

// ---- rmsnorm backward ----
//
// Rows of at most 32 * 8 * kMaxWarpCache columns: one warp per row, each lane holding its
// columns' dg in registers; other rows: one block per row, each thread owning fixed columns whose
// dg it keeps in shared memory. Either way no two threads add into one dg column: each block
// writes its dg to partial[block, :] and rmsnorm_dg_kernel adds the blocks up in a fixed order.
//
// Note [Norm backward grid]: the warp-per-row kernel is bound by HBM (dy and x read, dx written
// and, when adding, read: 6 or 8 bytes a column), so it needs many bytes in flight and few
// dependent round trips: a lane issues all its 16-byte loads of a row (dy, x and the dx it adds
// to, up to 3 * kMaxWarpCache) before the row's one shuffle reduction, and up to 3 groups per
// lane (h <= 768) it loads the warp's next row before reducing the current one. The grid is one
// wave of resident blocks, each striding over rows. One wave keeps the partials to (blocks
// resident at once) rows of h floats, 0.8 MB at h = 768 on an H200 (2 blocks of 256 threads per
// SM), which rmsnorm_dg_kernel reads in one round trip per thread; a block per 4 rows (the
// block-per-row kernel h = 768 used to take) made it 8x that, latency-bound. H up to 1024 (the
// dense models) is warp per row, as a block per row costs two barriers per row.

struct BackwardArgs {
  bf16* dx;
  float* partial;  // [gridDim.x, h]
  const bf16* dy;
  const bf16* x;
  const float* rstd;
  int64_t n, h;
  bool add;
};

// One row of the warp-per-row backward as lane l loaded it: groups of 8 l + 32 m, m < kCache.
template <int kCache>
struct BackwardRow {
  uint4 dy[kCache], x[kCache], dx[kCache];  // dx: what the row adds to (Accumulate::kAdd)
  float rs;
};

// dx = r g dy - (r^3 / H) x sum_i(dy_i g_i x_i); dg += dy x r. One warp per row (rows strided
// over the grid); lane l holds groups of 8 l + 32 m (m < kCache), which cover the row, and their
// dg in registers. g waits in shared memory as f32, not in registers: at kCache = 3 those 24 more
// registers per thread would leave one block per SM (Note [Norm backward grid]). kPrefetch: the
// next row is loaded before the current one is reduced (twice the row registers).
template <typename TG, int kCache, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, 2)
    rmsnorm_backward_warp_kernel(BackwardArgs a, const TG* g) {
  extern __shared__ float4 dg_shared[];  // [kRowsPerBlock, h]: each warp's dg; then g [h] f32
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t groups = a.h / kVec, stride = int64_t{gridDim.x} * kRowsPerBlock;
  float* sdg = reinterpret_cast<float*>(dg_shared);
  float* sg = sdg + kRowsPerBlock * a.h;
  auto load_row = [&](int64_t row, BackwardRow<kCache>& d) {
    d.rs = a.rstd[row];
    const int64_t off = row * a.h + lane * kVec;
    const uint4* dy = reinterpret_cast<const uint4*>(a.dy + off);
    const uint4* x = reinterpret_cast<const uint4*>(a.x + off);
    const uint4* dx = reinterpret_cast<const uint4*>(a.dx + off);
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      if (lane + 32 * m < groups) {
        d.dy[m] = dy[32 * m];
        d.x[m] = x[32 * m];
        if (a.add) d.dx[m] = dx[32 * m];
      }
    }
  };
  int64_t row = warp_row();
  BackwardRow<kCache> cur, next;
  if (row < a.n) load_row(row, cur);
  for (int64_t c = threadIdx.x; c < groups; c += blockDim.x) {
    float gv[kVec];
    load_vec(g + c * kVec, gv);
    store_vec(sg + c * kVec, gv);
  }
  float acc[kCache][kVec] = {};
  __syncthreads();
  for (; row < a.n; row += stride) {
    const bool more = row + stride < a.n;
    if (kPrefetch && more) load_row(row + stride, next);
    const float rs = cur.rs;
    float dot = 0;
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) {
        float dyv[kVec], xv[kVec], gv[kVec];
        unpack8(cur.dy[m], dyv);
        unpack8(cur.x[m], xv);
        load_vec(sg + c * kVec, gv);
#pragma unroll
        for (int j = 0; j < kVec; ++j) dot += dyv[j] * gv[j] * xv[j];
      }
    }
    dot = warp_sum(dot);
    __syncwarp();  // a memory fence: g is read again below, not held in registers over the sum
    const float coef = dot * rs * rs * rs / static_cast<float>(a.h);
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) {
        float dyv[kVec], xv[kVec], gv[kVec], d[kVec], old[kVec];
        unpack8(cur.dy[m], dyv);
        unpack8(cur.x[m], xv);
        load_vec(sg + c * kVec, gv);
        if (a.add) unpack8(cur.dx[m], old);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          d[j] = dyv[j] * gv[j] * rs - coef * xv[j];
          if (a.add) d[j] += old[j];
          acc[m][j] += dyv[j] * xv[j] * rs;
        }
        store_vec(a.dx + row * a.h + c * kVec, d);
      }
    }
    if (kPrefetch)
      cur = next;
    else if (more)
      load_row(row + stride, cur);
  }
#pragma unroll
  for (int m = 0; m < kCache; ++m) {
    const int64_t c = lane + 32 * m;
    if (c < groups) store_vec(sdg + warp * a.h + c * kVec, acc[m]);
  }
  __syncthreads();
  float* out = a.partial + int64_t{blockIdx.x} * a.h;
  for (int64_t c = threadIdx.x; c < a.h; c += blockDim.x) {
    float s = 0;
#pragma unroll
    for (int w = 0; w < kRowsPerBlock; ++w) s += sdg[w * a.h + c];
    out[c] = s;
  }
}

// dx = r g dy - (r^3 / H) x sum_i(dy_i g_i x_i); dg += dy x r. kCache > 0: the thread's groups
// (threadIdx.x + blockDim.x * m, m < kCache) stay in registers between the passes.
template <typename TG, int kCache>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_vec_kernel(BackwardArgs a, const TG* g) {
  extern __shared__ float4 dg_shared[];  // [h / 4]
  __shared__ float red[32];
  float* sdg = reinterpret_cast<float*>(dg_shared);
  const int64_t groups = a.h / kVec, t = threadIdx.x, nt = blockDim.x;
  for (int64_t c = t; c < groups; c += nt) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) sdg[c * kVec + j] = 0.0f;
  }
  float gc[kCache > 0 ? kCache : 1][kVec];
  if constexpr (kCache > 0) {
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      if (t + nt * m < groups) load_vec(g + (t + nt * m) * kVec, gc[m]);
    }
  }
  // Pass 2 of one group: dx and this thread's dg columns.
  auto finish = [&](int64_t c, int64_t row, const float(&dyv)[kVec], const float(&xv)[kVec],
                    const float(&gv)[kVec], float rs, float coef) {
    float d[kVec], old[kVec];
    bf16* dxp = a.dx + row * a.h + c * kVec;
    if (a.add) load_vec(dxp, old);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      d[j] = dyv[j] * gv[j] * rs - coef * xv[j];
      if (a.add) d[j] += old[j];
      sdg[c * kVec + j] += dyv[j] * xv[j] * rs;
    }
    store_vec(dxp, d);
  };
  for (int64_t row = blockIdx.x; row < a.n; row += gridDim.x) {
    const float rs = a.rstd[row];
    const bf16* dyr = a.dy + row * a.h;
    const bf16* xr = a.x + row * a.h;
    float dot = 0;
    uint4 cdy[kCache > 0 ? kCache : 1], cx[kCache > 0 ? kCache : 1];
    if constexpr (kCache > 0) {
#pragma unroll
      for (int m = 0; m < kCache; ++m) {
        const int64_t c = t + nt * m;
        if (c < groups) {
          cdy[m] = *reinterpret_cast<const uint4*>(dyr + c * kVec);
          cx[m] = *reinterpret_cast<const uint4*>(xr + c * kVec);
          float dyv[kVec], xv[kVec];
          unpack8(cdy[m], dyv);
          unpack8(cx[m], xv);
#pragma unroll
          for (int j = 0; j < kVec; ++j) dot += dyv[j] * gc[m][j] * xv[j];
        }
      }
    } else {
      for (int64_t c = t; c < groups; c += nt) {
        float dyv[kVec], xv[kVec], gv[kVec];
        load_vec(dyr + c * kVec, dyv);
        load_vec(xr + c * kVec, xv);
        load_vec(g + c * kVec, gv);
#pragma unroll
        for (int j = 0; j < kVec; ++j) dot += dyv[j] * gv[j] * xv[j];
      }
    }
    dot = block_sum(dot, red);
    const float coef = dot * rs * rs * rs / static_cast<float>(a.h);
    if constexpr (kCache > 0) {
#pragma unroll
      for (int m = 0; m < kCache; ++m) {
        const int64_t c = t + nt * m;
        if (c < groups) {
          float dyv[kVec], xv[kVec];
          unpack8(cdy[m], dyv);
          unpack8(cx[m], xv);
          finish(c, row, dyv, xv, gc[m], rs, coef);
        }
      }
    } else {
      for (int64_t c = t; c < groups; c += nt) {
        float dyv[kVec], xv[kVec], gv[kVec];
        load_vec(dyr + c * kVec, dyv);
        load_vec(xr + c * kVec, xv);
        load_vec(g + c * kVec, gv);
        finish(c, row, dyv, xv, gv, rs, coef);
      }
    }
  }
  __syncthreads();
  float* out = a.partial + int64_t{blockIdx.x} * a.h;
  for (int64_t c = t; c < a.h; c += nt) out[c] = sdg[c];
}

// Any width and alignment: thread t owns columns t, t + blockDim.x, ...
template <typename TG>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_scalar_kernel(BackwardArgs a, const TG* g) {
  extern __shared__ float4 dg_shared[];  // [h] floats
  __shared__ float red[32];
  float* sdg = reinterpret_cast<float*>(dg_shared);
  const int64_t t = threadIdx.x, nt = blockDim.x;
  for (int64_t c = t; c < a.h; c += nt) sdg[c] = 0.0f;
  for (int64_t row = blockIdx.x; row < a.n; row += gridDim.x) {
    const float rs = a.rstd[row];
    const bf16* dyr = a.dy + row * a.h;
    const bf16* xr = a.x + row * a.h;
    bf16* dxr = a.dx + row * a.h;
    float dot = 0;
    for (int64_t c = t; c < a.h; c += nt) dot += load1(dyr + c) * load1(g + c) * load1(xr + c);
    dot = block_sum(dot, red);
    const float coef = dot * rs * rs * rs / static_cast<float>(a.h);
    for (int64_t c = t; c < a.h; c += nt) {
      const float dyv = load1(dyr + c), xv = load1(xr + c);
      float d = dyv * load1(g + c) * rs - coef * xv;
      if (a.add) d += load1(dxr + c);
      sdg[c] += dyv * xv * rs;
      store1(dxr + c, d);
    }
  }
  __syncthreads();
  float* out = a.partial + int64_t{blockIdx.x} * a.h;
  for (int64_t c = t; c < a.h; c += nt) out[c] = sdg[c];
}

// dg[c] += sum over blocks b of partial[b, c]. Block (32, 32): 32 columns, 32 strided slices of
// the blocks, the slices combined in order (a fixed order for a given grid). A thread issues up
// to kSliceLoads loads before it adds any, so up to 32 * kSliceLoads partials (one wave of the
// backward's blocks) take one round trip.
constexpr int kSlices = 32, kSliceLoads = 16;
__global__ void __launch_bounds__(32 * kSlices)
    rmsnorm_dg_kernel(float* dg, const float* partial, int blocks, int64_t h) {
  __shared__ float slice[kSlices][33];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  float s = 0;
  if (c < h) {
    for (int b0 = threadIdx.y; b0 < blocks; b0 += kSlices * kSliceLoads) {
      float v[kSliceLoads];
#pragma unroll
      for (int k = 0; k < kSliceLoads; ++k) {
        const int b = b0 + k * kSlices;
        v[k] = b < blocks ? partial[int64_t{b} * h + c] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kSliceLoads; ++k) s += v[k];
    }
  }
  slice[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < h) {
    float total = 0;
#pragma unroll
    for (int y = 0; y < kSlices; ++y) total += slice[y][threadIdx.x];
    dg[c] += total;
  }
}

// Lets a kernel use up to kMaxDynamicShared bytes of dynamic shared memory when it needs more
// than the default allows (48 KiB, static shared memory included). Always the same value, so
// threads launching concurrently never lower each other's limit.
constexpr int kMaxDynamicShared = 210 * 1024;
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 32 * 1024) {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           kMaxDynamicShared));
  }
}

// The blocks of `threads` threads and `shared_bytes` of dynamic shared memory that are resident
// on the GPU at once (one wave), at most `wanted`; at least 1.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int threads, size_t shared_bytes, int64_t wanted) {
  int per_sm = 0;
  TANDEM_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes));
  const int64_t wave = int64_t{std::max(per_sm, 1)} * tandem::cuda::multiprocessor_count();
  return std::max<int64_t>(1, std::min(wanted, wave));
}

// The backward's dg partials [blocks, h] f32, borrowed from the stream's scratch workspace
// (Note [Op scratch], scratch.h); the caller sized `blocks` to fit it.
float* dg_partials(int64_t blocks, int64_t h) {
  TANDEM_ASSERT(blocks * h * int64_t{sizeof(float)} <=
                    static_cast<int64_t>(tandem::cuda::cublaslt_workspace_bytes()),
                "rmsnorm_backward partials exceed the scratch workspace");
  return static_cast<float*>(tandem::cuda::cublaslt_workspace(stream()));
}

// One rmsnorm backward: the chosen kernel over a grid sized as Note [Norm backward grid] says,
// then the partials added into dg. Arguments checked by rmsnorm_backward.
struct BackwardLaunch {
  BackwardArgs args;  // partial filled in by run()
  float* dg;          // [h] f32, added to
  int threads;
  int64_t shared_bytes;
  bool warp_rows;

  template <typename Kernel, typename TG>
  void run(Kernel kernel, const TG* g) {
    allow_shared(kernel, static_cast<size_t>(shared_bytes));
    const int64_t n = args.n, h = args.h, sms = tandem::cuda::multiprocessor_count();
    // Warp per row: one wave. Block per row: several rows a block, the partials small next to dx.
    const int64_t wanted = warp_rows
                               ? resident_blocks(kernel, threads, static_cast<size_t>(shared_bytes),
                                                 row_blocks(n, threads))
                               : std::min((n + 3) / 4, std::min(32, 2048 / threads) * sms);
    const int64_t fit = static_cast<int64_t>(tandem::cuda::cublaslt_workspace_bytes()) /
                        (h * int64_t{sizeof(float)});
    const int64_t blocks = std::max<int64_t>(1, std::min(wanted, fit));
    args.partial = dg_partials(blocks, h);
    kernel<<<static_cast<unsigned>(blocks), threads, shared_bytes, stream()>>>(args, g);
    TANDEM_CUDA_CHECK_LAUNCH();
    rmsnorm_dg_kernel<<<static_cast<unsigned>((h + 31) / 32), dim3(32, kSlices), 0, stream()>>>(
        dg, args.partial, static_cast<int>(blocks), h);
    TANDEM_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

// ---- rmsnorm ----

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& g,
                     double eps) {
  const char* op = "rmsnorm_forward";
  expect_cuda_rank(op, "x", x, {DType::kBF16}, 2);
  const int64_t n = x.size(0), h = x.size(1);
  expect_cuda(op, "g", g, {DType::kF32, DType::kBF16}, {h});
  expect_cuda(op, "y", y, {DType::kBF16}, {n, h});
  expect_cuda(op, "rstd", rstd, {DType::kF32}, {n});
  TANDEM_CHECK(h >= 1, op, ": x has no columns");
  if (n == 0) return;
  const bool vec = h % kVec == 0 && aligned16(y.raw_data()) && aligned16(x.raw_data()) &&
                   aligned16(g.raw_data());
  const int64_t lane_groups = (h / kVec + 31) / 32;     // groups of 8 per lane
  const int64_t warp_blocks = row_blocks(n, kThreads);  // a warp a row
  auto* py = static_cast<bf16*>(y.raw_data());
  auto* pr = rstd.data<float>();
  const auto* px = static_cast<const bf16*>(x.raw_data());
  const float e = static_cast<float>(eps);
  dispatch_act(g.dtype(), [&](auto tg) {
    using TG = typename decltype(tg)::type;
    const TG* pg = static_cast<const TG*>(g.raw_data());
    // A block per 8 rows, or (warp kernels) one wave of blocks striding over them.
    auto launch = [&](auto kernel, bool one_wave) {
      const int64_t blocks =
          one_wave ? resident_blocks(kernel, kThreads, 0, warp_blocks) : warp_blocks;
      kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(py, pr, px, pg, n, h, e);
      TANDEM_CUDA_CHECK_LAUNCH();
    };
    if (!vec)
      launch(rmsnorm_forward_scalar_kernel<TG>, false);
    else if (lane_groups <= 1)
      launch(rmsnorm_forward_warp_kernel<TG, 1>, true);
    else if (lane_groups <= 2)
      launch(rmsnorm_forward_warp_kernel<TG, 2>, true);
    else if (lane_groups <= 3)
      launch(rmsnorm_forward_warp_kernel<TG, 3>, true);
    else if (lane_groups <= kMaxWarpCache)
      launch(rmsnorm_forward_warp_kernel<TG, 4>, true);
    else if (lane_groups <= 8)
      launch(rmsnorm_forward_vec_kernel<TG, 8>, false);
    else if (lane_groups <= 16)
      launch(rmsnorm_forward_vec_kernel<TG, 16>, false);
    else
      launch(rmsnorm_forward_vec_kernel<TG, 0>, false);
  });
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dg, const Tensor& dy, const Tensor& x,
                      const Tensor& g, const Tensor& rstd, Accumulate acc_dx) {
  const char* op = "rmsnorm_backward";
  expect_cuda_rank(op, "x", x, {DType::kBF16}, 2);
  const int64_t n = x.size(0), h = x.size(1);
  expect_cuda(op, "g", g, {DType::kF32, DType::kBF16}, {h});
  expect_cuda(op, "dg", dg, {DType::kF32}, {h});
  expect_cuda(op, "dy", dy, {DType::kBF16}, {n, h});
  expect_cuda(op, "dx", dx, {DType::kBF16}, {n, h});
  expect_cuda(op, "rstd", rstd, {DType::kF32}, {n});
  constexpr int64_t kMaxColumns = 50 * 1024;  // dg of a row in kMaxDynamicShared bytes
  TANDEM_CHECK(h <= kMaxColumns, op, ": hidden size ", h, " is above the ", kMaxColumns,
               " columns whose dg one block can hold in shared memory");
  if (n == 0 || h == 0) return;
  const bool vec = h % kVec == 0 && aligned16(dx.raw_data()) && aligned16(dy.raw_data()) &&
                   aligned16(x.raw_data()) && aligned16(g.raw_data());
  const int64_t units = vec ? h / kVec : h;  // groups of 8, or columns
  const int64_t lane_groups = (units + 31) / 32;
  BackwardLaunch l;
  l.warp_rows = vec && lane_groups <= kMaxWarpCache;
  // Block per row: threads share the row's units. Warp per row: 8 rows at a time.
  l.threads =
      l.warp_rows ? kThreads : static_cast<int>(std::min<int64_t>(kThreads, lane_groups * 32));
  const int64_t per_thread = (units + l.threads - 1) / l.threads;
  l.shared_bytes = (l.warp_rows ? kRowsPerBlock + 1 : 1) * h * int64_t{sizeof(float)};
  l.args = BackwardArgs{static_cast<bf16*>(dx.raw_data()),
                        nullptr,
                        static_cast<const bf16*>(dy.raw_data()),
                        static_cast<const bf16*>(x.raw_data()),
                        rstd.data<float>(),
                        n,
                        h,
                        acc_dx == Accumulate::kAdd};
  l.dg = dg.data<float>();
  dispatch_act(g.dtype(), [&](auto tg) {
    using TG = typename decltype(tg)::type;
    const TG* pg = static_cast<const TG*>(g.raw_data());
    if (!vec)
      l.run(rmsnorm_backward_scalar_kernel<TG>, pg);
    else if (l.warp_rows && lane_groups <= 1)
      l.run(rmsnorm_backward_warp_kernel<TG, 1, true>, pg);
    else if (l.warp_rows && lane_groups <= 2)
      l.run(rmsnorm_backward_warp_kernel<TG, 2, true>, pg);
    else if (l.warp_rows && lane_groups <= 3)
      l.run(rmsnorm_backward_warp_kernel<TG, 3, true>, pg);
    else if (l.warp_rows)
      l.run(rmsnorm_backward_warp_kernel<TG, kMaxWarpCache, false>, pg);
    else if (per_thread <= 1)
      l.run(rmsnorm_backward_vec_kernel<TG, 1>, pg);
    else if (per_thread <= 2)
      l.run(rmsnorm_backward_vec_kernel<TG, 2>, pg);
    else if (per_thread <= 4)
      l.run(rmsnorm_backward_vec_kernel<TG, 4>, pg);
    else
      l.run(rmsnorm_backward_vec_kernel<TG, 0>, pg);
  });
}

}  // namespace tandem::ops::cuda
