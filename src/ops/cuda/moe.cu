// CUDA token permutation by expert (ops.h; dropless, or with an expert capacity:
// Note [Expert capacity] in core/footprint.h) and its inverse, the combine. The permutation is
// CUB's stable radix sorts of the slots (by priority within an expert, then by expert), so it is
// exactly the CPU's order; every reduction runs in a fixed order (no float atomics), so every
// result is bitwise reproducible run to run on one GPU. The routers are in router.cu.
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
#include "ops/cuda/moe_rows.cuh"
#include "ops/cuda/scratch.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kVec = 8;  // bf16 of a 16-byte vector (common.cuh)

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

// ---- expert capacity (moe_permutation with MoeCapacity) ----

// keys[i] = Megatron-LM's position order of slot vals[i]'s token (position t of every sequence
// before t + 1); vals[i] = i.
__global__ void __launch_bounds__(kThreads)
    position_keys_kernel(int32_t* keys, int32_t* vals, int64_t count, int64_t k, int64_t n,
                         int64_t seq) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const int64_t row = i / k;
    keys[i] = static_cast<int32_t>((row % seq) * (n / seq) + row / seq);
    vals[i] = static_cast<int32_t>(i);
  }
}

// keys[i] ascending as w[vals[i]] descends (the float's bits made orderable, then inverted).
__global__ void __launch_bounds__(kThreads)
    weight_keys_kernel(uint32_t* keys, const int32_t* vals, const float* w, int64_t count) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const uint32_t u = __float_as_uint(w[vals[i]]);
    const uint32_t ordered = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
    keys[i] = ~ordered;
  }
}

// keys[i] = the place of slot vals[i]'s expert (e for an id or place outside [0, e)).
__global__ void __launch_bounds__(kThreads)
    place_keys_kernel(int32_t* keys, const int32_t* vals, const int32_t* ids,
                      const int32_t* expert_slot, int64_t count, int e) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    int32_t key = ids[vals[i]];
    if (expert_slot != nullptr && key >= 0 && key < e) key = expert_slot[key];
    keys[i] = key >= 0 && key < e ? key : e;
  }
}

// first[p] = the sum of counts[0 .. p) (one thread: at most a few thousand experts).
__global__ void scan_kernel(int32_t* first, const int32_t* counts, int e) {
  int32_t sum = 0;
  for (int p = 0; p < e; ++p) {
    first[p] = sum;
    sum += counts[p];
  }
}

// With the slots sorted by place, then priority: kept[vals[i]] = whether slot vals[i] is among
// the first `capacity` of its place.
__global__ void __launch_bounds__(kThreads)
    mark_kept_kernel(char* kept, const int32_t* keys, const int32_t* vals, const int32_t* first,
                     int64_t count, int64_t capacity, int e) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const int32_t p = keys[i];
    kept[vals[i]] = p < e && i - first[p] < capacity;
  }
}

// keys[i] = the place of slot i when kept, else e (sorted last, not counted); vals[i] = i.
__global__ void __launch_bounds__(kThreads)
    kept_keys_kernel(int32_t* keys, int32_t* vals, const char* kept, const int32_t* ids,
                     const int32_t* expert_slot, int64_t count, int e) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    int32_t key = ids[i];
    if (expert_slot != nullptr && key >= 0 && key < e) key = expert_slot[key];
    keys[i] = kept[i] && key >= 0 && key < e ? key : e;
    vals[i] = static_cast<int32_t>(i);
  }
}

// The permutation from the kept slots sorted by place: unpadded, row i holds vals[i] (-1 past
// the kept ones); padded (perm preset to -1), place p's j-th kept slot goes to row p C + j.
__global__ void __launch_bounds__(kThreads)
    write_perm_kernel(int32_t* perm, const int32_t* keys, const int32_t* vals, const int32_t* first,
                      int64_t count, int e, int64_t capacity, bool pad) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const int32_t p = keys[i];
    if (!pad) {
      perm[i] = p < e ? vals[i] : -1;
    } else if (p < e) {
      perm[p * capacity + (i - first[p])] = vals[i];
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    fill_kernel(int32_t* out, int32_t value, int64_t count) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) out[i] = value;
}

