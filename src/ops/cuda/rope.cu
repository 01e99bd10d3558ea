// CUDA rotary position embedding (HF rotate_half form, docs/model.md) on bf16 q and k, in place,
// fp32 math (Note [Rope blocks]); row n at position n % seq, or at positions[n] (the _at ops,
// --document-positions: Note [Document masking] in data/document_masks.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements of a vector: 16 bytes of bf16

constexpr int64_t kMaxHeadDim = 512;
constexpr int kRopeItems = 4;     // items a thread loads before it writes any
constexpr int kRopeTable = 1024;  // (cos, sin) pairs of a block: its rows times D/2

// Note [Rope blocks]: rope moves 4 bytes a column (read, then written in place) and nothing
// else, so its kernel is laid out for HBM: a block takes whole rows, of q and k at once for
// rope_*_qk, and its threads share them out as items (row, head, group of 8 rotation pairs), each
// item two 16-byte loads and two stores. A thread loads up to kRopeItems items before it writes
// any, about 4 KiB in flight per warp. cos and sin depend on the position and the frequency
// only, so the block forms them once per row in shared memory (the angle in double as the CPU
// forms it, from the CPU's own inverse frequencies) while its first loads are in flight, and
// every head of the row reads them there.

// One tensor rope rotates: [n, heads * D].
struct RopeTensor {
  bf16* out;  // may be x
  const bf16* x;
  int heads;  // 0: absent
};
struct RopeArgs {
  RopeTensor t[2];  // q, then k (or one tensor and an absent one)
  int64_t n, seq;
  const int32_t* positions;  // [n], each row's position; null: row % seq
  int head_dim;
  int rows;                          // rows per block; rows * D / 2 <= kRopeTable
  float sign;                        // 1: rotate by +angle (forward); -1: by -angle (backward)
  double inv_freq[kMaxHeadDim / 2];  // rope_inv_freq, i < D / 2, formed on the host
};

// kV elements: one 16-byte vector (kV = 8) or one bf16 (kV = 1, any alignment).
template <int kV>
using RopeRaw = std::conditional_t<kV == kVec, uint4, bf16>;

// Items of block rows [row0, row0 + rows): item it is row it / units, unit it % units; units
// count the (head, group) of t[0], then of t[1]. out1 = u1 c - u2 s, out2 = u2 c + u1 s with
// u1 = x[i], u2 = x[i + D/2], each item read whole before it is written and by one thread only,
// so out may alias x (Note [Rope blocks]).
template <int kV>
__global__ void __launch_bounds__(kThreads, 4) rope_kernel(const __grid_constant__ RopeArgs a) {
  __shared__ float2 table[kRopeTable];  // [rows, D/2]: cos, sign * sin at each row's position
  const int half = a.head_dim / 2, groups = half / kV;
  const int units0 = a.t[0].heads * groups, units = units0 + a.t[1].heads * groups;
  const int64_t row0 = int64_t{blockIdx.x} * a.rows;
  const int rows = static_cast<int>(min(int64_t{a.rows}, a.n - row0));
  const int items = rows * units;
  for (int first = 0; first < items; first += kThreads * kRopeItems) {  // the same in every thread
    bf16* dst[kRopeItems];
    int cs[kRopeItems];  // the item's first (cos, sin) in table
    RopeRaw<kV> u1[kRopeItems], u2[kRopeItems];
#pragma unroll
    for (int m = 0; m < kRopeItems; ++m) {
      const int it = first + threadIdx.x + kThreads * m;
      if (it < items) {
        const int r = it / units;
        int u = it - r * units;
        const bool second = u >= units0;
        if (second) u -= units0;
        const RopeTensor& t = second ? a.t[1] : a.t[0];
        const int head = u / groups, grp = u - head * groups;
        const int64_t off = (row0 + r) * t.heads * a.head_dim + head * a.head_dim + grp * kV;
        dst[m] = t.out + off;
        cs[m] = r * half + grp * kV;
        u1[m] = *reinterpret_cast<const RopeRaw<kV>*>(t.x + off);
        u2[m] = *reinterpret_cast<const RopeRaw<kV>*>(t.x + off + half);
      }
    }
    if (first == 0) {
      // i-major, so a warp reads few distinct inv_freq (distinct kernel parameters serialize).
      const int64_t pos0 = row0 % a.seq;
      for (int e = threadIdx.x; e < rows * half; e += kThreads) {
        const int i = e / rows, r = e - i * rows;
        const int64_t pos = a.positions != nullptr ? a.positions[row0 + r]
                            : pos0 + r < a.seq     ? pos0 + r
                                                   : (pos0 + r) % a.seq;
        const float2 c = rope_cos_sin(static_cast<double>(pos) * a.inv_freq[i]);
        table[r * half + i] = make_float2(c.x, a.sign * c.y);
      }
      __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < kRopeItems; ++m) {
      if (first + threadIdx.x + kThreads * m < items) {
        float x1[kV], x2[kV], o1[kV], o2[kV];
        if constexpr (kV == kVec)
          unpack8(u1[m], x1), unpack8(u2[m], x2);
        else
          x1[0] = __bfloat162float(u1[m]), x2[0] = __bfloat162float(u2[m]);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float2 c = table[cs[m] + e];
          o1[e] = x1[e] * c.x - x2[e] * c.y;
          o2[e] = x2[e] * c.x + x1[e] * c.y;
        }
        if constexpr (kV == kVec) {
          store_vec(dst[m], o1);
          store_vec(dst[m] + half, o2);
        } else {
          store1(dst[m], o1[0]);
          store1(dst[m] + half, o2[0]);
        }
      }
    }
  }
}

