// Megatron-LM's document masking on the GPU (Note [Document masking] in data/document_masks.h)
// against the CPU reference ops on the same inputs rounded to bf16: attention within document
// bounds (AttentionShape::key_begin), forward and backward, on the tensor-core path (D 64, 128,
// q/k 192 with v 128, every D 64 tile variant) and the generic one (other head dims, misaligned
// views), GQA, MHA and MLA's head dims; RoPE and MLA's q, k, v at positions of their own
// (--document-positions); the cross-entropy over the rows of a loss mask (--eod-mask-loss). The
// masks come from data::document_masks on ids with end-of-document tokens: one at position 0,
// boundaries inside a 64-key tile and on a tile's edge, documents of a few tokens, and a sequence
// with none. Tolerances are test_cuda_attention.cc's and gpu_test.h's, for the same reasons.
// Also: bounds that exclude nothing (all zeros) give the plain call's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/document_masks.h"
#include "gpu_test.h"
#include "ops/cuda/attention.h"
#include "ops/ops.h"

namespace tandem::testing_gpu {
namespace {

using ops::AttentionShape;

constexpr DType kBF16 = DType::kBF16;
constexpr int32_t kEod = 7;
constexpr Tolerance kOutTol{1.6e-2, 1.0 / 256};
constexpr Tolerance kLseTol{1e-4, 1e-4};
constexpr Tolerance kExact{0, 0};

Tensor host_f32(const Shape& shape) {
  return Tensor::empty(shape, DType::kF32, MemCategory::kOther, "ref", Device::kCPU);
}
Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32, MemCategory::kOther,
                           "i32", Device::kCPU);
  std::memcpy(t.data<int32_t>(), v.data(), v.size() * sizeof(int32_t));
  return t;
}
Tensor gpu_empty(const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, MemCategory::kOther, "gpu", Device::kCUDA);
}

// Document masks of `batch` samples of `seq` ids: sample 0 has end-of-document tokens at 0 (a
// document of one token, then the next opens at 1), at 37 (a boundary inside the first 64-key
// tile) and at 63 (the next document opens on a tile's edge), then every 90 tokens; sample 1
// short documents (an eod every 11 tokens); sample 2 none.
data::DocumentMasks masks_of(int64_t batch, int64_t seq) {
  std::vector<int32_t> ids(static_cast<size_t>(batch * seq), 1);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < seq; ++i) {
      const bool eod = b == 0   ? i == 0 || i == 37 || i == 63 || (i > 63 && (i - 63) % 90 == 0)
                       : b == 1 ? i % 11 == 10
                                : false;
      if (eod) ids[static_cast<size_t>(b * seq + i)] = kEod;
    }
  }
  return data::document_masks(ids.data(), batch, seq,
                              {.eod = kEod,
                               .document_positions = true,
                               .reset_attention_mask = true,
                               .eod_mask_loss = true});
}

// ---- attention within documents ----

struct Inputs {
  Tensor q, k, v, dout;
};
Inputs make_inputs(const AttentionShape& s, uint64_t seed) {
  const int64_t n = s.batch * s.seq;
  return {rounded(random_host({n, s.heads * s.head_dim}, seed, 3.0), kBF16),
          rounded(random_host({n, s.kv_heads * s.head_dim}, seed + 1), kBF16),
          rounded(random_host({n, s.kv_heads * s.v_dim()}, seed + 2), kBF16),
          rounded(random_host({n, s.heads * s.v_dim()}, seed + 3), kBF16)};
}

// `host` as bf16 on the GPU, 16-byte aligned (the tensor-core path where D allows) or one element
// into a buffer (the generic path whatever D is).
Tensor place(const Tensor& host, bool misaligned) {
  if (!misaligned) return to_gpu(host, kBF16);
  Tensor buffer = gpu_empty({host.numel() + 1}, kBF16);
  Tensor view = buffer.narrow_rows(1, host.numel()).reshape(host.shape());
  view.copy_from(to_gpu(host, kBF16));
  return view;
}