// inv[perm[i]] = i (inv preset to -1, so a slot no row holds stays -1).
__global__ void __launch_bounds__(kThreads)
    invert_kernel(int32_t* inv, const int32_t* perm, int64_t rows, int64_t slots) {
  for (int64_t i = global_thread(); i < rows; i += grid_threads()) {
    const int32_t s = perm[i];
    if (s >= 0 && s < slots) inv[s] = static_cast<int32_t>(i);
  }
}

// inv: [slots] in scratch, the row of the expert-sorted order holding each slot (-1: none),
// from perm's first `rows` rows (the rows the caller's tensor has; the rest hold none).
int32_t* inverse_perm(Scratch& scratch, const Tensor& perm, int64_t rows, int64_t slots) {
  int32_t* inv = scratch.take<int32_t>(slots);
  TANDEM_CUDA_CHECK(
      cudaMemsetAsync(inv, 0xff, static_cast<size_t>(slots) * sizeof(int32_t), stream()));
  if (rows == 0) return inv;
  invert_kernel<<<blocks_for(rows, kThreads), kThreads, 0, stream()>>>(inv, perm.data<int32_t>(),
                                                                       rows, slots);
  TANDEM_CUDA_CHECK_LAUNCH();
  return inv;
}

// One warp per row of the sorted order: out[i, :] = x[perm[i] / k, :] (zeros for -1 or a bad
// entry).
__global__ void __launch_bounds__(kThreads)
    permute_forward_kernel(bf16* out, const bf16* x, const int32_t* perm, int64_t rows,
                           int64_t slots, int64_t k, int64_t h, bool vec) {
  const int64_t i = warp_row();
  const int lane = threadIdx.x & 31;
  if (i >= rows) return;
  const int32_t slot = perm[i];
  const bool ok = slot >= 0 && slot < slots;
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
// dy[i] = topk_w[s] dout[token]; dtopk_w[s] = <dout[token], y[i]> (fp32, a warp reduction). A row
// without a slot (-1: padding) gets dy = 0.
__global__ void __launch_bounds__(kThreads)
    combine_backward_kernel(bf16* dy, float* dtopk_w, const bf16* dout, const bf16* y,
                            const int32_t* perm, const float* topk_w, int64_t rows, int64_t slots,
                            int64_t k, int64_t h, bool vec) {
  const int64_t i = warp_row();
  const int lane = threadIdx.x & 31;
  if (i >= rows) return;
  const int32_t slot = perm[i];
  const bool ok = slot >= 0 && slot < slots;
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

// Sizes of a permutation or combine: n tokens of h columns, k slots each, count = n k slots;
// rows: the rows tensor's (at most perm's; perm's rows past it hold no slot).
struct SlotDims {
  int64_t n, h, k, count, rows;
};

// Checks perm [P] i32 and the rows tensor [R, h] bf16 (`rows_name`), R <= P (exactly P when
// `all_rows`); returns R.
int64_t check_rows(const char* op, const char* rows_name, const Tensor& rows, const Tensor& perm,
                   int64_t h, bool all_rows) {
  expect_cuda_rank(op, "perm", perm, {DType::kI32}, 1);
  expect_cuda_rank(op, rows_name, rows, {DType::kBF16}, 2);
  expect_cuda(op, rows_name, rows, {DType::kBF16}, {rows.size(0), h});
  TANDEM_CHECK(all_rows ? rows.size(0) == perm.size(0) : rows.size(0) <= perm.size(0), op, ": ",
               rows_name, " has ", rows.size(0), " rows, perm ", perm.size(0));
  expect_slot_count(op, perm.size(0));
  return rows.size(0);
}

// Checks, in order, the tokens' tensor [n, h] bf16 (`tokens_name`: x, dx), k, the rows' tensor
// (`rows_name`: out [P, h], dout [R, h]) and perm [P] i32 of permute_forward/backward.
SlotDims check_permute(const char* op, const char* tokens_name, const Tensor& tokens,
                       const char* rows_name, const Tensor& rows, const Tensor& perm, int64_t k,
                       bool all_rows) {
  expect_cuda_rank(op, tokens_name, tokens, {DType::kBF16}, 2);
  TANDEM_CHECK(k >= 1, op, ": k is ", k, ", expected at least 1");
  const int64_t n = tokens.size(0), h = tokens.size(1), count = n * k;
  expect_slot_count(op, count);
  return {n, h, k, count, check_rows(op, rows_name, rows, perm, h, all_rows)};
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
  return {n, h, k, count, 0};
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

// CUB's stable radix sort of (keys_in, vals_in) into (keys_out, vals_out) over key bits
// [0, end_bit), its temporary storage from `scratch`.
template <typename K>
void sort_pairs(Scratch& scratch, const K* keys_in, K* keys_out, const int32_t* vals_in,
                int32_t* vals_out, int64_t count, int end_bit) {
  size_t temp_bytes = 0;
  const int items = static_cast<int>(count);
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, vals_in,
                                                    vals_out, items, 0, end_bit, stream()));
  void* temp = scratch.take_bytes(temp_bytes);
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in,
                                                    vals_out, items, 0, end_bit, stream()));
}

