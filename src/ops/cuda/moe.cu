// CUDA router (top-k, the routing weights of RouterScore, switch aux loss; DeepSeek-V3's sigmoid
// router with its expert bias and groups) and the dropless
// token permutation by expert. The permutation is CUB's stable radix sort of the slots by expert,
// so it is exactly the CPU's order; every reduction runs in a fixed order (no float atomics), so
// every result is bitwise reproducible run to run on one GPU.
//
// Index tensors that our own ops produce (topk_idx, perm) are trusted rather than checked on the
// host (that would cost a sync per op): an entry out of range is skipped (or gives a zero row),
// never read or written out of bounds.
#include <cuda_bf16.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/scratch.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kVec = 8;                       // bf16 of a 16-byte vector (common.cuh)
constexpr int kRowsPerBlock = kThreads / 32;  // row kernels: one warp per row
constexpr int kMaxTopK = 32;                  // one lane per selected expert
constexpr int kMaxExperts = 64 * 32;          // a 64-bit mask of taken experts per lane

__device__ __forceinline__ int64_t warp_row() {
  return int64_t{blockIdx.x} * kRowsPerBlock + (threadIdx.x >> 5);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// ---- row blocks ----

constexpr int kCopyBlocksPerLaunch = 64;                        // 1.5 KiB of kernel parameters
constexpr int64_t kCopyTileBytes = int64_t{kThreads} * 4 * 16;  // 4 16-byte vectors a thread

// Byte ranges to copy: [src, src + bytes) of the input to [dst, dst + bytes) of the output.
struct CopyBlocks {
  int64_t src[kCopyBlocksPerLaunch], dst[kCopyBlocksPerLaunch], bytes[kCopyBlocksPerLaunch];
};

// Block blockIdx.y of `b`, tile by tile over blockIdx.x (grid-stride); 16-byte vectors when
// every range and both bases are 16-byte aligned (`vec`), else bytes.
__global__ void __launch_bounds__(kThreads)
    copy_blocks_kernel(char* out, const char* in, CopyBlocks b, bool vec) {
  const int i = static_cast<int>(blockIdx.y);
  const int64_t n = b.bytes[i];
  char* dst = out + b.dst[i];
  const char* src = in + b.src[i];
  for (int64_t t = int64_t{blockIdx.x} * kCopyTileBytes; t < n;
       t += int64_t{gridDim.x} * kCopyTileBytes) {
    const int64_t end = t + kCopyTileBytes < n ? t + kCopyTileBytes : n;
    if (vec) {
      for (int64_t j = t + int64_t{threadIdx.x} * 16; j < end; j += int64_t{kThreads} * 16) {
        *reinterpret_cast<uint4*>(dst + j) = *reinterpret_cast<const uint4*>(src + j);
      }
    } else {
      for (int64_t j = t + threadIdx.x; j < end; j += kThreads) dst[j] = src[j];
    }
  }
}

// ---- router ----

// Whether candidate (v, i) beats (bv, bi): higher logit, ties (and unordered NaN) to the lower
// index; i < 0 is "no candidate".
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0 || v > bv) return true;
  if (v < bv) return false;
  return i < bi;
}

// The warp's best (v, i) under `beats`, lane 0's in every lane (the same unless NaNs make the
// order partial).
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (beats(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  bv = __shfl_sync(0xffffffffu, bv, 0);
  bi = __shfl_sync(0xffffffffu, bi, 0);
}

// One warp per row: probs = softmax(logits row); the top k in descending order (a warp arg-max
// per pick; lane j keeps pick j), then their weights: their softmax (of_all false) or their
// probs (of_all, RouterScore::kSoftmaxOfAll).
__global__ void __launch_bounds__(kThreads)
    router_forward_kernel(int32_t* topk_idx, float* topk_w, float* probs, const float* logits,
                          int64_t n, int e, int k, bool of_all) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* lr = logits + row * e;
  const int rounds = (e + 31) / 32;  // lane holds experts lane + 32 m
  float mx = -INFINITY;
  for (int c = lane; c < e; c += 32) mx = fmaxf(mx, lr[c]);
  mx = warp_max(mx);
  float sum = 0;
  for (int c = lane; c < e; c += 32) sum += expf(lr[c] - mx);
  sum = warp_sum(sum);
  for (int c = lane; c < e; c += 32) probs[row * e + c] = expf(lr[c] - mx) / sum;

  uint64_t taken = 0;  // bit m: expert lane + 32 m already picked
  float pick_v = -INFINITY;
  int pick_i = 0;
  for (int j = 0; j < k; ++j) {
    float bv = 0;
    int bi = -1;
    for (int m = 0; m < rounds; ++m) {
      const int c = lane + 32 * m;
      if (c < e && !((taken >> m) & 1u) && beats(lr[c], c, bv, bi)) bv = lr[c], bi = c;
    }
    warp_best(bv, bi);
    if ((bi & 31) == lane) taken |= uint64_t{1} << (bi >> 5);
    if (lane == j) pick_v = bv, pick_i = bi;
  }
  const float pmax = warp_max(lane < k ? pick_v : -INFINITY);
  const float ex = lane < k ? expf(pick_v - pmax) : 0.0f;
  const float psum = warp_sum(ex);
  if (lane < k) {
    topk_idx[row * k + lane] = pick_i;
    topk_w[row * k + lane] = of_all ? expf(pick_v - mx) / sum : ex / psum;  // probs' formula
  }
}

