// Flash attention on the GPU: causal (within document bounds when given:
// Note [Attention document bounds] in attention_mma.cuh), grouped-query heads, scale 1/sqrt(D) or
// the model's own; bf16 q/k/v/out and gradients, f32 log-sum-exp, fp32 accumulation everywhere.
// Head dims 64 and 128, and q/k 192 with v 128 (multi-head latent attention; 16-byte aligned
// tensors) run on the tensor cores (mma.sync m16n8k16 bf16, tiles staged in shared memory by
// cp.async, tiles above the diagonal and outside the documents skipped); any other D up to 256
// runs a plain warp-per-row kernel (v's head dim may differ from q/k's there too). The
// tensor-core backward is FlashAttention-2's, by default in two passes (dk and dv by key tiles,
// then dq by query tiles: deterministic, Note [Deterministic attention backward]), or in one pass
// per KV-head key tile that sums dq in an f32 workspace by atomics (faster; its bits depend on
// arrival order). The generic backward is deterministic: one pass owns the dq rows (and writes
// delta), a second the dk/dv rows. This file: the forward kernels, the checks and the dispatch;
// the backward kernels are in attention_backward.cu, what both use in attention_mma.cuh, the
// generic kernels in attention_generic.cu and the geometry all use in attention_common.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

#include "core/footprint.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_mma.cuh"
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

namespace {

using namespace attn;  // NOLINT: this file's own kernels' helpers

// ---------------------------------------------------------------------------------------------
// Tensor-core forward. Block: kBr = WARPS warps x 16*MT query rows of one (batch, head); K/V
// tiles of BC keys double-buffered in shared memory; S = Q K^T and O += P V on mma.sync, online
// softmax in registers (base 2). Q fragments stay in registers for the whole block.
// ---------------------------------------------------------------------------------------------

template <int D, int DV, int WARPS, int MT, int BC>
struct ForwardTiles {
  static constexpr int kThreads = 32 * WARPS, kBr = WARPS * 16 * MT, kBc = BC, kPitch = D + 8,
                       kVPitch = DV + 8;
  static constexpr int kSmemBytes =
      ((kBr + 2 * kBc) * kPitch + 2 * kBc * kVPitch) * int{sizeof(bf16)};
};

// One key tile for one warp: s = scores, then the online-softmax update of o, m, l.
template <int D, int DV, int MT, int BC>
__device__ __forceinline__ void forward_key_tile(float (&o)[MT][DV / 8][4], float (&m)[MT][2],
                                                 float (&l)[MT][2],
                                                 const uint32_t (&qf)[D / 16][MT][4],
                                                 const bf16* s_k, const bf16* s_v, int k0, int row0,
                                                 const RowBounds& rb, const Geometry& g, int lane) {
  constexpr int kBc = BC, kP = D + 8, kNt = kBc / 8;
  float s[MT][kNt][4] = {};
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) mma_nt<MT, kNt>(s, qf[kc], s_k + kc * 16, kP, lane);

  // Note [Attention document bounds]: keys below a row's first key are masked as those above it.
  const bool need_mask = k0 + kBc - 1 > row0 || k0 + kBc > g.seq || k0 < rb.hi;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + mt * 16 + (lane >> 2) + 8 * r;
      const int lo = need_mask && row < g.seq ? rb.first_key(row) : 0;
      float mx = -INFINITY;  // of the raw scores (scale_log2 > 0 keeps the order)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          const int col = k0 + nt * 8 + 2 * (lane & 3) + (e & 1);
          if (need_mask && !(col <= row && col < g.seq && col >= lo)) s[mt][nt][e] = -INFINITY;
          mx = fmaxf(mx, s[mt][nt][e]);
        }
      }
      const float m_new = fmaxf(m[mt][r], quad_max(mx) * g.scale_log2);
      const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet stays at 0
      const float corr = fast_exp2(m[mt][r] - base);
      float sum = 0;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[mt][nt][e] = fast_exp2(fmaf(s[mt][nt][e], g.scale_log2, -base));
          sum += s[mt][nt][e];
        }
      }
      l[mt][r] = l[mt][r] * corr + sum;  // this thread's columns; the quad sums at the end
      m[mt][r] = m_new;