Tolerance grad_tolerance(const Tensor& ref) {
  double mx = 0;
  for (int64_t i = 0; i < ref.numel(); ++i)
    mx = std::max(mx, std::fabs(double(ref.data<float>()[i])));
  return {1.6e-2, 1e-2 * mx + 1e-5};
}

// The forward and backward of `s` within the documents of masks_of, GPU against CPU.
void check_documents(AttentionShape s, bool misaligned, uint64_t seed, const std::string& what) {
  SCOPED_TRACE(what + " seq " + std::to_string(s.seq) + " heads " + std::to_string(s.heads) + "/" +
               std::to_string(s.kv_heads) + " D " + std::to_string(s.head_dim) + "/" +
               std::to_string(s.v_dim()) + (misaligned ? " misaligned" : ""));
  const data::DocumentMasks dm = masks_of(s.batch, s.seq);
  AttentionShape cpu = s, gpu = s;
  cpu.key_begin = host_i32(dm.key_begin);
  gpu.key_begin = cpu.key_begin.to(Device::kCUDA);
  const Inputs in = make_inputs(s, seed);
  const Tensor out = host_f32(in.dout.shape()), lse = host_f32({s.batch, s.heads, s.seq});
  ops::attention_forward(out, lse, in.q, in.k, in.v, cpu);
  const Tensor gout = place(host(in.dout.shape()), misaligned);
  const Tensor glse = gpu_empty({s.batch, s.heads, s.seq}, DType::kF32);
  const Tensor gq = place(in.q, misaligned), gk = place(in.k, misaligned),
               gv = place(in.v, misaligned);
  ops::attention_forward(gout, glse, gq, gk, gv, gpu);
  expect_close(to_host_f32(gout), out, kOutTol, "out");
  expect_close(to_host_f32(glse), lse, kLseTol, "lse");

  // The backward of both from the same saved tensors: the reference out in bf16, its lse.
  const Tensor out_bf16 = rounded(out, kBF16);
  const Tensor dq = host_f32(in.q.shape()), dk = host_f32(in.k.shape()),
               dv = host_f32(in.v.shape());
  ops::attention_backward(dq, dk, dv, in.dout, in.q, in.k, in.v, out_bf16, lse, cpu);
  const Tensor gdq = place(host(in.q.shape()), misaligned),
               gdk = place(host(in.k.shape()), misaligned),
               gdv = place(host(in.v.shape()), misaligned);
  ops::attention_backward(gdq, gdk, gdv, place(in.dout, misaligned), gq, gk, gv,
                          place(out_bf16, misaligned), lse.to(Device::kCUDA), gpu);
  expect_close(to_host_f32(gdq), dq, grad_tolerance(dq), "dq");
  expect_close(to_host_f32(gdk), dk, grad_tolerance(dk), "dk");
  expect_close(to_host_f32(gdv), dv, grad_tolerance(dv), "dv");
}

// {batch, seq, heads, kv_heads, head_dim[, v_head_dim[, scale]]}: three samples (masks_of),
// GQA and MHA, seq ending mid-tile, D 64 and 128 and MLA's 192/128 with a scale of its own on the
// tensor cores; D 40 and 24/16 on the generic kernels.
const AttentionShape kShapes[] = {{3, 300, 4, 2, 64},  {3, 130, 4, 4, 64},
                                  {3, 200, 4, 2, 128}, {3, 300, 4, 1, 192, 128, 0.0917},
                                  {3, 77, 4, 2, 40},   {3, 77, 4, 2, 24, 16, 0.0917}};

TEST(CudaDocumentMasks, AttentionWithinDocumentsMatchesCpu) {
  uint64_t seed = 100;
  for (const AttentionShape& s : kShapes) check_documents(s, false, seed += 10, "default");
  check_documents({3, 130, 4, 2, 64}, true, 200, "generic");
  check_documents({3, 130, 4, 2, 192, 128, 0.0917}, true, 210, "generic MLA");
}