// DeepSeek-V3's router, one warp per row (RouterSpec; the CPU's order and ties): p =
// sigmoid(logits); the choice reads p + bias, the groups' values are the sums of their two best,
// the group_topk best groups are kept and the other experts read as 0; the top k of that; the
// weights are p at the chosen, divided by their sum + 1e-20 when `normalize`, times scaling.
// Lane l holds experts l + 32 m and groups l + 32 m (each group's two best found by its lane in
// the CPU's order); each pick is a warp arg-max under `beats` (a total order without NaNs, so the
// serial scan's winner), lane j keeps pick j, and the sum of the picked p is added in pick order
// as the CPU does. kMaxSigmoidGroups groups at most (a 64-bit mask).
constexpr int kMaxSigmoidGroups = 64;

__device__ __forceinline__ float sigmoid_choice(const float* p, const float* bias, uint64_t kept,
                                                int size, int c) {
  if (!((kept >> (c / size)) & 1u)) return 0.0f;
  return p[c] + (bias != nullptr ? bias[c] : 0.0f);
}

__global__ void __launch_bounds__(kThreads)
    sigmoid_router_kernel(int32_t* topk_idx, float* topk_w, float* probs, const float* logits,
                          const float* bias, int64_t n, int e, int k, int groups, int group_topk,
                          float scaling, bool normalize) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* lr = logits + row * e;
  float* p = probs + row * e;
  for (int c = lane; c < e; c += 32) p[c] = 1.0f / (1.0f + expf(-lr[c]));
  __syncwarp();  // every lane reads the others' p below
  const int size = groups > 0 ? e / groups : e;
  uint64_t kept = groups > 0 ? 0 : 1;  // bit g: group g's experts may be chosen
  if (groups > 0) {
    float score[kMaxSigmoidGroups / 32];
#pragma unroll
    for (int m = 0; m < kMaxSigmoidGroups / 32; ++m) {
      const int g = lane + 32 * m;
      float best = -INFINITY, second = -INFINITY;
      for (int c = g * size; g < groups && c < (g + 1) * size; ++c) {
        const float x = p[c] + (bias != nullptr ? bias[c] : 0.0f);
        if (x > best) {
          second = best;
          best = x;
        } else if (x > second) {
          second = x;
        }
      }
      score[m] = best + second;
    }
    for (int pick = 0; pick < group_topk; ++pick) {
      float bv = 0;
      int bi = -1;
#pragma unroll
      for (int m = 0; m < kMaxSigmoidGroups / 32; ++m) {
        const int g = lane + 32 * m;
        if (g < groups && !((kept >> g) & 1u) && beats(score[m], g, bv, bi)) bv = score[m], bi = g;
      }
      warp_best(bv, bi);
      kept |= uint64_t{1} << bi;
    }
  }
  uint64_t taken = 0;  // bit m: expert lane + 32 m already picked
  float sum = 1e-20f;
  int pick_i = 0;
  for (int j = 0; j < k; ++j) {
    float bv = 0;
    int bi = -1;
    for (int c = lane, m = 0; c < e; c += 32, ++m) {
      if ((taken >> m) & 1u) continue;
      const float x = sigmoid_choice(p, bias, kept, size, c);
      if (beats(x, c, bv, bi)) bv = x, bi = c;
    }
    warp_best(bv, bi);
    if ((bi & 31) == lane) taken |= uint64_t{1} << (bi >> 5);
    if (lane == j) pick_i = bi;
    sum += p[bi];
  }
  if (lane < k) {
    const float pj = p[pick_i];
    topk_idx[row * k + lane] = pick_i;
    topk_w[row * k + lane] = scaling * (normalize ? pj / sum : pj);
  }
}

// Its backward, one warp per row: ds_j = scaling (dw_j / S - sum_i dw_i p_i / S^2) (scaling
// dw_j when not normalised) at the chosen experts, dlogit = ds p (1 - p); 0 elsewhere. S and the
// dot are summed in pick order (lane 0's serial loop, as the CPU's); lane j writes pick j after
// the row's zeros.
template <typename TD>
__global__ void __launch_bounds__(kThreads)
    sigmoid_router_backward_kernel(TD* dlogits, const float* dtopk_w, const int32_t* topk_idx,
                                   const float* probs, int64_t n, int e, int k, float scaling,
                                   bool normalize) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  TD* dl = dlogits + row * e;
  const float* p = probs + row * e;
  const int32_t* idx = topk_idx + row * k;
  const float* dw = dtopk_w + row * k;
  for (int c = lane; c < e; c += 32) dl[c] = static_cast<TD>(0.0f);
  float sum = 1e-20f, dot = 0;
  for (int j = 0; j < k; ++j) {
    if (idx[j] < 0 || idx[j] >= e) continue;
    sum += p[idx[j]];
    dot += dw[j] * p[idx[j]];
  }
  __syncwarp();  // the zeros before the picks' values
  if (lane < k && idx[lane] >= 0 && idx[lane] < e) {
    const float pj = p[idx[lane]];
    const float ds =
        normalize ? scaling * (dw[lane] / sum - dot / (sum * sum)) : scaling * dw[lane];
    dl[idx[lane]] = static_cast<TD>(ds * pj * (1.0f - pj));
  }
}