#pragma unroll
      for (int dn = 0; dn < DV / 8; ++dn) {
        o[mt][dn][2 * r] *= corr;
        o[mt][dn][2 * r + 1] *= corr;
      }
    }
  }
  mma_c_nn<MT, kBc / 16, DV / 8>(o, s, s_v, DV + 8, lane);  // o += P V
}

// MINB: blocks per multiprocessor the register allocation must allow (__launch_bounds__).
template <int D, int DV, int WARPS, int MT, int BC, int MINB, bool DOCS>
__global__ void __launch_bounds__(32 * WARPS, MINB)
    flash_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                         const bf16* __restrict__ q, const bf16* __restrict__ k,
                         const bf16* __restrict__ v, Geometry g) {
  using T = ForwardTiles<D, DV, WARPS, MT, BC>;
  constexpr int kBr = T::kBr, kBc = T::kBc, kP = T::kPitch, kTh = T::kThreads;
  extern __shared__ uint4 smem[];
  bf16* s_q = reinterpret_cast<bf16*>(smem);  // [kBr][kP]
  bf16* s_k = s_q + kBr * kP;                 // [2][kBc][kP]
  bf16* s_v = s_k + 2 * kBc * kP;             // [2][kBc][kVPitch]

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const auto [b, h, q0, q_off, o_off, k_off, v_off, n_tiles] = query_tile<D, DV, kBr, kBc>(g);

  const int row0 = q0 + warp * 16 * MT;  // this warp's first query row
  load_tile<kBr, D, kTh>(s_q, q + q_off, g.q_stride, q0, g.seq);
  cp_async_commit();
  // Note [Attention document bounds]: the walk starts at the block's first attended key tile.
  const RowBounds rb = warp_row_bounds<16 * MT, DOCS>(g, b, row0, lane);
  const int first_tile = first_key_tile<kBc, DOCS>(rb.lo, n_tiles);
  load_tile<kBc, D, kTh>(s_k, k + k_off, g.kv_stride, first_tile * kBc, g.seq);
  load_tile<kBc, DV, kTh>(s_v, v + v_off, g.v_stride, first_tile * kBc, g.seq);
  cp_async_commit();
  cp_async_wait<1>();  // the Q tile
  __syncthreads();

  uint32_t qf[D / 16][MT][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      ldmatrix_x4(qf[kc][mt],
                  s_q + (warp * 16 * MT + mt * 16 + (lane & 15)) * kP + kc * 16 + (lane >> 4) * 8);
    }
  }
  float o[MT][DV / 8][4] = {};
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0;

  walk_key_tiles<kBc, D, DV, kTh>(
      s_k, s_v, k, v, k_off, v_off, first_tile, n_tiles, rb.lo, row0 + 16 * MT - 1, g,
      [&](const bf16* tk, const bf16* tv, int k0) {
        forward_key_tile<D, DV, MT, BC>(o, m, l, qf, tk, tv, k0, row0, rb, g, lane);
      });

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(l[mt][r]);
      inv[r] = sum > 0 ? 1.f / sum : 0.f;
      const int row = row0 + mt * 16 + (lane >> 2) + 8 * r;
      if (row < g.seq && (lane & 3) == 0)
        lse[(int64_t{b} * g.heads + h) * g.seq + row] = (m[mt][r] + log2f(sum)) * kLn2;
#pragma unroll
      for (int dn = 0; dn < DV / 8; ++dn) {
        o[mt][dn][2 * r] *= inv[r];
        o[mt][dn][2 * r + 1] *= inv[r];
      }
    }
    store_rows<DV>(out + o_off, g.o_stride, row0 + mt * 16, g.seq, o[mt], 1.f, lane);
  }
}

