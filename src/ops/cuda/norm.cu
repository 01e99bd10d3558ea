// CUDA RMSNorm and rotary position embedding (HF rotate_half form, MODEL.md), bf16 activations
// with fp32 math. The norm's dg is reduced per block and then across blocks in a fixed order, so
// every result is bitwise reproducible run to run on one GPU (no float atomics).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements of a vector: 16 bytes of bf16, two float4 of f32 (common.cuh)
constexpr int kRowsPerBlock = kThreads / 32;  // warp-per-row kernels: rows a block holds
constexpr int kMaxWarpCache = 4;  // backward: warp per row up to 32 * 8 * 4 = 1024 columns

// ---- rmsnorm forward: one warp per row ----

// kCache > 0: the row's groups of 8 (lane + 32 m, m < kCache) stay in registers between the two
// passes; 0: the second pass reloads them (rows wider than 32 * 8 * 16).
template <typename TG, int kCache>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_vec_kernel(bf16* y, float* rstd, const bf16* x, const TG* g, int64_t n,
                               int64_t h, float eps) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + (threadIdx.x >> 5);
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
  auto finish = [&](int64_t c, const float (&v)[kVec]) {
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
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + (threadIdx.x >> 5);
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
// Note [Norm backward grid]: the warp-per-row kernel is bound by HBM (dy and x read, dx written:
// 6 bytes a column), so it needs many bytes in flight, not many blocks: a lane issues all its
// 16-byte loads of dy and x (up to 2 * kMaxWarpCache) before the row's one shuffle reduction, and
// the grid is one wave of resident blocks, each striding over rows. One wave keeps the partials
// to (blocks resident at once) rows of h floats, 0.8 MB at h = 768 on an H200 (2 blocks of 256
// threads per SM), which rmsnorm_dg_kernel reads in two round trips per thread; a block per 4
// rows (the block-per-row kernel h = 768 used to take) made it 8x that, latency-bound. H up to
// 1024 (the dense models) is warp per row, as a block per row costs two barriers per row.

struct BackwardArgs {
  bf16* dx;
  float* partial;  // [gridDim.x, h]
  const bf16* dy;
  const bf16* x;
  const float* rstd;
  int64_t n, h;
  bool add;
};

// dx = r g dy - (r^3 / H) x sum_i(dy_i g_i x_i); dg += dy x r. One warp per row (rows strided
// over the grid); lane l holds groups of 8 l + 32 m (m < kCache), which cover the row, and their
// dg in registers. g waits in shared memory as f32, not in registers: at kCache = 4 those 32 more
// registers per thread would leave one block per SM (Note [Norm backward grid]).
template <typename TG, int kCache>
__global__ void __launch_bounds__(kThreads, 2)
    rmsnorm_backward_warp_kernel(BackwardArgs a, const TG* g) {
  extern __shared__ float4 dg_shared[];  // [kRowsPerBlock, h]: each warp's dg; then g [h] f32
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t groups = a.h / kVec;
  float* sdg = reinterpret_cast<float*>(dg_shared);
  float* sg = sdg + kRowsPerBlock * a.h;
  for (int64_t c = threadIdx.x; c < groups; c += blockDim.x) {
    float gv[kVec];
    load_vec(g + c * kVec, gv);
    store_vec(sg + c * kVec, gv);
  }
  float acc[kCache][kVec] = {};
  __syncthreads();
  for (int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + warp; row < a.n;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    const float rs = a.rstd[row];
    const bf16* dyr = a.dy + row * a.h;
    const bf16* xr = a.x + row * a.h;
    bf16* dxr = a.dx + row * a.h;
    uint4 cdy[kCache], cx[kCache];
    float dot = 0;
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) {
        cdy[m] = *reinterpret_cast<const uint4*>(dyr + c * kVec);
        cx[m] = *reinterpret_cast<const uint4*>(xr + c * kVec);
        float dyv[kVec], xv[kVec], gv[kVec];
        unpack8(cdy[m], dyv);
        unpack8(cx[m], xv);
        load_vec(sg + c * kVec, gv);
#pragma unroll
        for (int j = 0; j < kVec; ++j) dot += dyv[j] * gv[j] * xv[j];
      }
    }
    dot = warp_sum(dot);
    const float coef = dot * rs * rs * rs / static_cast<float>(a.h);
#pragma unroll
    for (int m = 0; m < kCache; ++m) {
      const int64_t c = lane + 32 * m;
      if (c < groups) {
        float dyv[kVec], xv[kVec], gv[kVec], d[kVec], old[kVec];
        unpack8(cdy[m], dyv);
        unpack8(cx[m], xv);
        load_vec(sg + c * kVec, gv);
        if (a.add) load_vec(dxr + c * kVec, old);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          d[j] = dyv[j] * gv[j] * rs - coef * xv[j];
          if (a.add) d[j] += old[j];
          acc[m][j] += dyv[j] * xv[j] * rs;
        }
        store_vec(dxr + c * kVec, d);
      }
    }
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
  auto finish = [&](int64_t c, int64_t row, const float (&dyv)[kVec], const float (&xv)[kVec],
                    const float (&gv)[kVec], float rs, float coef) {
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
// the blocks, the slices combined in order (a fixed order for a given grid).
constexpr int kSlices = 32;
__global__ void __launch_bounds__(32 * kSlices)
    rmsnorm_dg_kernel(float* dg, const float* partial, int blocks, int64_t h) {
  __shared__ float slice[kSlices][33];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  float s = 0;
  if (c < h) {
#pragma unroll 8
    for (int b = threadIdx.y; b < blocks; b += kSlices) s += partial[int64_t{b} * h + c];
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

// ---- rope ----

constexpr int kHeadsPerThread = 4;  // a thread's cos/sin serve this many heads
constexpr int64_t kMaxHeadDim = 512;

// cos and sign * sin of ang (radians, formed in double as the CPU does): reduced to [-pi, pi] in
// double, then the fast single-precision pair (absolute error below 2^-21.4 there).
__device__ __forceinline__ void rope_cos_sin(double ang, float sign, float& c, float& s) {
  const double turns = rint(ang * 0.15915494309189535);  // 1 / (2 pi)
  const float r = static_cast<float>(fma(-turns, 6.283185307179586, ang));
  __sincosf(r, &s, &c);
  s *= sign;
}

template <int kV>
__device__ __forceinline__ void load_v(const bf16* p, float (&v)[kV]) {
  if constexpr (kV == kVec) load_vec(p, v);
  else v[0] = load1(p);
}
template <int kV>
__device__ __forceinline__ void store_v(bf16* p, const float (&v)[kV]) {
  if constexpr (kV == kVec) store_vec(p, v);
  else store1(p, v[0]);
}

// One thread per (row, group of kV rotation pairs, chunk of heads): out1 = u1 c - u2 s,
// out2 = u2 c + u1 s with u1 = x[i], u2 = x[i + D/2]. Both halves are read before either is
// written, and no other thread touches them, so out may alias x.
template <int kV>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(bf16* out, const bf16* x, int64_t n, int64_t seq, int heads, int head_dim,
                double theta, double freq_step, float sign) {
  const int half = head_dim / 2, groups = half / kV;
  const int chunks = (heads + kHeadsPerThread - 1) / kHeadsPerThread;
  const int64_t total = n * chunks * groups, width = int64_t{heads} * head_dim;
  for (int64_t t = global_thread(); t < total; t += grid_threads()) {
    const int grp = static_cast<int>(t % groups);
    const int64_t rest = t / groups;
    const int chunk = static_cast<int>(rest % chunks);
    const int64_t row = rest / chunks;
    const int i0 = grp * kV;
    const double pos = static_cast<double>(row % seq);
    // inv_freq[i] = theta^(-2i/D) as the CPU forms it for i0, then times theta^(-2/D) per step
    // (a few double ulps apart from pow: ~1e-12 rad at position 4096).
    double inv_freq = pow(theta, -2.0 * i0 / head_dim);
    float c[kV], s[kV];
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      rope_cos_sin(pos * inv_freq, sign, c[e], s[e]);
      inv_freq *= freq_step;
    }
    const int h_end = min(heads, (chunk + 1) * kHeadsPerThread);
    for (int hd = chunk * kHeadsPerThread; hd < h_end; ++hd) {
      const int64_t base = row * width + int64_t{hd} * head_dim + i0;
      float u1[kV], u2[kV], o1[kV], o2[kV];
      load_v<kV>(x + base, u1);
      load_v<kV>(x + base + half, u2);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        o1[e] = u1[e] * c[e] - u2[e] * s[e];
        o2[e] = u2[e] * c[e] + u1[e] * s[e];
      }
      store_v<kV>(out + base, o1);
      store_v<kV>(out + base + half, o2);
    }
  }
}

void rope_apply(const char* op, const Tensor& out, const Tensor& x, int64_t seq, int64_t heads,
                int64_t head_dim, double theta, float sign) {
  expect_cuda_rank(op, "x", x, {DType::kBF16}, 2);
  TANDEM_CHECK(seq >= 1, op, ": seq is ", seq, ", expected at least 1");
  TANDEM_CHECK(heads >= 1 && heads <= (int64_t{1} << 24), op, ": heads is ", heads,
               ", expected 1 to 2^24");
  TANDEM_CHECK(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= kMaxHeadDim, op, ": head_dim ",
               head_dim, " must be even and in [2, ", kMaxHeadDim, "]");
  TANDEM_CHECK(x.size(1) == heads * head_dim, op, ": x has ", x.size(1),
               " columns; expected heads * head_dim = ", heads * head_dim);
  expect_cuda(op, "out", out, {DType::kBF16}, x.shape());
  const int64_t n = x.size(0), half = head_dim / 2;
  if (n == 0) return;
  const bool vec = half % kVec == 0 && aligned16(x.raw_data()) && aligned16(out.raw_data());
  const int64_t chunks = (heads + kHeadsPerThread - 1) / kHeadsPerThread;
  const int64_t total = n * chunks * (vec ? half / kVec : half);
  auto* po = static_cast<bf16*>(out.raw_data());
  const auto* px = static_cast<const bf16*>(x.raw_data());
  const int hi = static_cast<int>(heads), di = static_cast<int>(head_dim);
  const double step = std::pow(theta, -2.0 / static_cast<double>(head_dim));
  const unsigned blocks = blocks_for(total, kThreads);
  if (vec) {
    rope_kernel<kVec><<<blocks, kThreads, 0, stream()>>>(po, px, n, seq, hi, di, theta, step, sign);
  } else {
    rope_kernel<1><<<blocks, kThreads, 0, stream()>>>(po, px, n, seq, hi, di, theta, step, sign);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
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
    int64_t wanted = 0;
    if (warp_rows) {
      int resident = 0;
      TANDEM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &resident, kernel, threads, static_cast<size_t>(shared_bytes)));
      wanted = std::min((n + kRowsPerBlock - 1) / kRowsPerBlock,
                        std::max<int64_t>(resident, 1) * sms);
    } else {
      // Block per row: several rows per block, the partials small next to dx.
      wanted = std::min((n + 3) / 4, std::min(32, 2048 / threads) * sms);
    }
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
  const int64_t lane_groups = (h / kVec + 31) / 32;  // groups of 8 per lane
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  auto* py = static_cast<bf16*>(y.raw_data());
  auto* pr = rstd.data<float>();
  const auto* px = static_cast<const bf16*>(x.raw_data());
  const float e = static_cast<float>(eps);
  dispatch_act(g.dtype(), [&](auto tg) {
    using TG = typename decltype(tg)::type;
    const TG* pg = static_cast<const TG*>(g.raw_data());
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, stream()>>>(py, pr, px, pg, n, h, e);
      TANDEM_CUDA_CHECK_LAUNCH();
    };
    if (!vec) launch(rmsnorm_forward_scalar_kernel<TG>);
    else if (lane_groups <= 1) launch(rmsnorm_forward_vec_kernel<TG, 1>);
    else if (lane_groups <= 2) launch(rmsnorm_forward_vec_kernel<TG, 2>);
    else if (lane_groups <= 4) launch(rmsnorm_forward_vec_kernel<TG, 4>);
    else if (lane_groups <= 8) launch(rmsnorm_forward_vec_kernel<TG, 8>);
    else if (lane_groups <= 16) launch(rmsnorm_forward_vec_kernel<TG, 16>);
    else launch(rmsnorm_forward_vec_kernel<TG, 0>);
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
    if (!vec) l.run(rmsnorm_backward_scalar_kernel<TG>, pg);
    else if (l.warp_rows && lane_groups <= 1) l.run(rmsnorm_backward_warp_kernel<TG, 1>, pg);
    else if (l.warp_rows && lane_groups <= 2) l.run(rmsnorm_backward_warp_kernel<TG, 2>, pg);
    else if (l.warp_rows && lane_groups <= 3) l.run(rmsnorm_backward_warp_kernel<TG, 3>, pg);
    else if (l.warp_rows) l.run(rmsnorm_backward_warp_kernel<TG, kMaxWarpCache>, pg);
    else if (per_thread <= 1) l.run(rmsnorm_backward_vec_kernel<TG, 1>, pg);
    else if (per_thread <= 2) l.run(rmsnorm_backward_vec_kernel<TG, 2>, pg);
    else if (per_thread <= 4) l.run(rmsnorm_backward_vec_kernel<TG, 4>, pg);
    else l.run(rmsnorm_backward_vec_kernel<TG, 0>, pg);
  });
}

// ---- rope ----

void rope_forward(const Tensor& out, const Tensor& x, int64_t seq, int64_t heads, int64_t head_dim,
                  double theta) {
  rope_apply("rope_forward", out, x, seq, heads, head_dim, theta, 1.0f);
}

void rope_backward(const Tensor& dx, const Tensor& dy, int64_t seq, int64_t heads, int64_t head_dim,
                   double theta) {
  rope_apply("rope_backward", dx, dy, seq, heads, head_dim, theta, -1.0f);
}

}  // namespace tandem::ops::cuda