__global__ void __launch_bounds__(kThreads)
    load_add_kernel(float* load, const int32_t* counts, int64_t e) {
  const int64_t c = global_thread();
  if (c < e) load[c] += static_cast<float>(counts[c]);
}

// counts[id] += occurrences of each id in [0, e) (counts zeroed by the caller). Integer adds:
// the order does not matter.
__global__ void __launch_bounds__(kThreads)
    histogram_kernel(int32_t* counts, const int32_t* ids, int64_t count, int e, bool in_shared) {
  extern __shared__ int hist[];  // [e] when in_shared
  if (in_shared) {
    for (int c = threadIdx.x; c < e; c += blockDim.x) hist[c] = 0;
    __syncthreads();
  }
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const int32_t id = ids[i];
    if (id >= 0 && id < e) atomicAdd(in_shared ? &hist[id] : &counts[id], 1);
  }
  if (in_shared) {
    __syncthreads();
    for (int c = threadIdx.x; c < e; c += blockDim.x) {
      if (hist[c] != 0) atomicAdd(&counts[c], hist[c]);
    }
  }
}

void launch_counts(int32_t* counts, const int32_t* ids, int64_t count, int64_t e) {
  TANDEM_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(e) * sizeof(int32_t), stream()));
  if (count == 0) return;
  const bool in_shared = e * int64_t{sizeof(int)} <= 48 * 1024;
  histogram_kernel<<<blocks_for(count, kThreads), kThreads,
                     in_shared ? static_cast<size_t>(e) * sizeof(int) : 0, stream()>>>(
      counts, ids, count, static_cast<int>(e), in_shared);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// partial[chunk, c] = sum of probs[r, c] over the chunk's rows, in double. Block (32, 8): 32
// columns, 8 strided row slices combined in a fixed order.
__global__ void __launch_bounds__(kThreads)
    column_sums_kernel(double* partial, const float* probs, int64_t n, int e, int64_t chunk_rows) {
  __shared__ double slice[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * chunk_rows;
  const int64_t r1 = std::min(n, r0 + chunk_rows);
  double s = 0;
  if (c < e) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += probs[r * e + c];
  }
  slice[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < e) {
    double total = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) total += slice[y][threadIdx.x];
    partial[int64_t{blockIdx.y} * e + c] = total;
  }
}

// One warp per row: dl[x] = aux_scale p_x (c_x - sum_x' p_x' c_x') with c_x = cscale counts[x],
// then the routing weights' term added in f32 (lane j holds pick j), in the CPU's order:
// dl[idx_j] += w_j (dw_j - sum_i w_i dw_i); of_all (w_j = p[idx_j]): dl[x] += -p_x sum_i w_i dw_i
// and dl[idx_j] += p[idx_j] dw_j.
template <typename TD>
__global__ void __launch_bounds__(kThreads)
    router_backward_kernel(TD* dlogits, const float* dtopk_w, const int32_t* topk_idx,
                           const float* topk_w, const float* probs, const int32_t* counts,
                           int64_t n, int e, int k, double cscale, double aux_scale, bool of_all) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* p = probs + row * e;
  const bool picks = lane < k;
  const double w = picks ? topk_w[row * k + lane] : 0.0;
  const double dw = picks ? dtopk_w[row * k + lane] : 0.0;
  const int32_t idx = picks ? topk_idx[row * k + lane] : -1;
  const double dot = warp_sum(w * dw);
  const float sel = static_cast<float>(of_all ? w * dw : w * (dw - dot));
  double pc = 0;
  for (int c = lane; c < e; c += 32) pc += static_cast<double>(p[c]) * (cscale * counts[c]);
  pc = warp_sum(pc);
  const int rounds = (e + 31) / 32;
  for (int m = 0; m < rounds; ++m) {
    const int c = lane + 32 * m;
    const bool live = c < e;
    float d = live ? static_cast<float>(aux_scale * p[c] * (cscale * counts[c] - pc)) : 0.0f;
    if (of_all && live) d += static_cast<float>(-static_cast<double>(p[c]) * dot);
    for (int j = 0; j < k; ++j) {
      const int32_t ij = __shfl_sync(0xffffffffu, idx, j);
      const float sj = __shfl_sync(0xffffffffu, sel, j);
      if (ij == c) d += sj;
    }
    if (live) store1(dlogits + row * e + c, d);
  }
}

// ---- token permutation ----

// keys[i] = expert of slot i, or its place expert_slot[expert] when expert_slot is given, or e
// for an id (or place) outside [0, e) (sorted last, not counted); slots[i] = i.
__global__ void __launch_bounds__(kThreads)
    slot_keys_kernel(int32_t* keys, int32_t* slots, const int32_t* ids, const int32_t* expert_slot,
                     int64_t count, int e) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    int32_t key = ids[i];
    if (expert_slot != nullptr && key >= 0 && key < e) key = expert_slot[key];
    keys[i] = key >= 0 && key < e ? key : e;
    slots[i] = static_cast<int32_t>(i);
  }
}