// Every D 64 tile variant, forward and backward (the one-pass atomic backwards too), and every
// D 128 tiling, within documents.
TEST(CudaDocumentMasks, EveryAttentionVariantWithinDocumentsMatchesCpu) {
  const std::vector<const char*> fwd = ops::cuda::attention_forward_variant_names(),
                                 bwd = ops::cuda::attention_backward_variant_names();
  for (int i = 0; i < static_cast<int>(std::max(fwd.size(), bwd.size())); ++i) {
    const int f = i < static_cast<int>(fwd.size()) ? i : 0;
    const int b = i < static_cast<int>(bwd.size()) ? i : 0;
    ops::cuda::select_attention_variants(f, b);
    check_documents({3, 300, 4, 2, 64}, false, 300 + uint64_t(i),
                    std::string(fwd[size_t(f)]) + " + " + bwd[size_t(b)]);
  }
  ops::cuda::select_attention_variants(-1, -1);
  const auto f128 = ops::cuda::attention_forward128_variant_names();
  const auto b128 = ops::cuda::attention_backward128_variant_names();
  for (int i = 0; i < static_cast<int>(std::max(f128.size(), b128.size())); ++i) {
    const int f = i < static_cast<int>(f128.size()) ? i : 0;
    const int b = i < static_cast<int>(b128.size()) ? i : 0;
    ops::cuda::select_attention_forward128_variant(f);
    ops::cuda::select_attention_backward128_variant(b);
    check_documents({3, 200, 8, 2, 128}, false, 400 + uint64_t(i),
                    std::string(f128[size_t(f)]) + " + " + b128[size_t(b)]);
  }
  ops::cuda::select_attention_forward128_variant(-1);
  ops::cuda::select_attention_backward128_variant(-1);
}

// Bounds of all zeros exclude no key: the same bits as the plain causal call, both paths.
TEST(CudaDocumentMasks, ZeroBoundsGiveThePlainCallsBits) {
  for (const AttentionShape& plain :
       {AttentionShape{2, 300, 4, 2, 64}, AttentionShape{2, 77, 4, 2, 40}}) {
    AttentionShape bounded = plain;
    bounded.key_begin =
        host_i32(std::vector<int32_t>(size_t(plain.batch * plain.seq), 0)).to(Device::kCUDA);
    const Inputs in = make_inputs(plain, 500);
    const Tensor q = to_gpu(in.q, kBF16), k = to_gpu(in.k, kBF16), v = to_gpu(in.v, kBF16);
    const Tensor dout = to_gpu(in.dout, kBF16);
    Tensor got[2][5];  // out, lse, dq, dk, dv of the plain and the bounded call
    for (int i = 0; i < 2; ++i) {
      const AttentionShape& s = i == 0 ? plain : bounded;
      Tensor out = gpu_empty(in.dout.shape(), kBF16),
             lse = gpu_empty({s.batch, s.heads, s.seq}, DType::kF32);
      ops::attention_forward(out, lse, q, k, v, s);
      Tensor dq = gpu_empty(in.q.shape(), kBF16), dk = gpu_empty(in.k.shape(), kBF16),
             dv = gpu_empty(in.v.shape(), kBF16);
      ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
      got[i][0] = to_host_f32(out), got[i][1] = to_host_f32(lse), got[i][2] = to_host_f32(dq);
      got[i][3] = to_host_f32(dk), got[i][4] = to_host_f32(dv);
    }
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (int j = 0; j < 5; ++j) {
      expect_close(got[1][j], got[0][j], kExact,
                   std::string(names[j]) + " D " + std::to_string(plain.head_dim));
    }
  }
}

// ---- RoPE and MLA's q, k, v at positions ----