// Note [Expert capacity] (core/footprint.h) on the GPU: which slots each place keeps. The slots
// sorted by priority (the position order, then for the probs policy the weight descending, each
// sort stable so ties keep the earlier position), then by place; a slot is kept when it is among
// its place's first `capacity`. kept: [count] in scratch.
char* kept_slots(Scratch& scratch, const Tensor& topk_idx, const Tensor& topk_w,
                 const Tensor& expert_slot, int64_t e, const MoeCapacity& cap) {
  const int64_t n = topk_idx.size(0), k = topk_idx.size(1), count = n * k;
  int32_t* keys_a = scratch.take<int32_t>(count);
  int32_t* keys_b = scratch.take<int32_t>(count);
  int32_t* vals_a = scratch.take<int32_t>(count);
  int32_t* vals_b = scratch.take<int32_t>(count);
  const unsigned blocks = blocks_for(count, kThreads);
  position_keys_kernel<<<blocks, kThreads, 0, stream()>>>(keys_a, vals_a, count, k, n, cap.seq);
  TANDEM_CUDA_CHECK_LAUNCH();
  sort_pairs(scratch, keys_a, keys_b, vals_a, vals_b, count,
             std::bit_width(static_cast<uint64_t>(n)));
  if (cap.policy == TokenDropPolicy::kProbs) {
    auto* wkeys_a = reinterpret_cast<uint32_t*>(keys_a);
    auto* wkeys_b = reinterpret_cast<uint32_t*>(keys_b);
    weight_keys_kernel<<<blocks, kThreads, 0, stream()>>>(wkeys_a, vals_b, topk_w.data<float>(),
                                                          count);
    TANDEM_CUDA_CHECK_LAUNCH();
    sort_pairs(scratch, wkeys_a, wkeys_b, vals_b, vals_a, count, 32);
    std::swap(vals_a, vals_b);  // vals_b holds the order
  }
  const int32_t* slot = expert_slot.defined() ? expert_slot.data<int32_t>() : nullptr;
  place_keys_kernel<<<blocks, kThreads, 0, stream()>>>(keys_a, vals_b, topk_idx.data<int32_t>(),
                                                       slot, count, static_cast<int>(e));
  TANDEM_CUDA_CHECK_LAUNCH();
  sort_pairs(scratch, keys_a, keys_b, vals_b, vals_a, count,
             std::bit_width(static_cast<uint64_t>(e)));
  int32_t* totals = scratch.take<int32_t>(e);
  int32_t* first = scratch.take<int32_t>(e);
  launch_counts(totals, keys_b, count, e);
  scan_kernel<<<1, 1, 0, stream()>>>(first, totals, static_cast<int>(e));
  TANDEM_CUDA_CHECK_LAUNCH();
  char* kept = scratch.take<char>(count);
  mark_kept_kernel<<<blocks, kThreads, 0, stream()>>>(kept, keys_b, vals_a, first, count,
                                                      cap.capacity, static_cast<int>(e));
  TANDEM_CUDA_CHECK_LAUNCH();
  return kept;
}

}  // namespace

