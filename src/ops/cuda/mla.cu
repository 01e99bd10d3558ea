// CUDA multi-head latent attention's q, k and v from their products, and the transpose
// (docs/model.md "Multi-head latent attention"; the CPU's in ops/cpu/mla.cc). A block takes one
// token row: it stages what may be overwritten in place (q_in, which q may be; dq, which d_q_in
// may be) and the row's shared k_rope (or the heads' summed k_rope gradient) in shared memory,
// then its threads write the output columns, each from the staged row: the heads' nope parts and
// v are copies, the RoPE parts rotations as RopeTable's (the pairs (i, i + dr/2), or with
// --rotary-interleaved (2i, 2i + 1) read and (i, i + dr/2) written, and the transpose the other
// way), by cos and sin formed from the CPU's inverse frequencies times YaRN's attention factor,
// at position r % seq of row r, or positions[r] (the _at ops, --document-positions).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kMaxRopeDim = 256;
constexpr int kMaxSmem = 200 * 1024;

struct MlaArgs {
  int64_t seq;
  const int32_t* positions;  // [rows], each row's position; null: row % seq
  int heads, dn, dr, dv;     // qk = dn + dr per head of q and k, dn + dv per head of kv
  bool interleaved;
  float factor;                      // YaRN's attention factor on cos and sin (1 otherwise)
  double inv_freq[kMaxRopeDim / 2];  // rope_inv_freq(rope, dr), as the CPU
};

__device__ __forceinline__ int64_t row_position(int64_t r, const MlaArgs& a) {
  return a.positions != nullptr ? a.positions[r] : r % a.seq;
}

// The row's cos and sin for each of the dr / 2 frequencies (rope_cos_sin of pos times the
// CPU's inverse frequency), into shared memory once for every head of q and k.
__device__ __forceinline__ void stage_cos_sin(float2* cs, int64_t pos, const MlaArgs& a) {
  for (int i = static_cast<int>(threadIdx.x); i < a.dr / 2; i += kThreads)
    cs[i] = rope_cos_sin(static_cast<double>(pos) * a.inv_freq[i]);
}

// Column j < dr of the rotation of one head's RoPE part x (f32 or bf16, in shared memory) by the
// row's staged cos and sin; sign 1: the forward, -1: the transpose.
template <typename T>
__device__ __forceinline__ float rotated(const T* x, int j, const float2* cos_sin, float sign,
                                         const MlaArgs& a) {
  const int half = a.dr / 2;
  int i;
  bool first;
  float u1, u2;
  if (a.interleaved && sign < 0) {  // reads (i, i + half), writes (2i, 2i + 1)
    i = j / 2, first = j % 2 == 0;
    u1 = load1(x + i), u2 = load1(x + i + half);
  } else {
    i = j < half ? j : j - half, first = j < half;
    const bool pairs = a.interleaved;  // the forward reads (2i, 2i + 1)
    u1 = load1(x + (pairs ? 2 * i : i)), u2 = load1(x + (pairs ? 2 * i + 1 : i + half));
  }
  const float2 cs = cos_sin[i];
  const float c = cs.x * a.factor, s = sign * cs.y * a.factor;
  return first ? u1 * c - u2 * s : u2 * c + u1 * s;
}

// One row: q = q_in with its RoPE parts rotated, k = [kv's nope part | rope(k_rope)] per head,
// v = kv's v part per head. Shared memory: the q_in row, then the k_rope row. A warp writes a
// head's columns at a time (no division per column).
__global__ void __launch_bounds__(kThreads)
    mla_forward_kernel(bf16* q, bf16* k, bf16* v, const bf16* q_in, const bf16* kv,
                       const bf16* k_rope, const __grid_constant__ MlaArgs a) {
  extern __shared__ bf16 row[];
  __shared__ float2 s_cs[kMaxRopeDim / 2];
  const int qk = a.dn + a.dr, kvh = a.dn + a.dv, qw = a.heads * qk;
  const int64_t r = blockIdx.x, pos = row_position(r, a);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  bf16* s_kr = row + qw;
  for (int c = threadIdx.x; c < qw; c += kThreads) row[c] = q_in[r * qw + c];
  for (int c = threadIdx.x; c < a.dr; c += kThreads) s_kr[c] = k_rope[r * a.dr + c];
  stage_cos_sin(s_cs, pos, a);
  __syncthreads();
  bf16* q_row = q + r * qw;
  bf16* k_row = k + r * qw;
  bf16* v_row = v + r * a.heads * a.dv;
  for (int h = warp; h < a.heads; h += kThreads / 32) {
    const bf16* q_head = row + h * qk;
    const bf16* kv_head = kv + r * a.heads * kvh + h * kvh;
    for (int j = lane; j < a.dn; j += 32) {
      q_row[h * qk + j] = q_head[j];
      k_row[h * qk + j] = kv_head[j];
    }
    for (int j = lane; j < a.dr; j += 32) {
      store1(q_row + h * qk + a.dn + j, rotated(q_head + a.dn, j, s_cs, 1.f, a));
      store1(k_row + h * qk + a.dn + j, rotated(s_kr, j, s_cs, 1.f, a));
    }
    for (int j = lane; j < a.dv; j += 32) v_row[h * a.dv + j] = kv_head[a.dn + j];
  }
}