// rope_*_qk_at on the GPU against the CPU's, at masks_of's restarted positions; and positions
// n % seq give the plain op's bits.
TEST(CudaDocumentMasks, RopeAtPositionsMatchesCpu) {
  const int64_t batch = 3, seq = 300, heads = 4, kv_heads = 2;
  const data::DocumentMasks dm = masks_of(batch, seq);
  const Tensor pos = host_i32(dm.position), gpos = pos.to(Device::kCUDA);
  std::vector<int32_t> plain_pos(size_t(batch * seq));
  for (size_t r = 0; r < plain_pos.size(); ++r) plain_pos[r] = int32_t(int64_t(r) % seq);
  const Tensor gplain = host_i32(plain_pos).to(Device::kCUDA);
  for (const int64_t d : {64, 6}) {  // the vector and the scalar path
    for (const bool backward : {false, true}) {
      const std::string what =
          std::string(backward ? "rope_backward_qk_at" : "rope_forward_qk_at") + " D " +
          std::to_string(d);
      auto op = backward ? ops::rope_backward_qk_at : ops::rope_forward_qk_at;
      auto plain = backward ? ops::rope_backward_qk : ops::rope_forward_qk;
      const RopeSpec rope(10000.0);
      const Tensor q0 = rounded(random_host({batch * seq, heads * d}, 600, 2.0), kBF16);
      const Tensor k0 = rounded(random_host({batch * seq, kv_heads * d}, 601, 2.0), kBF16);
      Tensor q = to_gpu(q0, kBF16), k = to_gpu(k0, kBF16);
      op(q, k, seq, heads, kv_heads, d, rope, gpos);
      Tensor wq = q0.to(Device::kCPU), wk = k0.to(Device::kCPU);
      op(wq, wk, seq, heads, kv_heads, d, rope, pos);
      expect_close(to_host_f32(q), wq, tolerance_for(kBF16), what + " q");
      expect_close(to_host_f32(k), wk, tolerance_for(kBF16), what + " k");
      Tensor q1 = to_gpu(q0, kBF16), k1 = to_gpu(k0, kBF16), q2 = to_gpu(q0, kBF16),
             k2 = to_gpu(k0, kBF16);
      op(q1, k1, seq, heads, kv_heads, d, rope, gplain);
      plain(q2, k2, seq, heads, kv_heads, d, rope);
      expect_close(to_host_f32(q1), to_host_f32(q2), kExact, what + " q at n % seq");
      expect_close(to_host_f32(k1), to_host_f32(k2), kExact, what + " k at n % seq");
    }
  }
}