// inv[perm[i]] = i (inv preset to -1, so a slot no row holds stays -1).
__global__ void __launch_bounds__(kThreads)
    invert_kernel(int32_t* inv, const int32_t* perm, int64_t count) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const int32_t s = perm[i];
    if (s >= 0 && s < count) inv[s] = static_cast<int32_t>(i);
  }
}

// inv: [count] in scratch, the row of the expert-sorted order holding each slot (-1: none).
int32_t* inverse_perm(Scratch& scratch, const Tensor& perm, int64_t count) {
  int32_t* inv = scratch.take<int32_t>(count);
  TANDEM_CUDA_CHECK(
      cudaMemsetAsync(inv, 0xff, static_cast<size_t>(count) * sizeof(int32_t), stream()));
  invert_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(inv, perm.data<int32_t>(),
                                                                        count);
  TANDEM_CUDA_CHECK_LAUNCH();
  return inv;
}

// One warp per row of the sorted order: out[i, :] = x[perm[i] / k, :] (zeros for a bad entry).
__global__ void __launch_bounds__(kThreads)
    permute_forward_kernel(bf16* out, const bf16* x, const int32_t* perm, int64_t count, int64_t k,
                           int64_t h, bool vec) {
  const int64_t i = warp_row();
  const int lane = threadIdx.x & 31;
  if (i >= count) return;
  const int32_t slot = perm[i];
  const bool ok = slot >= 0 && slot < count;
  const bf16* src = x + (ok ? slot / k : 0) * h;
  bf16* dst = out + i * h;
  if (vec) {
#pragma unroll 4
    for (int64_t c = lane; c < h / kVec; c += 32) {
      float v[kVec] = {};
      if (ok) load_vec(src + c * kVec, v);
      store_vec(dst + c * kVec, v);
    }
  } else {
    for (int64_t c = lane; c < h; c += 32) store1(dst + c, ok ? load1(src + c) : 0.0f);
  }
}

// One warp per token: dx[t] (+)= sum over j of dout[inv[t k + j]], in slot order.
__global__ void __launch_bounds__(kThreads)
    permute_backward_kernel(bf16* dx, const bf16* dout, const int32_t* inv, int64_t n, int64_t k,
                            int64_t h, bool add, bool vec) {
  const int64_t t = warp_row();
  const int lane = threadIdx.x & 31;
  if (t >= n) return;
  const int32_t* rows = inv + t * k;
  bf16* dst = dx + t * h;
  if (vec) {
    for (int64_t c = lane; c < h / kVec; c += 32) {
      float acc[kVec] = {};
      if (add) load_vec(dst + c * kVec, acc);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = rows[j];
        if (r < 0) continue;
        float d[kVec];
        load_vec(dout + r * h + c * kVec, d);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += d[e];
      }
      store_vec(dst + c * kVec, acc);
    }
  } else {
    for (int64_t c = lane; c < h; c += 32) {
      float acc = add ? load1(dst + c) : 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = rows[j];
        if (r >= 0) acc += load1(dout + r * h + c);
      }
      store1(dst + c, acc);
    }
  }
}

// One warp per token: out[t] += sum over j of w[t, j] y[inv[t k + j]], in slot order.
__global__ void __launch_bounds__(kThreads)
    combine_forward_kernel(bf16* out, const bf16* y, const int32_t* inv, const float* topk_w,
                           int64_t n, int64_t k, int64_t h, bool vec) {
  const int64_t t = warp_row();
  const int lane = threadIdx.x & 31;
  if (t >= n) return;
  const int32_t* rows = inv + t * k;
  const float* w = topk_w + t * k;
  bf16* dst = out + t * h;
  if (vec) {
    for (int64_t c = lane; c < h / kVec; c += 32) {
      float acc[kVec];
      load_vec(dst + c * kVec, acc);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = rows[j];
        if (r < 0) continue;
        const float wj = w[j];
        float v[kVec];
        load_vec(y + r * h + c * kVec, v);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += wj * v[e];
      }
      store_vec(dst + c * kVec, acc);
    }
  } else {
    for (int64_t c = lane; c < h; c += 32) {
      float acc = load1(dst + c);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = rows[j];
        if (r >= 0) acc += w[j] * load1(y + r * h + c);
      }
      store1(dst + c, acc);
    }
  }
}

// One warp per row i of the sorted order, slot s = perm[i], token s / k:
// dy[i] = topk_w[s] dout[token]; dtopk_w[s] = <dout[token], y[i]> (fp32, a warp reduction).
__global__ void __launch_bounds__(kThreads)
    combine_backward_kernel(bf16* dy, float* dtopk_w, const bf16* dout, const bf16* y,
                            const int32_t* perm, const float* topk_w, int64_t count, int64_t k,
                            int64_t h, bool vec) {
  const int64_t i = warp_row();
  const int lane = threadIdx.x & 31;
  if (i >= count) return;
  const int32_t slot = perm[i];
  const bool ok = slot >= 0 && slot < count;
  const float w = ok ? topk_w[slot] : 0.0f;
  const bf16* d = dout + (ok ? slot / k : 0) * h;
  const bf16* yr = y + i * h;
  bf16* dyr = dy + i * h;
  float dot = 0;
  if (vec) {
#pragma unroll 2
    for (int64_t c = lane; c < h / kVec; c += 32) {
      float dv[kVec], yv[kVec], out[kVec];
      load_vec(d + c * kVec, dv);
      load_vec(yr + c * kVec, yv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        out[e] = w * dv[e];
        dot += dv[e] * yv[e];
      }
      store_vec(dyr + c * kVec, out);
    }
  } else {
    for (int64_t c = lane; c < h; c += 32) {
      const float dv = load1(d + c);
      store1(dyr + c, w * dv);
      dot += dv * load1(yr + c);
    }
  }
  dot = warp_sum(dot);
  if (ok && lane == 0) dtopk_w[slot] = dot;
}

