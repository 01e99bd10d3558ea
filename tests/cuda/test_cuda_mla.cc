// Multi-head latent attention's q, k, v op on the GPU (ops::mla_qkv_forward / backward) against
// the CPU's: the heads' copies and RoPE rotations, rotate_half or interleaved pairs, with YaRN's
// frequencies and attention factor, out of place and in place.
#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
#include "core/error.h"
#include "gpu_test.h"
#include "ops/ops.h"

namespace tandem::testing_gpu {
namespace {

constexpr DType kBF16 = DType::kBF16;

struct MlaCase {
  int64_t batch, seq, heads, dn, dr, dv;
  bool interleaved, yarn;
};

RopeSpec mla_rope(const MlaCase& c) {
  RopeSpec r(10000.0);
  r.interleaved = c.interleaved;
  if (c.yarn) {  // DeepSeek-V3's: factor 40 from 4096 positions, mscale 1 on both
    r.scaling = RopeScaling::kYarn;
    r.factor = 40;
    r.original_max_position = 64;  // so that these short sequences reach every band
    r.mscale = 1.0;
    r.mscale_all_dim = 0.8;  // an attention factor other than 1
  }
  return r;
}

Tensor gpu_empty(const Shape& shape) {
  return Tensor::empty(shape, kBF16, MemCategory::kOther, "gpu", Device::kCUDA);
}
Tensor host_empty(const Shape& shape) {
  return Tensor::empty(shape, DType::kF32, MemCategory::kOther, "host", Device::kCPU);
}

// V3's widths (128 + 64, v 128) with rotate_half and interleaved pairs, with and without YaRN;
// more heads than a block has warps (shape (d)'s 16; 11 of odd widths); small odd ones; one row.
constexpr MlaCase kCases[] = {
    {2, 37, 4, 128, 64, 128, true, true},   {1, 70, 3, 128, 64, 128, false, false},
    {1, 33, 16, 128, 64, 128, true, false}, {1, 5, 11, 6, 4, 10, false, true},
    {2, 9, 5, 6, 4, 10, true, false},       {1, 1, 2, 16, 8, 8, false, true}};

std::string name(const MlaCase& c, const char* what, bool in_place) {
  return std::string(what) + " heads " + std::to_string(c.heads) + " dn " + std::to_string(c.dn) +
         " dr " + std::to_string(c.dr) + " dv " + std::to_string(c.dv) +
         (c.interleaved ? " interleaved" : "") + (c.yarn ? " yarn" : "") +
         (in_place ? " in place" : "");
}

TEST(CudaMla, ForwardMatchesCpu) {
  for (const MlaCase& c : kCases) {
    for (const bool in_place : {false, true}) {
      const int64_t n = c.batch * c.seq, qw = c.heads * (c.dn + c.dr);
      const Tensor q_in0 = rounded(random_host({n, qw}, 61, 2.0), kBF16);
      const Tensor kv0 = rounded(random_host({n, c.heads * (c.dn + c.dv)}, 62), kBF16);
      const Tensor kr0 = rounded(random_host({n, c.dr}, 63), kBF16);
      const Tensor q_in = to_gpu(q_in0, kBF16);
      const Tensor q = in_place ? q_in : gpu_empty({n, qw});
      const Tensor k = gpu_empty({n, qw}), v = gpu_empty({n, c.heads * c.dv});
      ops::mla_qkv_forward(q, k, v, q_in, to_gpu(kv0, kBF16), to_gpu(kr0, kBF16), c.seq, c.heads,
                           c.dn, c.dr, c.dv, mla_rope(c));
      const Tensor wq = host_empty({n, qw}), wk = host_empty({n, qw}),
                   wv = host_empty({n, c.heads * c.dv});
      ops::mla_qkv_forward(wq, wk, wv, q_in0, kv0, kr0, c.seq, c.heads, c.dn, c.dr, c.dv,
                           mla_rope(c));
      const std::string what = name(c, "mla_qkv_forward", in_place);
      expect_close(to_host_f32(q), wq, tolerance_for(kBF16), what + " q");
      expect_close(to_host_f32(k), wk, tolerance_for(kBF16), what + " k");
      expect_close(to_host_f32(v), wv, Tolerance{0, 0}, what + " v (a copy)");
    }
  }
}

TEST(CudaMla, BackwardMatchesCpu) {
  for (const MlaCase& c : kCases) {
    for (const bool in_place : {false, true}) {
      const int64_t n = c.batch * c.seq, qw = c.heads * (c.dn + c.dr);
      const Tensor dq0 = rounded(random_host({n, qw}, 71), kBF16);
      const Tensor dk0 = rounded(random_host({n, qw}, 72), kBF16);
      const Tensor dv0 = rounded(random_host({n, c.heads * c.dv}, 73), kBF16);
      const Tensor dq = to_gpu(dq0, kBF16);
      const Tensor d_q_in = in_place ? dq : gpu_empty({n, qw});
      const Tensor d_kv = gpu_empty({n, c.heads * (c.dn + c.dv)}), d_kr = gpu_empty({n, c.dr});
      ops::mla_qkv_backward(d_q_in, d_kv, d_kr, dq, to_gpu(dk0, kBF16), to_gpu(dv0, kBF16), c.seq,
                            c.heads, c.dn, c.dr, c.dv, mla_rope(c));
      const Tensor wq = host_empty({n, qw}), wkv = host_empty({n, c.heads * (c.dn + c.dv)}),
                   wkr = host_empty({n, c.dr});
      ops::mla_qkv_backward(wq, wkv, wkr, dq0, dk0, dv0, c.seq, c.heads, c.dn, c.dr, c.dv,
                            mla_rope(c));
      const std::string what = name(c, "mla_qkv_backward", in_place);
      expect_close(to_host_f32(d_q_in), wq, tolerance_for(kBF16), what + " d_q_in");
      expect_close(to_host_f32(d_kv), wkv, Tolerance{0, 0}, what + " d_kv (copies)");
      // The heads' sum: f32 on the GPU, f64 on the CPU, one bf16 rounding each.
      expect_close(to_host_f32(d_kr), wkr, tolerance_for(kBF16), what + " d_k_rope");
    }
  }
}

TEST(CudaMla, BadShapesThrow) {
  const int64_t n = 4, heads = 2, dn = 8, dr = 4, dv = 8;
  const Tensor q = gpu_empty({n, heads * (dn + dr)}), k = gpu_empty({n, heads * (dn + dr)});
  const Tensor v = gpu_empty({n, heads * dv}), kv = gpu_empty({n, heads * (dn + dv)});
  const Tensor kr = gpu_empty({n, dr});
  const RopeSpec rope(10000.0);
  ops::mla_qkv_forward(q, k, v, q, kv, kr, 2, heads, dn, dr, dv, rope);  // valid, for contrast
  EXPECT_THROW(ops::mla_qkv_forward(q, k, v, q, kv, kr, 2, heads, dn, 3, dv, rope), Error);
  EXPECT_THROW(ops::mla_qkv_forward(q, k, v, q, kv, kr, 2, heads, dn, dr, dv + 1, rope), Error);
  EXPECT_THROW(
      ops::mla_qkv_forward(q, k, v, q, kv, gpu_empty({n, dr + 2}), 2, heads, dn, dr, dv, rope),
      Error);
  EXPECT_THROW(ops::mla_qkv_forward(q, k, v, q, kv, kr, 0, heads, dn, dr, dv, rope), Error);
}

}  // namespace
}  // namespace tandem::testing_gpu