TEST(CudaDocumentMasks, MlaQkvAtPositionsMatchesCpu) {
  const int64_t batch = 3, seq = 130, heads = 3, dn = 16, dr = 8, dv = 16;
  const int64_t n = batch * seq, qw = heads * (dn + dr);
  const data::DocumentMasks dm = masks_of(batch, seq);
  const Tensor pos = host_i32(dm.position), gpos = pos.to(Device::kCUDA);
  for (const bool interleaved : {false, true}) {
    RopeSpec rope(10000.0);
    rope.interleaved = interleaved;
    const std::string what = interleaved ? " interleaved" : "";
    const Tensor q_in = rounded(random_host({n, qw}, 700, 2.0), kBF16);
    const Tensor kv = rounded(random_host({n, heads * (dn + dv)}, 701), kBF16);
    const Tensor kr = rounded(random_host({n, dr}, 702), kBF16);
    const Tensor q = gpu_empty({n, qw}, kBF16), k = gpu_empty({n, qw}, kBF16),
                 v = gpu_empty({n, heads * dv}, kBF16);
    ops::mla_qkv_forward_at(q, k, v, to_gpu(q_in, kBF16), to_gpu(kv, kBF16), to_gpu(kr, kBF16), seq,
                            heads, dn, dr, dv, rope, gpos);
    const Tensor wq = host_f32({n, qw}), wk = host_f32({n, qw}), wv = host_f32({n, heads * dv});
    ops::mla_qkv_forward_at(wq, wk, wv, q_in, kv, kr, seq, heads, dn, dr, dv, rope, pos);
    expect_close(to_host_f32(q), wq, tolerance_for(kBF16), "mla_qkv_forward_at q" + what);
    expect_close(to_host_f32(k), wk, tolerance_for(kBF16), "mla_qkv_forward_at k" + what);
    expect_close(to_host_f32(v), wv, kExact, "mla_qkv_forward_at v" + what);

    const Tensor d_q_in = gpu_empty({n, qw}, kBF16),
                 d_kv = gpu_empty({n, heads * (dn + dv)}, kBF16), d_kr = gpu_empty({n, dr}, kBF16);
    ops::mla_qkv_backward_at(d_q_in, d_kv, d_kr, to_gpu(q_in, kBF16), to_gpu(wk, kBF16),
                             to_gpu(wv, kBF16), seq, heads, dn, dr, dv, rope, gpos);
    const Tensor w_q_in = host_f32({n, qw}), w_kv = host_f32({n, heads * (dn + dv)}),
                 w_kr = host_f32({n, dr});
    ops::mla_qkv_backward_at(w_q_in, w_kv, w_kr, q_in, rounded(wk, kBF16), rounded(wv, kBF16), seq,
                             heads, dn, dr, dv, rope, pos);
    expect_close(to_host_f32(d_q_in), w_q_in, tolerance_for(kBF16), "mla backward d_q_in" + what);
    expect_close(to_host_f32(d_kv), w_kv, kExact, "mla backward d_kv" + what);
    expect_close(to_host_f32(d_kr), w_kr, tolerance_for(kBF16), "mla backward d_k_rope" + what);
  }
}

// ---- the loss mask ----

// cross_entropy_*_masked on the GPU against the CPU's, with masks_of's loss mask (a third of the
// rows of sample 1 dropped), f32 and bf16 logits, and in place.
TEST(CudaDocumentMasks, MaskedCrossEntropyMatchesCpu) {
  const int64_t batch = 3, seq = 40, n = batch * seq;
  const data::DocumentMasks dm = masks_of(batch, seq);
  Tensor mask = host_f32({n});
  std::memcpy(mask.data<float>(), dm.loss_mask.data(), size_t(n) * sizeof(float));
  const Tensor gmask = mask.to(Device::kCUDA);
  for (const int64_t v : {int64_t{53}, int64_t{4099}}) {
    const Tensor logits = random_host({n, v}, uint64_t(v), 4.0);
    Tensor targets = host({n}, DType::kI32);
    for (int64_t r = 0; r < n; ++r) targets.data<int32_t>()[r] = int32_t((r * 31) % v);
    const Tensor gt = targets.to(Device::kCUDA);
    for (const DType dt : {DType::kF32, kBF16}) {
      SCOPED_TRACE(::testing::Message() << "v " << v << " " << dtype_name(dt));
      const double got = ops::cross_entropy_forward_masked(to_gpu(logits, dt), gt, gmask);
      const double want = ops::cross_entropy_forward_masked(rounded(logits, dt), targets, mask);
      const Tolerance f32 = tolerance_for(DType::kF32);
      EXPECT_NEAR(got, want, f32.rtol * std::fabs(want) + f32.atol * double(n)) << "loss";
      const Tensor gl = to_gpu(logits, dt);  // dlogits over it, in place
      ops::cross_entropy_backward_masked(gl, gl, gt, 0.37, gmask);
      const Tensor d = host_f32({n, v});
      ops::cross_entropy_backward_masked(d, rounded(logits, dt), targets, 0.37, mask);
      expect_close(to_host_f32(gl), d, tolerance_for(dt), "dlogits");
    }
  }
}

}  // namespace
}  // namespace tandem::testing_gpu