void expect_slot_count(const char* op, int64_t count) {
  TANDEM_CHECK(count < INT_MAX, op, ": ", count, " token slots; at most ", INT_MAX - 1,
               " are supported (perm is i32)");
}

// Sizes of a permutation or combine: n tokens of h columns, k slots each, count = n k slots.
struct SlotDims {
  int64_t n, h, k, count;
};

// Checks, in order, the tokens' tensor [n, h] bf16 (`tokens_name`: x, dx), k, the slots' tensor
// [n k, h] bf16 (`slots_name`: out, dout) and perm [n k] i32 of permute_forward/backward.
SlotDims check_permute(const char* op, const char* tokens_name, const Tensor& tokens,
                       const char* slots_name, const Tensor& slots, const Tensor& perm, int64_t k) {
  expect_cuda_rank(op, tokens_name, tokens, {DType::kBF16}, 2);
  TANDEM_CHECK(k >= 1, op, ": k is ", k, ", expected at least 1");
  const int64_t n = tokens.size(0), h = tokens.size(1), count = n * k;
  expect_slot_count(op, count);
  expect_cuda(op, slots_name, slots, {DType::kBF16}, {count, h});
  expect_cuda(op, "perm", perm, {DType::kI32}, {count});
  return {n, h, k, count};
}

// Checks, in order, the tokens' tensor [n, h] bf16 (`tokens_name`: out, dout) and topk_w [n, k]
// f32 of combine_forward/backward, whose other tensors the caller checks against the sizes.
SlotDims check_combine(const char* op, const char* tokens_name, const Tensor& tokens,
                       const Tensor& topk_w) {
  expect_cuda_rank(op, tokens_name, tokens, {DType::kBF16}, 2);
  expect_cuda_rank(op, "topk_w", topk_w, {DType::kF32}, 2);
  const int64_t n = tokens.size(0), h = tokens.size(1), k = topk_w.size(1), count = n * k;
  expect_slot_count(op, count);
  expect_cuda(op, "topk_w", topk_w, {DType::kF32}, {n, k});
  return {n, h, k, count};
}

// Whether rows of h bf16 go as 16-byte vectors: h a multiple of 8 and every tensor's data
// 16-byte aligned.
bool vec_rows(int64_t h, std::initializer_list<const Tensor*> tensors) {
  if (h % kVec != 0) return false;
  for (const Tensor* t : tensors) {
    if (!aligned16(t->raw_data())) return false;
  }
  return true;
}

}  // namespace

// ---- router ----

// The softmax router takes no groups, scaling or bias (as the CPU's).
static void expect_softmax_router(const char* op, const RouterSpec& spec, const Tensor& bias) {
  TANDEM_CHECK(spec.groups == 0 && spec.scaling == 1.0 && !bias.defined(), op,
               ": groups, a scaling of the weights and an expert bias need sigmoid scores");
}

PendingScalar router_seq_aux_loss_start(const Tensor& probs, const Tensor&, int64_t seq,
                                        double coeff) {
  if (coeff == 0) return PendingScalar(0.0);
  TANDEM_CHECK(false,
               "router_seq_aux_loss: the sequence-wise aux loss "
               "(--moe-router-load-balancing-type seq_aux_loss) is not implemented on the GPU (",
               probs.numel(), " scores, sequences of ", seq, ", coeff ", coeff, ")");
  return PendingScalar(0.0);
}