// Checks the shape against the tensors (throws tandem::Error naming the op) and returns it as
// kernel geometry.
Geometry check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& lse, const AttentionShape& s) {
  TANDEM_CHECK(s.batch >= 1 && s.seq >= 1 && s.heads >= 1 && s.kv_heads >= 1 && s.head_dim >= 1, op,
               ": batch ", s.batch, ", seq ", s.seq, ", heads ", s.heads, ", kv_heads ", s.kv_heads,
               " and head_dim ", s.head_dim, " must all be at least 1");
  TANDEM_CHECK(s.heads % s.kv_heads == 0, op, ": heads ", s.heads,
               " is not a multiple of kv_heads ", s.kv_heads);
  TANDEM_CHECK(s.head_dim <= kMaxGenericDim && s.v_dim() <= kMaxGenericDim, op, ": head_dim ",
               s.head_dim, " or v_head_dim ", s.v_dim(), " is larger than the supported ",
               kMaxGenericDim);
  // Grid limits: (batch * heads) blocks in x, seq / 64 tiles in y (at most 65535), and the
  // generic kernels' one warp per row in a 1-D grid.
  TANDEM_CHECK(s.seq <= int64_t{65535} * kKeyTile && s.batch * s.heads <= (int64_t{1} << 30), op,
               ": batch ", s.batch, " x heads ", s.heads, " x seq ", s.seq,
               " exceeds the kernels' grid (seq at most ", int64_t{65535} * kKeyTile,
               ", batch x heads at most 2^30)");
  TANDEM_CHECK(s.batch * s.heads * s.seq <= (int64_t{1} << 32), op, ": batch x heads x seq ",
               s.batch * s.heads * s.seq, " exceeds 2^32");
  const int64_t n = s.batch * s.seq;
  expect_cuda(op, "q", q, {DType::kBF16}, {n, s.heads * s.head_dim});
  expect_cuda(op, "k", k, {DType::kBF16}, {n, s.kv_heads * s.head_dim});
  expect_cuda(op, "v", v, {DType::kBF16}, {n, s.kv_heads * s.v_dim()});
  expect_cuda(op, "lse", lse, {DType::kF32}, {s.batch, s.heads, s.seq});
  // Document bounds (Note [Attention document bounds]): their values are the caller's to keep in
  // [0, i]; reading them back to check would wait for the stream.
  if (s.key_begin.defined()) expect_cuda(op, "key_begin", s.key_begin, {DType::kI32}, {n});
  const auto as_int = [](int64_t x) { return static_cast<int>(x); };
  return Geometry{.batch = as_int(s.batch),
                  .seq = as_int(s.seq),
                  .heads = as_int(s.heads),
                  .kv_heads = as_int(s.kv_heads),
                  .group = as_int(s.heads / s.kv_heads),
                  .head_dim = as_int(s.head_dim),
                  .v_dim = as_int(s.v_dim()),
                  .q_stride = s.heads * s.head_dim,
                  .kv_stride = s.kv_heads * s.head_dim,
                  .v_stride = s.kv_heads * s.v_dim(),
                  .o_stride = s.heads * s.v_dim(),
                  .scale = static_cast<float>(s.softmax_scale()),
                  .scale_log2 = static_cast<float>(kLog2e * s.softmax_scale()),
                  .key_begin = s.key_begin.defined() ? s.key_begin.data<int32_t>() : nullptr};
}