// One row of the transpose: d_q_in = dq with its RoPE parts rotated back, d_kv = (dk's nope part |
// dv) per head, d_k_rope = the rotation back of the heads' dk RoPE parts summed in head order.
// Shared memory: the dq row, then the f32 sum. A warp writes a head's columns at a time.
__global__ void __launch_bounds__(kThreads)
    mla_backward_kernel(bf16* d_q_in, bf16* d_kv, bf16* d_k_rope, const bf16* dq, const bf16* dk,
                        const bf16* dv, const __grid_constant__ MlaArgs a) {
  extern __shared__ bf16 row[];
  __shared__ float2 s_cs[kMaxRopeDim / 2];
  const int qk = a.dn + a.dr, kvh = a.dn + a.dv, qw = a.heads * qk;
  const int64_t r = blockIdx.x, pos = row_position(r, a);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* s_sum = reinterpret_cast<float*>(row + ((qw + 1) / 2) * 2);
  for (int c = threadIdx.x; c < qw; c += kThreads) row[c] = dq[r * qw + c];
  for (int c = threadIdx.x; c < a.dr; c += kThreads) {
    float sum = 0;
    for (int h = 0; h < a.heads; ++h) sum += __bfloat162float(dk[r * qw + h * qk + a.dn + c]);
    s_sum[c] = sum;
  }
  stage_cos_sin(s_cs, pos, a);
  __syncthreads();
  bf16* dq_row = d_q_in + r * qw;
  bf16* dkv_row = d_kv + r * a.heads * kvh;
  for (int h = warp; h < a.heads; h += kThreads / 32) {
    const bf16* dq_head = row + h * qk;
    const bf16* dk_head = dk + r * qw + h * qk;
    const bf16* dv_head = dv + r * a.heads * a.dv + h * a.dv;
    for (int j = lane; j < a.dn; j += 32) {
      dq_row[h * qk + j] = dq_head[j];
      dkv_row[h * kvh + j] = dk_head[j];
    }
    for (int j = lane; j < a.dr; j += 32)
      store1(dq_row + h * qk + a.dn + j, rotated(dq_head + a.dn, j, s_cs, -1.f, a));
    for (int j = lane; j < a.dv; j += 32) dkv_row[h * kvh + a.dn + j] = dv_head[j];
  }
  for (int c = threadIdx.x; c < a.dr; c += kThreads)
    store1(d_k_rope + r * a.dr + c, rotated(s_sum, c, s_cs, -1.f, a));
}

// Checks the tensors of one call (bf16 on the GPU, the shapes of ops.h) and returns its arguments
// and shared-memory bytes.
struct MlaCall {
  MlaArgs args;
  int64_t rows;
  int smem;
};
MlaCall check_mla(const char* op, const Tensor& q, const Tensor& q_in, const Tensor& k,
                  const Tensor& v, const Tensor& kv, const Tensor& k_rope, int64_t seq,
                  int64_t heads, int64_t dn, int64_t dr, int64_t dv, const RopeSpec& rope,
                  const Tensor& positions) {
  TANDEM_CHECK(seq >= 1 && heads >= 1 && dn >= 1 && dv >= 1, op, ": seq ", seq, ", heads ", heads,
               ", nope_dim ", dn, " and v_dim ", dv, " must all be at least 1");
  TANDEM_CHECK(dr >= 2 && dr % 2 == 0 && dr <= kMaxRopeDim, op, ": rope_dim ", dr,
               " must be even and in [2, ", kMaxRopeDim, "]");
  const int64_t n = q.size(0), qk = dn + dr;
  expect_cuda(op, "q", q, {DType::kBF16}, {n, heads * qk});
  expect_cuda(op, "q_in", q_in, {DType::kBF16}, {n, heads * qk});
  expect_cuda(op, "k", k, {DType::kBF16}, {n, heads * qk});
  expect_cuda(op, "v", v, {DType::kBF16}, {n, heads * dv});
  expect_cuda(op, "kv", kv, {DType::kBF16}, {n, heads * (dn + dv)});
  expect_cuda(op, "k_rope", k_rope, {DType::kBF16}, {n, dr});
  const int64_t smem = ((heads * qk + 1) / 2) * 4 + dr * 4;
  TANDEM_CHECK(smem <= kMaxSmem && n < (int64_t{1} << 31), op, ": ", heads, " heads of ", qk,
               " columns (", smem, " bytes of a row in shared memory, at most ", kMaxSmem, ") or ",
               n, " rows (below 2^31) are too many");
  if (positions.defined()) expect_cuda(op, "positions", positions, {DType::kI32}, {n});
  MlaCall call{MlaArgs{seq,
                       positions.defined() ? positions.data<int32_t>() : nullptr,
                       static_cast<int>(heads),
                       static_cast<int>(dn),
                       static_cast<int>(dr),
                       static_cast<int>(dv),
                       rope.interleaved,
                       static_cast<float>(rope_attention_factor(rope)),
                       {}},
               n, static_cast<int>(smem)};
  const std::vector<double> inv_freq = rope_inv_freq(rope, dr);
  std::copy(inv_freq.begin(), inv_freq.end(), call.args.inv_freq);
  return call;
}