// ---- token permutation ----

void moe_permutation(const Tensor& perm, const Tensor& counts, const Tensor& topk_idx,
                     const Tensor& topk_w, int64_t num_experts, const Tensor& expert_slot,
                     const MoeCapacity& cap) {
  const char* op = "moe_permutation";
  TANDEM_CHECK(num_experts >= 1 && num_experts < INT_MAX, op, ": num_experts is ", num_experts,
               ", expected at least 1");
  expect_cuda_rank(op, "topk_idx", topk_idx, {DType::kI32}, 2);
  const int64_t n = topk_idx.size(0), count = topk_idx.numel(), c = cap.capacity;
  TANDEM_CHECK(c >= 0, op, ": capacity is ", c, ", expected at least 0");
  const int64_t rows = c > 0 && cap.pad ? c * num_experts : count;
  expect_slot_count(op, std::max(count, rows));
  expect_cuda(op, "perm", perm, {DType::kI32}, {rows});
  expect_cuda(op, "counts", counts, {DType::kI32}, {num_experts});
  // Not checked to be a permutation here (that would read it to the host); the CPU op checks.
  if (expert_slot.defined()) {
    expect_cuda(op, "expert_slot", expert_slot, {DType::kI32}, {num_experts});
  }
  if (c > 0) {
    TANDEM_CHECK(cap.seq >= 1 && n % cap.seq == 0, op, ": ", n,
                 " tokens are not whole sequences of ", cap.seq);
    if (cap.policy == TokenDropPolicy::kProbs) {
      expect_cuda(op, "topk_w", topk_w, {DType::kF32}, topk_idx.shape());
    }
  }
  const int32_t* ids = topk_idx.data<int32_t>();
  if (count == 0) {
    launch_counts(counts.data<int32_t>(), ids, count, num_experts);
    if (rows > 0) {
      TANDEM_CUDA_CHECK(cudaMemsetAsync(perm.raw_data(), 0xff, perm.nbytes(), stream()));
    }
    return;
  }
  // Stable radix sort of the slots (token, then slot: their flat order) by place, the dropped
  // ones after every place.
  Scratch scratch(op);
  const char* kept =
      c > 0 ? kept_slots(scratch, topk_idx, topk_w, expert_slot, num_experts, cap) : nullptr;
  int32_t* keys_in = scratch.take<int32_t>(count);
  int32_t* keys_out = scratch.take<int32_t>(count);
  int32_t* slots = scratch.take<int32_t>(count);
  int32_t* sorted = c > 0 ? scratch.take<int32_t>(count) : perm.data<int32_t>();
  const int32_t* slot = expert_slot.defined() ? expert_slot.data<int32_t>() : nullptr;
  if (kept != nullptr) {
    kept_keys_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(
        keys_in, slots, kept, ids, slot, count, static_cast<int>(num_experts));
  } else {
    slot_keys_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(
        keys_in, slots, ids, slot, count, static_cast<int>(num_experts));
  }
  TANDEM_CUDA_CHECK_LAUNCH();
  launch_counts(counts.data<int32_t>(), keys_in, count, num_experts);
  const int end_bit = std::bit_width(static_cast<uint64_t>(num_experts));  // covers sentinel E
  sort_pairs(scratch, keys_in, keys_out, slots, sorted, count, end_bit);
  if (c == 0) return;
  int32_t* first = scratch.take<int32_t>(num_experts);
  scan_kernel<<<1, 1, 0, stream()>>>(first, counts.data<int32_t>(), static_cast<int>(num_experts));
  TANDEM_CUDA_CHECK_LAUNCH();
  if (cap.pad) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(perm.raw_data(), 0xff, perm.nbytes(), stream()));
  }
  write_perm_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(
      perm.data<int32_t>(), keys_out, sorted, first, count, static_cast<int>(num_experts), c,
      cap.pad);
  TANDEM_CUDA_CHECK_LAUNCH();
  if (cap.pad) {
    fill_kernel<<<blocks_for(num_experts, kThreads), kThreads, 0, stream()>>>(
        counts.data<int32_t>(), static_cast<int32_t>(c), num_experts);
    TANDEM_CUDA_CHECK_LAUNCH();
  }
}