// The tensor-core kernels need their head dims (attention_tensor_core_dims, which the planner
// reads too) and 16-byte aligned rows (cp.async, bf16x2 stores).
bool fast_path(const Geometry& g, std::initializer_list<const Tensor*> tensors) {
  if (!attention_tensor_core_dims(g.head_dim, g.v_dim)) return false;
  for (const Tensor* t : tensors) {
    if (reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
  }
  return true;
}

template <int D, int DV, int WARPS, int MT, int BC, int MINB>
void launch_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                    const Tensor& v, const Geometry& g) {
  using T = ForwardTiles<D, DV, WARPS, MT, BC>;
  // Note [Attention document bounds]: the kernel with bounds only for a call that has them.
  auto* plain = flash_forward_kernel<D, DV, WARPS, MT, BC, MINB, false>;
  auto* documents = flash_forward_kernel<D, DV, WARPS, MT, BC, MINB, true>;
  static const bool configured =
      (allow_smem(plain, T::kSmemBytes), allow_smem(documents, T::kSmemBytes), true);
  (void)configured;
  const dim3 grid(static_cast<unsigned>(g.batch * g.heads), tiles(g.seq, T::kBr));
  (g.key_begin != nullptr ? documents : plain)<<<grid, T::kThreads, T::kSmemBytes, stream()>>>(
      mptr(out), lse.data<float>(), cptr(q), cptr(k), cptr(v), g);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// Forward: query rows per block = warps x 16 x MT, each K/V fragment serving MT m16 tiles.
constexpr Variant<ForwardLaunch> kForwardVariants[] = {
    {"w4_q128_k64_m2", launch_forward<64, 64, 4, 2, 64, 2>},
    {"w4_q64_k128_m2", launch_forward<64, 64, 4, 1, 128, 2>},
    {"w8_q128_k32_m2", launch_forward<64, 64, 8, 1, 32, 2>},
};
// D 128, and q/k 192 with v 128 (D the q/k head dim): one table for both. Index 0, the default:
// 64 query rows by 64-key tiles (243 registers at D 128; at D 192 it spills 88 bytes). Registers at
// D 128 / 192 (ptxas, sm_90a), in order: 243 / 255, 219 / 255 (spills 20 bytes at 192), 197 / 229,
// 186 / 209, 156 / 181. Left out because they spill at D 128: two m16 tiles a warp (MT 2: Q
// fragments and the o accumulator alone take 192 registers; 16 to 92 bytes with 16- or 32-key
// tiles) and 128-key tiles (304 bytes).
template <int D>
constexpr Variant<ForwardLaunch> kForward128Variants[] = {
    {"w4_q64_k64_m1", launch_forward<D, 128, 4, 1, 64, 1>},
    {"w8_q128_k64_m1", launch_forward<D, 128, 8, 1, 64, 1>},
    {"w4_q64_k32_m1", launch_forward<D, 128, 4, 1, 32, 1>},
    {"w8_q128_k32_m1", launch_forward<D, 128, 8, 1, 32, 1>},
    {"w4_q64_k16_m1", launch_forward<D, 128, 4, 1, 16, 1>},
};
std::vector<const char*> forward_variant_names() { return variant_names(kForwardVariants); }
std::vector<const char*> forward128_variant_names() {
  return variant_names(kForward128Variants<128>);
}

// The variant `text` names, by index or by name ("": 0), for the --attention-*-variant option
// `option` (Note [Performance settings] in core/tuning.h).
int named_variant(const char* option, const std::string& text,
                  const std::vector<const char*>& names) {
  if (text.empty()) return 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return static_cast<int>(i);
  }
  char* end = nullptr;
  const long index = std::strtol(text.c_str(), &end, 10);
  std::string listed;
  for (const char* n : names) listed += std::string(listed.empty() ? "" : ", ") + n;
  TANDEM_CHECK(*end == '\0' && index >= 0 && index < static_cast<long>(names.size()), option, " ",
               text, " is not a variant: give an index in [0, ", names.size(), ") or one of ",
               listed, " (Note [Attention variants])");
  return static_cast<int>(index);
}

// Which entry of one variant table the kernels take: the index a select_* call stored, else (-1)
// the one the performance setting `Tuning::*setting` names, else 0.
using TuningText = std::string Tuning::*;

class VariantChoice {
 public:
  constexpr VariantChoice(const char* option, TuningText setting,
                          std::vector<const char*> (*names)())
      : option_(option), setting_(setting), names_(names) {}

  int index() {
    const int chosen = chosen_.load(std::memory_order_relaxed);
    if (chosen >= 0) return chosen;
    // Parsed again only after set_tuning (ops run on one host thread at a time per process).
    const uint64_t generation = tuning_generation() + 1;
    if (parsed_at_.load(std::memory_order_acquire) != generation) {
      from_setting_ = named_variant(option_, tuning().*setting_, names_());
      parsed_at_.store(generation, std::memory_order_release);
    }
    return from_setting_;
  }
  // Throws tandem::Error naming `op` for an index outside [-1, table size).
  void check(const char* op, int variant) const {
    const int count = static_cast<int>(names_().size());
    TANDEM_CHECK(variant >= -1 && variant < count, op, ": ", variant, " outside [-1, ", count,
                 ") (", option_, "'s table)");
  }
  void select(const char* op, int variant) {
    check(op, variant);
    chosen_.store(variant, std::memory_order_relaxed);
  }

 private:
  const char* option_;
  TuningText setting_;
  std::vector<const char*> (*names_)();
  std::atomic<int> chosen_{-1};
  std::atomic<uint64_t> parsed_at_{0};  // tuning_generation() + 1 of from_setting_; 0: never
  int from_setting_ = 0;
};

constinit VariantChoice forward_choice("--attention-forward-variant", &Tuning::attention_forward,
                                       forward_variant_names);
constinit VariantChoice backward_choice("--attention-backward-variant", &Tuning::attention_backward,
                                        backward_variant_names);