// Checks one tensor of a rope call: bf16 on the GPU, [rows, heads * head_dim].
void expect_rope_tensor(const char* op, const char* name, const Tensor& t, int64_t heads,
                        int64_t head_dim) {
  expect_cuda_rank(op, name, t, {DType::kBF16}, 2);
  TANDEM_CHECK(heads >= 1 && heads <= (int64_t{1} << 24), op, ": ", name, " has ", heads,
               " heads, expected 1 to 2^24");
  TANDEM_CHECK(t.size(1) == heads * head_dim, op, ": ", name, " has ", t.size(1),
               " columns; expected heads * head_dim = ", heads * head_dim);
}

// Rotates t[0] and, when t[1].heads > 0, t[1] (both [n, heads * head_dim], checked) in one launch.
// positions: each row's (i32 [n] on the GPU, values in [0, seq) the caller's to keep), or
// undefined for row % seq.
void rope_launch(const char* op, RopeTensor t0, RopeTensor t1, int64_t n, int64_t seq,
                 int64_t head_dim, const RopeSpec& rope, float sign, const Tensor& positions) {
  TANDEM_CHECK(seq >= 1, op, ": seq is ", seq, ", expected at least 1");
  TANDEM_CHECK(!rope.interleaved && rope.scaling != RopeScaling::kYarn, op,
               ": interleaved RoPE and YaRN (DeepSeek-V3) are not implemented on the GPU");
  TANDEM_CHECK(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= kMaxHeadDim, op, ": head_dim ",
               head_dim, " must be even and in [2, ", kMaxHeadDim, "]");
  if (n == 0) return;
  const int64_t half = head_dim / 2;
  bool vec = half % kVec == 0;
  for (const RopeTensor& t : {t0, t1}) {
    if (t.heads > 0) vec = vec && aligned16(t.x) && aligned16(t.out);
  }
  const int64_t width = (int64_t{t0.heads} + t1.heads) * head_dim;  // of q and k together
  TANDEM_CHECK(width < (int64_t{1} << 31), op, ": rows of ", width, " columns are too wide");
  const int64_t units = width / 2 / (vec ? kVec : 1);  // items a row holds
  if (positions.defined()) expect_cuda(op, "positions", positions, {DType::kI32}, {n});
  RopeArgs a{{t0, t1},
             n,
             seq,
             positions.defined() ? positions.data<int32_t>() : nullptr,
             static_cast<int>(head_dim),
             0,
             sign,
             {}};
  a.rows = static_cast<int>(std::clamp<int64_t>(kThreads * kRopeItems / units, 1,
                                                std::min<int64_t>(kRopeTable / half, n)));
  const std::vector<double> inv_freq = rope_inv_freq(rope, head_dim);  // as the CPU
  std::copy(inv_freq.begin(), inv_freq.end(), a.inv_freq);
  const int64_t blocks = (n + a.rows - 1) / a.rows;
  TANDEM_CHECK(blocks < (int64_t{1} << 31), op, ": ", n, " rows are too many");
  if (vec)
    rope_kernel<kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(a);
  else
    rope_kernel<1><<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(a);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void rope_apply(const char* op, const Tensor& out, const Tensor& x, int64_t seq, int64_t heads,
                int64_t head_dim, const RopeSpec& rope, float sign) {
  expect_rope_tensor(op, "x", x, heads, head_dim);
  expect_cuda(op, "out", out, {DType::kBF16}, x.shape());
  const RopeTensor t{static_cast<bf16*>(out.raw_data()), static_cast<const bf16*>(x.raw_data()),
                     static_cast<int>(heads)};
  rope_launch(op, t, RopeTensor{nullptr, nullptr, 0}, x.size(0), seq, head_dim, rope, sign,
              Tensor());
}

void rope_apply_qk(const char* op, const Tensor& q, const Tensor& k, int64_t seq, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, const RopeSpec& rope, float sign,
                   const Tensor& positions) {
  expect_rope_tensor(op, "q", q, heads, head_dim);
  expect_rope_tensor(op, "k", k, kv_heads, head_dim);
  TANDEM_CHECK(k.size(0) == q.size(0), op, ": k has ", k.size(0), " rows, q has ", q.size(0));
  auto* pq = static_cast<bf16*>(q.raw_data());
  auto* pk = static_cast<bf16*>(k.raw_data());
  rope_launch(op, {pq, pq, static_cast<int>(heads)}, {pk, pk, static_cast<int>(kv_heads)},
              q.size(0), seq, head_dim, rope, sign, positions);
}

}  // namespace