void permute_forward(const Tensor& out, const Tensor& x, const Tensor& perm, int64_t k) {
  const char* op = "permute_forward";
  const SlotDims d = check_permute(op, "x", x, "out", out, perm, k, /*all_rows=*/true);
  if (d.rows == 0 || d.h == 0) return;
  const bool vec = vec_rows(d.h, {&out, &x});
  permute_forward_kernel<<<row_blocks(d.rows, kThreads), kThreads, 0, stream()>>>(
      static_cast<bf16*>(out.raw_data()), static_cast<const bf16*>(x.raw_data()),
      perm.data<int32_t>(), d.rows, d.count, k, d.h, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void permute_backward(const Tensor& dx, const Tensor& dout, const Tensor& perm, int64_t k,
                      Accumulate acc) {
  const char* op = "permute_backward";
  const SlotDims d = check_permute(op, "dx", dx, "dout", dout, perm, k, /*all_rows=*/false);
  if (d.count == 0 || d.h == 0) return;
  Scratch scratch(op);
  const int32_t* inv = inverse_perm(scratch, perm, d.rows, d.count);
  const bool vec = vec_rows(d.h, {&dx, &dout});
  permute_backward_kernel<<<row_blocks(d.n, kThreads), kThreads, 0, stream()>>>(
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
  const SlotDims d = check_combine(op, "out", out, topk_w);
  const int64_t n = d.n, h = d.h, k = d.k, count = d.count;
  const int64_t rows = check_rows(op, "y", y, perm, h, /*all_rows=*/false);
  if (count == 0 || h == 0) return;
  Scratch scratch(op);
  const int32_t* inv = inverse_perm(scratch, perm, rows, count);
  const bool vec = vec_rows(h, {&out, &y});
  combine_forward_kernel<<<row_blocks(n, kThreads), kThreads, 0, stream()>>>(
      static_cast<bf16*>(out.raw_data()), static_cast<const bf16*>(y.raw_data()), inv,
      topk_w.data<float>(), n, k, h, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void combine_backward(const Tensor& dy, const Tensor& dtopk_w, const Tensor& dout, const Tensor& y,
                      const Tensor& perm, const Tensor& topk_w) {
  const char* op = "combine_backward";
  const SlotDims d = check_combine(op, "dout", dout, topk_w);
  const int64_t n = d.n, h = d.h, k = d.k, count = d.count;
  expect_cuda(op, "dtopk_w", dtopk_w, {DType::kF32}, {n, k});
  const int64_t rows = check_rows(op, "y", y, perm, h, /*all_rows=*/false);
  expect_cuda(op, "dy", dy, {DType::kBF16}, {rows, h});
  if (count == 0) return;
  // A dropped slot's weight has no gradient: no row writes its entry.
  TANDEM_CUDA_CHECK(cudaMemsetAsync(dtopk_w.raw_data(), 0, dtopk_w.nbytes(), stream()));
  if (rows == 0) return;
  const bool vec = vec_rows(h, {&dy, &dout, &y});
  combine_backward_kernel<<<row_blocks(rows, kThreads), kThreads, 0, stream()>>>(
      static_cast<bf16*>(dy.raw_data()), dtopk_w.data<float>(),
      static_cast<const bf16*>(dout.raw_data()), static_cast<const bf16*>(y.raw_data()),
      perm.data<int32_t>(), topk_w.data<float>(), rows, count, k, h, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::ops::cuda