// Raises a kernel's dynamic shared-memory limit (above the default 48 KiB) to kMaxSmem.
template <typename Kernel>
bool allow_mla_smem(Kernel kernel) {
  TANDEM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
  return true;
}

bf16* mp(const Tensor& t) { return static_cast<bf16*>(t.raw_data()); }
const bf16* cp(const Tensor& t) { return static_cast<const bf16*>(t.raw_data()); }

}  // namespace

namespace {

void mla_forward(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& q_in, const Tensor& kv, const Tensor& k_rope, int64_t seq,
                 int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim,
                 const RopeSpec& rope, const Tensor& positions) {
  const MlaCall c = check_mla(op, q, q_in, k, v, kv, k_rope, seq, heads, nope_dim, rope_dim, v_dim,
                              rope, positions);
  if (c.rows == 0) return;
  static const bool configured = allow_mla_smem(mla_forward_kernel);
  (void)configured;
  mla_forward_kernel<<<static_cast<unsigned>(c.rows), kThreads, c.smem, stream()>>>(
      mp(q), mp(k), mp(v), cp(q_in), cp(kv), cp(k_rope), c.args);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void mla_backward(const char* op, const Tensor& d_q_in, const Tensor& d_kv, const Tensor& d_k_rope,
                  const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq, int64_t heads,
                  int64_t nope_dim, int64_t rope_dim, int64_t v_dim, const RopeSpec& rope,
                  const Tensor& positions) {
  const MlaCall c = check_mla(op, dq, d_q_in, dk, dv, d_kv, d_k_rope, seq, heads, nope_dim,
                              rope_dim, v_dim, rope, positions);
  if (c.rows == 0) return;
  static const bool configured = allow_mla_smem(mla_backward_kernel);
  (void)configured;
  mla_backward_kernel<<<static_cast<unsigned>(c.rows), kThreads, c.smem, stream()>>>(
      mp(d_q_in), mp(d_kv), mp(d_k_rope), cp(dq), cp(dk), cp(dv), c.args);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void mla_qkv_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_in,
                     const Tensor& kv, const Tensor& k_rope, int64_t seq, int64_t heads,
                     int64_t nope_dim, int64_t rope_dim, int64_t v_dim, const RopeSpec& rope) {
  mla_forward("mla_qkv_forward", q, k, v, q_in, kv, k_rope, seq, heads, nope_dim, rope_dim, v_dim,
              rope, Tensor());
}

void mla_qkv_backward(const Tensor& d_q_in, const Tensor& d_kv, const Tensor& d_k_rope,
                      const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq,
                      int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim,
                      const RopeSpec& rope) {
  mla_backward("mla_qkv_backward", d_q_in, d_kv, d_k_rope, dq, dk, dv, seq, heads, nope_dim,
               rope_dim, v_dim, rope, Tensor());
}

void mla_qkv_forward_at(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_in,
                        const Tensor& kv, const Tensor& k_rope, int64_t seq, int64_t heads,
                        int64_t nope_dim, int64_t rope_dim, int64_t v_dim, const RopeSpec& rope,
                        const Tensor& positions) {
  mla_forward("mla_qkv_forward_at", q, k, v, q_in, kv, k_rope, seq, heads, nope_dim, rope_dim,
              v_dim, rope, positions);
}

void mla_qkv_backward_at(const Tensor& d_q_in, const Tensor& d_kv, const Tensor& d_k_rope,
                         const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq,
                         int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim,
                         const RopeSpec& rope, const Tensor& positions) {
  mla_backward("mla_qkv_backward_at", d_q_in, d_kv, d_k_rope, dq, dk, dv, seq, heads, nope_dim,
               rope_dim, v_dim, rope, positions);
}

}  // namespace tandem::ops::cuda