void rope_forward(const Tensor& out, const Tensor& x, int64_t seq, int64_t heads, int64_t head_dim,
                  const RopeSpec& rope) {
  rope_apply("rope_forward", out, x, seq, heads, head_dim, rope, 1.0f);
}

void rope_backward(const Tensor& dx, const Tensor& dy, int64_t seq, int64_t heads, int64_t head_dim,
                   const RopeSpec& rope) {
  rope_apply("rope_backward", dx, dy, seq, heads, head_dim, rope, -1.0f);
}

void rope_forward_qk(const Tensor& q, const Tensor& k, int64_t seq, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, const RopeSpec& rope) {
  rope_apply_qk("rope_forward_qk", q, k, seq, heads, kv_heads, head_dim, rope, 1.0f, Tensor());
}

void rope_backward_qk(const Tensor& dq, const Tensor& dk, int64_t seq, int64_t heads,
                      int64_t kv_heads, int64_t head_dim, const RopeSpec& rope) {
  rope_apply_qk("rope_backward_qk", dq, dk, seq, heads, kv_heads, head_dim, rope, -1.0f, Tensor());
}

void rope_forward_qk_at(const Tensor& q, const Tensor& k, int64_t seq, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, const RopeSpec& rope,
                        const Tensor& positions) {
  rope_apply_qk("rope_forward_qk_at", q, k, seq, heads, kv_heads, head_dim, rope, 1.0f, positions);
}

void rope_backward_qk_at(const Tensor& dq, const Tensor& dk, int64_t seq, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, const RopeSpec& rope,
                         const Tensor& positions) {
  rope_apply_qk("rope_backward_qk_at", dq, dk, seq, heads, kv_heads, head_dim, rope, -1.0f,
                positions);
}

}  // namespace tandem::ops::cuda