void router_load_add(const Tensor& load, const Tensor& counts) {
  const char* op = "router_load_add";
  expect_cuda_rank(op, "counts", counts, {DType::kI32}, 1);
  expect_cuda(op, "load", load, {DType::kF32}, counts.shape());
  const int64_t e = counts.numel();
  if (e == 0) return;
  load_add_kernel<<<static_cast<unsigned>((e + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
      load.data<float>(), counts.data<int32_t>(), e);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// DeepSeek-V3's router (sigmoid_router_kernel): one warp per row.
static void sigmoid_router_forward(const char* op, const Tensor& topk_idx, const Tensor& topk_w,
                                   const Tensor& probs, const Tensor& logits,
                                   const RouterSpec& spec, const Tensor& bias) {
  const int64_t n = logits.size(0), e = logits.size(1), k = topk_idx.size(1);
  if (bias.defined()) expect_cuda(op, "bias", bias, {DType::kF32}, {e});
  if (spec.groups > 0) {
    TANDEM_CHECK(e % spec.groups == 0 && e / spec.groups >= 2 && spec.group_topk >= 1 &&
                     spec.group_topk <= spec.groups && spec.groups <= kMaxSigmoidGroups &&
                     k <= spec.group_topk * (e / spec.groups),
                 op, ": groups ", spec.groups, ", group_topk ", spec.group_topk, " do not fit ", e,
                 " experts and k = ", k, " (the GPU takes at most ", kMaxSigmoidGroups, " groups)");
  }
  if (n == 0) return;
  sigmoid_router_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(
      topk_idx.data<int32_t>(), topk_w.data<float>(), probs.data<float>(), logits.data<float>(),
      bias.defined() ? bias.data<float>() : nullptr, n, static_cast<int>(e), static_cast<int>(k),
      static_cast<int>(spec.groups), static_cast<int>(spec.group_topk),
      static_cast<float>(spec.scaling), spec.score == RouterScore::kSigmoidNormalized);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void router_forward(const Tensor& topk_idx, const Tensor& topk_w, const Tensor& probs,
                    const Tensor& logits, const RouterSpec& spec, const Tensor& bias) {
  const char* op = "router_forward";
  const RouterScore score = spec.score;
  if (!spec.sigmoid()) expect_softmax_router(op, spec, bias);
  expect_cuda_rank(op, "logits", logits, {DType::kF32}, 2);
  expect_cuda_rank(op, "topk_idx", topk_idx, {DType::kI32}, 2);
  const int64_t n = logits.size(0), e = logits.size(1), k = topk_idx.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  TANDEM_CHECK(k <= kMaxTopK && e <= kMaxExperts, op, ": k = ", k, " over ", e,
               " experts; the GPU router takes k <= ", kMaxTopK, " and at most ", kMaxExperts,
               " experts");
  expect_cuda(op, "topk_idx", topk_idx, {DType::kI32}, {n, k});
  expect_cuda(op, "topk_w", topk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "probs", probs, {DType::kF32}, {n, e});
  if (spec.sigmoid()) {
    sigmoid_router_forward(op, topk_idx, topk_w, probs, logits, spec, bias);
    return;
  }
  if (n == 0) return;
  router_forward_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(
      topk_idx.data<int32_t>(), topk_w.data<float>(), probs.data<float>(), logits.data<float>(), n,
      static_cast<int>(e), static_cast<int>(k), score == RouterScore::kSoftmaxOfAll);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// An expert id outside [0, E) is not counted (topk_idx comes from router_forward; see the top).
void router_counts(const Tensor& counts, const Tensor& topk_idx) {
  const char* op = "router_counts";
  expect_cuda_rank(op, "counts", counts, {DType::kI32}, 1);
  expect_cuda_rank(op, "topk_idx", topk_idx, {DType::kI32}, 2);
  const int64_t e = counts.size(0);
  TANDEM_CHECK(e <= INT_MAX, op, ": ", e, " experts is too many");
  if (e == 0) return;
  launch_counts(counts.data<int32_t>(), topk_idx.data<int32_t>(), topk_idx.numel(), e);
}

// The chunks' column sums added up in a fixed order and weighted by the counts: thread c of
// one block forms column c's term (its chunks added in order), and thread 0 adds the terms in
// column order: the host loop that did this before, operation for operation with no fused
// multiply-add, so the value is the same bit for bit. nk = n * k; `terms` holds e doubles.
__global__ void __launch_bounds__(kThreads)
    aux_loss_sum_kernel(double* out, double* terms, const double* partial, const int32_t* counts,
                        int64_t e, int64_t chunks, double nd, double nk) {
  for (int64_t c = threadIdx.x; c < e; c += blockDim.x) {
    double col = 0;
    for (int64_t b = 0; b < chunks; ++b) col = __dadd_rn(col, partial[b * e + c]);
    terms[c] = __dmul_rn(__ddiv_rn(static_cast<double>(counts[c]), nk), __ddiv_rn(col, nd));
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double s = 0;
  for (int64_t c = 0; c < e; ++c) s = __dadd_rn(s, terms[c]);
  *out = s;
}

// Column sums of probs in double on the GPU (fixed chunks), their weighted sum by one thread,
// and its read to the host started (Note [Reads to the host ahead of use] in core/host_read.h):
// the host waits for it only when it asks for the value.
PendingScalar router_aux_loss_start(const Tensor& probs, const Tensor& counts, int64_t k,
                                    double coeff) {
  const char* op = "router_aux_loss";
  expect_cuda_rank(op, "probs", probs, {DType::kF32}, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  expect_cuda(op, "counts", counts, {DType::kI32}, {e});
  TANDEM_CHECK(k >= 1, op, ": k is ", k, ", expected at least 1");
  TANDEM_CHECK(e <= INT_MAX, op, ": ", e, " experts is too many");
  if (n == 0 || e == 0) return PendingScalar(0.0);
  constexpr int64_t kMaxChunks = 64;
  const int64_t chunk_rows = std::max<int64_t>(256, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (n + chunk_rows - 1) / chunk_rows;
  Scratch scratch(op);
  double* partial = scratch.take<double>(chunks * e);
  double* terms = scratch.take<double>(e);
  column_sums_kernel<<<dim3(static_cast<unsigned>((e + 31) / 32), static_cast<unsigned>(chunks)),
                       dim3(32, 8), 0, stream()>>>(partial, probs.data<float>(), n,
                                                   static_cast<int>(e), chunk_rows);
  TANDEM_CUDA_CHECK_LAUNCH();
  const Tensor sum =
      Tensor::empty({1}, DType::kF64, MemCategory::kOther, "router_aux_loss.sum", Device::kCUDA);
  const double nd = static_cast<double>(n);
  aux_loss_sum_kernel<<<1, kThreads, 0, stream()>>>(sum.data<double>(), terms, partial,
                                                    counts.data<int32_t>(), e, chunks, nd,
                                                    nd * static_cast<double>(k));
  TANDEM_CUDA_CHECK_LAUNCH();
  return PendingScalar(HostRead(sum), coeff * static_cast<double>(e));
}

void router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                     const Tensor& topk_w, const Tensor& probs, const Tensor& counts, int64_t k,
                     double coeff, double aux_scale, const RouterSpec& spec) {
  const char* op = "router_backward";
  const RouterScore score = spec.score;
  if (!spec.sigmoid()) expect_softmax_router(op, spec, Tensor());
  TANDEM_CHECK(!spec.sigmoid() || coeff == 0, op, ": the aux loss (coeff ", coeff,
               ") needs softmax scores");
  expect_cuda_rank(op, "probs", probs, {DType::kF32}, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  TANDEM_CHECK(k <= kMaxTopK && e <= INT_MAX, op, ": k = ", k, " over ", e,
               " experts; the GPU router takes k <= ", kMaxTopK);
  expect_cuda(op, "dlogits", dlogits, {DType::kF32, DType::kBF16}, {n, e});
  expect_cuda(op, "dtopk_w", dtopk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "topk_w", topk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "topk_idx", topk_idx, {DType::kI32}, {n, k});
  expect_cuda(op, "counts", counts, {DType::kI32}, {e});
  if (n == 0) return;
  if (spec.sigmoid()) {
    auto launch = [&](auto* pd) {
      sigmoid_router_backward_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(
          pd, dtopk_w.data<float>(), topk_idx.data<int32_t>(), probs.data<float>(), n,
          static_cast<int>(e), static_cast<int>(k), static_cast<float>(spec.scaling),
          score == RouterScore::kSigmoidNormalized);
      TANDEM_CUDA_CHECK_LAUNCH();
    };
    if (dlogits.dtype() == DType::kBF16)
      launch(static_cast<bf16*>(dlogits.raw_data()));
    else
      launch(dlogits.data<float>());
    return;
  }
  const double nd = static_cast<double>(n);
  const double cscale = coeff * static_cast<double>(e) / (nd * static_cast<double>(k)) / nd;
  auto launch = [&](auto* pd) {
    router_backward_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(
        pd, dtopk_w.data<float>(), topk_idx.data<int32_t>(), topk_w.data<float>(),
        probs.data<float>(), counts.data<int32_t>(), n, static_cast<int>(e), static_cast<int>(k),
        cscale, aux_scale, score == RouterScore::kSoftmaxOfAll);
    TANDEM_CUDA_CHECK_LAUNCH();
  };
  if (dlogits.dtype() == DType::kBF16)
    launch(static_cast<bf16*>(dlogits.raw_data()));
  else
    launch(dlogits.data<float>());
}

// ---- token permutation ----

void moe_permutation(const Tensor& perm, const Tensor& counts, const Tensor& topk_idx,
                     int64_t num_experts, const Tensor& expert_slot) {
  const char* op = "moe_permutation";
  TANDEM_CHECK(num_experts >= 1 && num_experts < INT_MAX, op, ": num_experts is ", num_experts,
               ", expected at least 1");
  expect_cuda_rank(op, "topk_idx", topk_idx, {DType::kI32}, 2);
  const int64_t count = topk_idx.numel();
  expect_slot_count(op, count);
  expect_cuda(op, "perm", perm, {DType::kI32}, {count});
  expect_cuda(op, "counts", counts, {DType::kI32}, {num_experts});
  // Not checked to be a permutation here (that would read it to the host); the CPU op checks.
  if (expert_slot.defined()) {
    expect_cuda(op, "expert_slot", expert_slot, {DType::kI32}, {num_experts});
  }
  const int32_t* ids = topk_idx.data<int32_t>();
  if (count == 0) {
    launch_counts(counts.data<int32_t>(), ids, count, num_experts);
    return;
  }
  // Stable radix sort of the slots (token, then slot: their flat order) by expert (or place).
  Scratch scratch(op);
  int32_t* keys_in = scratch.take<int32_t>(count);
  int32_t* keys_out = scratch.take<int32_t>(count);
  int32_t* slots = scratch.take<int32_t>(count);
  const int end_bit = std::bit_width(static_cast<uint64_t>(num_experts));  // covers sentinel E
  const int items = static_cast<int>(count);
  size_t temp_bytes = 0;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, slots,
                                                    perm.data<int32_t>(), items, 0, end_bit,
                                                    stream()));
  void* temp = scratch.take_bytes(temp_bytes);
  slot_keys_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(
      keys_in, slots, ids, expert_slot.defined() ? expert_slot.data<int32_t>() : nullptr, count,
      static_cast<int>(num_experts));
  TANDEM_CUDA_CHECK_LAUNCH();
  launch_counts(counts.data<int32_t>(), keys_in, count, num_experts);
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, slots,
                                                    perm.data<int32_t>(), items, 0, end_bit,
                                                    stream()));
}

void permute_forward(const Tensor& out, const Tensor& x, const Tensor& perm, int64_t k) {
  const char* op = "permute_forward";
  const SlotDims d = check_permute(op, "x", x, "out", out, perm, k);
  if (d.count == 0 || d.h == 0) return;
  const bool vec = vec_rows(d.h, {&out, &x});
  permute_forward_kernel<<<row_blocks(d.count), kThreads, 0, stream()>>>(
      static_cast<bf16*>(out.raw_data()), static_cast<const bf16*>(x.raw_data()),
      perm.data<int32_t>(), d.count, k, d.h, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void permute_backward(const Tensor& dx, const Tensor& dout, const Tensor& perm, int64_t k,
                      Accumulate acc) {
  const char* op = "permute_backward";
  const SlotDims d = check_permute(op, "dx", dx, "dout", dout, perm, k);
  if (d.count == 0 || d.h == 0) return;
  Scratch scratch(op);
  const int32_t* inv = inverse_perm(scratch, perm, d.count);
  const bool vec = vec_rows(d.h, {&dx, &dout});
  permute_backward_kernel<<<row_blocks(d.n), kThreads, 0, stream()>>>(
      static_cast<bf16*>(dx.raw_data()), static_cast<const bf16*>(dout.raw_data()), inv, d.n, k,
      d.h, acc == Accumulate::kAdd, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void copy_row_blocks(const Tensor& out, const Tensor& in, const std::vector<RowBlock>& blocks) {
  const char* op = "copy_row_blocks";
  expect_cuda_rank(op, "out", out, {DType::kBF16, DType::kF32, DType::kF64, DType::kI32}, -1);
  expect_cuda_rank(op, "in", in, {out.dtype()}, -1);
  const int64_t row_bytes = check_row_blocks(op, out, in, blocks);
  auto* dst = static_cast<char*>(out.raw_data());
  const auto* src = static_cast<const char*>(in.raw_data());
  const bool vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(src) % 16 == 0;
  CopyBlocks b{};
  int count = 0;
  int64_t longest = 0;
  auto launch = [&] {
    if (count == 0) return;
    const int64_t tiles = (longest + kCopyTileBytes - 1) / kCopyTileBytes;
    const auto x = static_cast<unsigned>(std::min<int64_t>(tiles, 1024));
    copy_blocks_kernel<<<dim3(x, static_cast<unsigned>(count)), kThreads, 0, stream()>>>(dst, src,
                                                                                         b, vec);
    TANDEM_CUDA_CHECK_LAUNCH();
    count = 0;
    longest = 0;
  };
  for (const RowBlock& r : blocks) {
    if (r.rows == 0 || row_bytes == 0) continue;
    b.src[count] = r.from * row_bytes;
    b.dst[count] = r.to * row_bytes;
    b.bytes[count] = r.rows * row_bytes;
    longest = std::max(longest, b.bytes[count]);
    if (++count == kCopyBlocksPerLaunch) launch();
  }
  launch();
}

void combine_forward(const Tensor& out, const Tensor& y, const Tensor& perm, const Tensor& topk_w) {
  const char* op = "combine_forward";
  const auto [n, h, k, count] = check_combine(op, "out", out, topk_w);
  expect_cuda(op, "y", y, {DType::kBF16}, {count, h});
  expect_cuda(op, "perm", perm, {DType::kI32}, {count});
  if (count == 0 || h == 0) return;
  Scratch scratch(op);
  const int32_t* inv = inverse_perm(scratch, perm, count);
  const bool vec = vec_rows(h, {&out, &y});
  combine_forward_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(
      static_cast<bf16*>(out.raw_data()), static_cast<const bf16*>(y.raw_data()), inv,
      topk_w.data<float>(), n, k, h, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void combine_backward(const Tensor& dy, const Tensor& dtopk_w, const Tensor& dout, const Tensor& y,
                      const Tensor& perm, const Tensor& topk_w) {
  const char* op = "combine_backward";
  const auto [n, h, k, count] = check_combine(op, "dout", dout, topk_w);
  expect_cuda(op, "dtopk_w", dtopk_w, {DType::kF32}, {n, k});
  expect_cuda(op, "y", y, {DType::kBF16}, {count, h});
  expect_cuda(op, "dy", dy, {DType::kBF16}, {count, h});
  expect_cuda(op, "perm", perm, {DType::kI32}, {count});
  if (count == 0) return;
  const bool vec = vec_rows(h, {&dy, &dout, &y});
  combine_backward_kernel<<<row_blocks(count), kThreads, 0, stream()>>>(
      static_cast<bf16*>(dy.raw_data()), dtopk_w.data<float>(),
      static_cast<const bf16*>(dout.raw_data()), static_cast<const bf16*>(y.raw_data()),
      perm.data<int32_t>(), topk_w.data<float>(), count, k, h, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::ops::cuda