constinit VariantChoice forward128_choice("--attention-forward128-variant",
                                          &Tuning::attention_forward128, forward128_variant_names);
constinit VariantChoice backward128_choice("--attention-backward128-variant",
                                           &Tuning::attention_backward128,
                                           backward128_variant_names);

}  // namespace

std::vector<const char*> attention_forward128_variant_names() { return forward128_variant_names(); }
void select_attention_forward128_variant(int variant) {
  forward128_choice.select("select_attention_forward128_variant", variant);
}

std::vector<const char*> attention_backward128_variant_names() {
  return backward128_variant_names();
}
void select_attention_backward128_variant(int variant) {
  backward128_choice.select("select_attention_backward128_variant", variant);
}

std::vector<const char*> attention_forward_variant_names() { return forward_variant_names(); }
std::vector<const char*> attention_backward_variant_names() { return backward_variant_names(); }
void select_attention_variants(int forward, int backward) {
  const char* op = "select_attention_variants";
  forward_choice.check(op, forward);  // both checked before either is stored
  backward_choice.check(op, backward);
  forward_choice.select(op, forward);
  backward_choice.select(op, backward);
}

void check_attention_variants(const Tuning& t) {
  named_variant("--attention-forward-variant", t.attention_forward, forward_variant_names());
  named_variant("--attention-backward-variant", t.attention_backward, backward_variant_names());
  named_variant("--attention-forward128-variant", t.attention_forward128,
                forward128_variant_names());
  named_variant("--attention-backward128-variant", t.attention_backward128,
                backward128_variant_names());
}

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionShape& s) {
  const char* op = "attention_forward";
  const Geometry g = check_attention(op, q, k, v, lse, s);
  expect_cuda(op, "out", out, {DType::kBF16}, {s.batch * s.seq, s.heads * s.v_dim()});
  if (fast_path(g, {&out, &q, &k, &v})) {
    // D 64: 128 query rows per block (two m16 tiles per warp share each K/V fragment) and
    // 64-key tiles, two blocks per multiprocessor (246 registers; faster than 32-key tiles and
    // 64-row blocks, bench/attention_timing.cc); D 128 (and q/k 192 with v 128): 64 rows and
    // 64-key tiles. (Note [Attention variants]: index 0 of each table.)
    if (g.head_dim == 64)
      kForwardVariants[forward_choice.index()].launch(out, lse, q, k, v, g);
    else if (g.head_dim == 128)
      kForward128Variants<128>[forward128_choice.index()].launch(out, lse, q, k, v, g);
    else
      kForward128Variants<192>[forward128_choice.index()].launch(out, lse, q, k, v, g);
    return;
  }
  generic_attention_forward(g, mptr(out), lse.data<float>(), cptr(q), cptr(k), cptr(v));
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionShape& s) {
  const char* op = "attention_backward";
  const Geometry g = check_attention(op, q, k, v, lse, s);
  expect_cuda(op, "out", out, {DType::kBF16}, {s.batch * s.seq, s.heads * s.v_dim()});
  expect_cuda(op, "dout", dout, {DType::kBF16}, out.shape());
  expect_cuda(op, "dq", dq, {DType::kBF16}, q.shape());
  expect_cuda(op, "dk", dk, {DType::kBF16}, k.shape());
  expect_cuda(op, "dv", dv, {DType::kBF16}, v.shape());
  // delta = rowsum(dout * out) per (batch, head, token): op workspace, freed (stream-ordered) on
  // return.
  const Tensor delta = Tensor::empty({s.batch, s.heads, s.seq}, DType::kF32, MemCategory::kOther,
                                     "attention_backward.delta", Device::kCUDA);
  if (fast_path(g, {&dq, &dk, &dv, &dout, &q, &k, &v, &out})) {
    // Note [Attention variants], Note [Deterministic attention backward].
    launch_tensor_core_backward(backward_choice.index(), backward128_choice.index(), dq, dk, dv,
                                dout, q, k, v, out, lse, delta, g);
    return;
  }
  generic_attention_backward(g, mptr(dq), mptr(dk), mptr(dv), delta.data<float>(), cptr(dout),
                             cptr(q), cptr(k), cptr(v), cptr(out), lse.data<float>());
}

}  // namespace tandem::ops::cuda
