// GPU flash attention (ops::attention_forward / backward on CUDA tensors) against the CPU
// reference: the f32 CPU ops on the same inputs rounded to bf16. Shapes cover the tensor-core path
// (D 64 and 128, 16-byte aligned tensors) and the generic path (D 8, 16, 32, 40, 256, and D 64
// through misaligned views), seq not a multiple of any tile, batch 2, GQA and MHA. Also: the
// default backward is bitwise reproducible (the one-pass variants' dq, summed by atomics, to
// rounding), and bad arguments throw tandem::Error. Every D 64 tile variant, and every D 128
// forward and deterministic backward tiling, is checked the same way.
//
// Tolerances, |gpu - ref| <= atol + rtol |ref| elementwise:
//   out (bf16): rtol 1.6e-2 for the output's own bf16 rounding (gpu_test.h); atol 2^-8 because the
//     kernel rounds P to bf16 before the P V product: sum_j dp_j v_j <= 2^-9 sum_j p_j |v_j| <=
//     2^-9 max|v| (|v| <= 1 here), doubled for the fp32 sums and exp2 in another order.
//   lse (f32): fp32 sums of exact bf16 products in another order and ex2.approx (2^-22 relative):
//     1e-4 relative and absolute.
//   dq, dk, dv (bf16): rtol 1.6e-2 as above; atol 1e-2 * max|ref| of the tensor (+1e-5) because P
//     (for dv) and dS (for dq, dk) are rounded to bf16 before their products, an error of at most
//     2^-9 sum |terms|, which these inputs keep under a few tenths of a percent of the largest
//     gradient (typical errors are 2^-9 / sqrt(terms) of that).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor.h"
#include "gpu_test.h"
#include "ops/cuda/attention.h"
#include "ops/ops.h"

namespace tandem::testing_gpu {
namespace {

using ops::AttentionShape;

struct Case {
  AttentionShape s;
  const char* path;  // which kernels the shape takes: "mma" or "generic"
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const AttentionShape& s = info.param.s;
  return "b" + std::to_string(s.batch) + "_t" + std::to_string(s.seq) + "_h" +
         std::to_string(s.heads) + "_kv" + std::to_string(s.kv_heads) + "_d" +
         std::to_string(s.head_dim) +
         (s.v_head_dim > 0 ? "_dv" + std::to_string(s.v_head_dim) : "") +
         (s.scale > 0 ? "_scaled" : "") + "_" + info.param.path;
}

// DeepSeek-V3's softmax scale of its own (YaRN's mscale^2 / sqrt(192)), for the cases that take
// one.
constexpr double kMlaScale = 0.0917;

constexpr Tolerance kOutTol{1.6e-2, 1.0 / 256};
constexpr Tolerance kLseTol{1e-4, 1e-4};

// The gradient tolerance: rtol of a bf16 output, atol relative to the largest reference value,
// plus 1e-5 for fp32 cancellation in dP - delta where the gradient vanishes (seq 1: dq = dk = 0).
Tolerance grad_tolerance(const Tensor& ref) {
  const float* p = ref.data<float>();
  double mx = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) mx = std::max(mx, std::fabs(double(p[i])));
  return {1.6e-2, 1e-2 * mx + 1e-5};
}

Tensor host_f32(const Shape& shape) {
  return Tensor::empty(shape, DType::kF32, MemCategory::kOther, "ref", Device::kCPU);
}
Tensor host_zeros(const Shape& shape) {
  return Tensor::zeros(shape, DType::kF32, MemCategory::kOther, "zeros", Device::kCPU);
}
Tensor gpu_empty(const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, MemCategory::kOther, "gpu", Device::kCUDA);
}

// Host f32 tensors holding bf16-representable values: q in [-3, 3) (a sharper softmax), k, v and
// dout in [-1, 1).
struct Inputs {
  Tensor q, k, v, dout;
};
Inputs make_inputs(const AttentionShape& s, uint64_t seed) {
  const int64_t n = s.batch * s.seq;
  const Shape qs{n, s.heads * s.head_dim}, ks{n, s.kv_heads * s.head_dim},
      vs{n, s.kv_heads * s.v_dim()}, os{n, s.heads * s.v_dim()};
  return {rounded(random_host(qs, seed, 3.0), DType::kBF16),
          rounded(random_host(ks, seed + 1), DType::kBF16),
          rounded(random_host(vs, seed + 2), DType::kBF16),
          rounded(random_host(os, seed + 3), DType::kBF16)};
}

// The CPU reference forward: out [N, heads*Dv], lse [batch, heads, seq], both f32.
struct Forward {
  Tensor out, lse;
};
Forward cpu_forward(const Inputs& in, const AttentionShape& s) {
  Forward f{host_f32(in.dout.shape()), host_f32({s.batch, s.heads, s.seq})};
  ops::attention_forward(f.out, f.lse, in.q, in.k, in.v, s);
  return f;
}

// `host` as bf16 on the GPU in a view one element into its buffer: 2-byte aligned only, which
// sends the call to the generic kernels whatever D is.
Tensor to_gpu_misaligned(const Tensor& host) {
  Tensor buffer = gpu_empty({host.numel() + 1}, DType::kBF16);
  Tensor view = buffer.narrow_rows(1, host.numel()).reshape(host.shape());
  view.copy_from(to_gpu(host, DType::kBF16));
  return view;
}

using ToGpu = Tensor (*)(const Tensor&);
Tensor to_gpu_bf16(const Tensor& host) { return to_gpu(host, DType::kBF16); }

void check_forward(const AttentionShape& s, ToGpu place, uint64_t seed) {
  const Inputs in = make_inputs(s, seed);
  const Forward ref = cpu_forward(in, s);
  const Tensor out = place(host_zeros(in.dout.shape()));  // placed like the inputs; overwritten
  const Tensor lse = gpu_empty({s.batch, s.heads, s.seq}, DType::kF32);
  ops::attention_forward(out, lse, place(in.q), place(in.k), place(in.v), s);
  expect_close(to_host_f32(out), ref.out, kOutTol, "out");
  expect_close(to_host_f32(lse), ref.lse, kLseTol, "lse");
}

// dq, dk, dv on the GPU (as host f32) from the same saved tensors the CPU reference gets: the
// reference out rounded to bf16 and the reference lse.
struct Grads {
  Tensor dq, dk, dv;
};
Grads gpu_backward(const Inputs& in, const Tensor& out_bf16, const Tensor& lse,
                   const AttentionShape& s, ToGpu place) {
  const Tensor dq = place(host_zeros(in.q.shape())), dk = place(host_zeros(in.k.shape())),
               dv = place(host_zeros(in.v.shape()));
  ops::attention_backward(dq, dk, dv, place(in.dout), place(in.q), place(in.k), place(in.v),
                          place(out_bf16), lse.to(Device::kCUDA), s);
  return {to_host_f32(dq), to_host_f32(dk), to_host_f32(dv)};
}

void check_backward(const AttentionShape& s, ToGpu place, uint64_t seed) {
  const Inputs in = make_inputs(s, seed);
  const Forward fwd = cpu_forward(in, s);
  const Tensor out_bf16 = rounded(fwd.out, DType::kBF16);
  Grads ref{host_f32(in.q.shape()), host_f32(in.k.shape()), host_f32(in.v.shape())};
  ops::attention_backward(ref.dq, ref.dk, ref.dv, in.dout, in.q, in.k, in.v, out_bf16, fwd.lse, s);
  const Grads got = gpu_backward(in, out_bf16, fwd.lse, s, place);
  expect_close(got.dq, ref.dq, grad_tolerance(ref.dq), "dq");
  expect_close(got.dk, ref.dk, grad_tolerance(ref.dk), "dk");
  expect_close(got.dv, ref.dv, grad_tolerance(ref.dv), "dv");
}

class CudaAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttention, ForwardMatchesCpuReference) { check_forward(GetParam().s, to_gpu_bf16, 11); }

TEST_P(CudaAttention, BackwardMatchesCpuReference) {
  check_backward(GetParam().s, to_gpu_bf16, 21);
}

// {batch, seq, heads, kv_heads, head_dim[, v_head_dim[, scale]]}. Default tiles (D 64 / D 128):
// forward 128 / 64 query rows by 64 keys; backward 64 keys by 64 / 32 query rows (the other D 64
// tiles: Variants below). seq 77, 130 and 300 end mid-tile; seq 1 is a single key. q/k 192 with v
// 128 is DeepSeek-V3's multi-head latent attention (with its own softmax scale, as YaRN gives).
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Values(Case{{2, 77, 4, 2, 64}, "mma"}, Case{{2, 130, 4, 4, 64}, "mma"},
                      Case{{1, 300, 4, 2, 64}, "mma"}, Case{{1, 1, 2, 1, 64}, "mma"},
                      Case{{2, 130, 4, 2, 128}, "mma"}, Case{{2, 77, 4, 4, 128}, "mma"},
                      Case{{2, 77, 4, 2, 8}, "generic"}, Case{{2, 130, 4, 4, 16}, "generic"},
                      Case{{2, 128, 4, 2, 32}, "generic"}, Case{{1, 50, 4, 1, 40}, "generic"},
                      Case{{1, 20, 2, 1, 256}, "generic"}, Case{{2, 130, 4, 4, 192, 128}, "mma"},
                      Case{{1, 300, 4, 1, 192, 128, kMlaScale}, "mma"},
                      Case{{1, 1, 2, 2, 192, 128}, "mma"},
                      Case{{2, 77, 4, 2, 24, 16, kMlaScale}, "generic"},
                      Case{{1, 50, 2, 1, 40, 72}, "generic"}),
    case_name);

TEST(CudaAttentionPaths, MisalignedViewsTakeTheGenericPathAndAgree) {
  const AttentionShape s{2, 77, 4, 2, 64};
  check_forward(s, to_gpu_misaligned, 31);
  check_backward(s, to_gpu_misaligned, 41);
  const AttentionShape mla{2, 77, 4, 2, 192, 128, kMlaScale};
  check_forward(mla, to_gpu_misaligned, 32);
  check_backward(mla, to_gpu_misaligned, 42);
}

// The GPU backward of one shape's inputs (seed) twice.
std::pair<Grads, Grads> backward_twice(const AttentionShape& s, uint64_t seed) {
  const Inputs in = make_inputs(s, seed);
  const Forward fwd = cpu_forward(in, s);
  const Tensor out_bf16 = rounded(fwd.out, DType::kBF16);
  Grads a = gpu_backward(in, out_bf16, fwd.lse, s, to_gpu_bf16);
  Grads b = gpu_backward(in, out_bf16, fwd.lse, s, to_gpu_bf16);
  return {std::move(a), std::move(b)};
}

// Each pair of gradients byte for byte the same.
using GradPair = std::tuple<const Tensor*, const Tensor*, const char*>;
void expect_same_bits(std::initializer_list<GradPair> pairs, int64_t head_dim) {
  for (const auto& [x, y, name] : pairs) {
    EXPECT_EQ(std::memcmp(x->data<float>(), y->data<float>(), size_t(x->nbytes())), 0)
        << name << " D " << head_dim;
  }
}

// Note [Deterministic attention backward]: the default backward gives the same bits on every
// run, dq included, on a shape with many key tiles per query row (seq 1000: 16 tiles of 64) and
// a group of 4.
TEST(CudaAttentionPaths, BackwardIsBitwiseReproducible) {
  for (const int64_t d : {64, 128, 192}) {
    const auto [a, b] = backward_twice({2, 1000, 8, 2, d, d == 192 ? 128 : 0}, 51);
    expect_same_bits({{&a.dq, &b.dq, "dq"}, {&a.dk, &b.dk, "dk"}, {&a.dv, &b.dv, "dv"}}, d);
  }
}

// Every D 64 tile variant (Note [Attention variants] in attention_mma.cuh) against the CPU
// reference: seq ending mid-tile of every tile size (77, 130, 300), one key (1), tiles of 128
// rows and keys with a tail and a group of 4 (520), MHA and GQA.
class VariantGuard {  // selects a variant pair for one scope, then restores the default choice
 public:
  VariantGuard(int forward, int backward) {
    ops::cuda::select_attention_variants(forward, backward);
  }
  ~VariantGuard() { ops::cuda::select_attention_variants(-1, -1); }
  VariantGuard(const VariantGuard&) = delete;
  VariantGuard& operator=(const VariantGuard&) = delete;
};

const AttentionShape kVariantShapes[] = {{2, 77, 4, 2, 64},
                                         {2, 130, 4, 4, 64},
                                         {1, 300, 4, 2, 64},
                                         {1, 1, 2, 1, 64},
                                         {1, 520, 4, 1, 64}};

TEST(CudaAttentionVariants, EveryForwardVariantMatchesCpuReference) {
  const std::vector<const char*> names = ops::cuda::attention_forward_variant_names();
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    const VariantGuard guard(i, -1);
    for (const AttentionShape& s : kVariantShapes) {
      SCOPED_TRACE(std::string(names[size_t(i)]) + " seq " + std::to_string(s.seq));
      check_forward(s, to_gpu_bf16, 61);
    }
  }
}

TEST(CudaAttentionVariants, EveryBackwardVariantMatchesCpuReference) {
  const std::vector<const char*> names = ops::cuda::attention_backward_variant_names();
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    const VariantGuard guard(-1, i);
    for (const AttentionShape& s : kVariantShapes) {
      SCOPED_TRACE(std::string(names[size_t(i)]) + " seq " + std::to_string(s.seq));
      check_backward(s, to_gpu_bf16, 71);
    }
  }
}

// check(shape) under every entry of one D 128 table (`select` picks one by index), then back to
// the default; the index past the table throws.
template <typename Check>
void for_each_d128_variant(const std::vector<const char*>& names, void (*select)(int),
                           std::initializer_list<AttentionShape> shapes, Check check) {
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    select(i);
    for (const AttentionShape& s : shapes) {
      SCOPED_TRACE(std::string(names[size_t(i)]) + " D " + std::to_string(s.head_dim) + " seq " +
                   std::to_string(s.seq));
      check(s);
    }
  }
  select(-1);
  EXPECT_THROW(select(static_cast<int>(names.size())), Error);
}

// Every tiling of D 128's forward against the CPU reference: seq ending mid-tile of every tile
// size (77, 130, 300), one key (1), GQA with a group of 4 and MHA, and q/k 192 with v 128 (the same
// table) with the model's own scale.
TEST(CudaAttentionVariants, EveryD128ForwardTilingMatchesCpuReference) {
  for_each_d128_variant(ops::cuda::attention_forward128_variant_names(),
                        ops::cuda::select_attention_forward128_variant,
                        {AttentionShape{2, 77, 8, 2, 128}, AttentionShape{1, 300, 4, 4, 128},
                         AttentionShape{1, 1, 2, 1, 128}, AttentionShape{2, 130, 4, 1, 192, 128},
                         AttentionShape{1, 300, 4, 2, 192, 128, kMlaScale}},
                        [](const AttentionShape& s) { check_forward(s, to_gpu_bf16, 63); });
}

// Every tiling of D 128's deterministic backward against the CPU reference, with a key split
// (the group of 4 over few blocks) and without one (MHA).
TEST(CudaAttentionVariants, EveryD128BackwardTilingMatchesCpuReference) {
  for_each_d128_variant(ops::cuda::attention_backward128_variant_names(),
                        ops::cuda::select_attention_backward128_variant,
                        {AttentionShape{2, 77, 8, 2, 128}, AttentionShape{1, 300, 4, 4, 128}},
                        [](const AttentionShape& s) { check_backward(s, to_gpu_bf16, 73); });
}

// The one-pass backward (variant 1, and D 128 whenever an atomic variant is picked): dk and dv
// are bitwise reproducible (each key's block sums its queries in order); dq is summed by fp32
// atomics in arrival order, so two runs agree only to rounding (the gradient tolerance). D 128's
// one-pass form against the CPU reference too (D 64's: the test above).
TEST(CudaAttentionVariants, OnePassBackwardSumsDqByAtomics) {
  const std::vector<const char*> names = ops::cuda::attention_backward_variant_names();
  ASSERT_EQ(std::string(names.at(0)), "deterministic");
  const VariantGuard guard(-1, 1);
  for (const int64_t d : {64, 128}) {
    const auto [a, b] = backward_twice({2, 130, 4, 2, d}, 81);
    expect_same_bits({{&a.dk, &b.dk, "dk"}, {&a.dv, &b.dv, "dv"}}, d);
    expect_close(b.dq, a.dq, grad_tolerance(a.dq), "dq");
  }
  for (const AttentionShape& s :
       {AttentionShape{2, 130, 4, 2, 128}, AttentionShape{2, 77, 4, 4, 128}}) {
    SCOPED_TRACE("D 128 seq " + std::to_string(s.seq));
    check_backward(s, to_gpu_bf16, 91);
  }
}

TEST(CudaAttentionVariants, OutOfRangeIndexThrows) {
  const int n = static_cast<int>(ops::cuda::attention_forward_variant_names().size());
  EXPECT_THROW(ops::cuda::select_attention_variants(n, -1), Error);
  EXPECT_THROW(ops::cuda::select_attention_variants(-2, -1), Error);
  EXPECT_THROW(ops::cuda::select_attention_variants(-1, 1000), Error);
}

TEST(CudaAttentionArguments, BadArgumentsThrow) {
  const AttentionShape s{1, 8, 4, 2, 16};
  const Tensor q = gpu_empty({8, 64}, DType::kBF16), kv = gpu_empty({8, 32}, DType::kBF16);
  const Tensor out = gpu_empty({8, 64}, DType::kBF16);
  const Tensor lse = gpu_empty({1, 4, 8}, DType::kF32);
  ops::attention_forward(out, lse, q, kv, kv, s);  // the valid call, for contrast
  // q in f32.
  EXPECT_THROW(ops::attention_forward(out, lse, gpu_empty({8, 64}, DType::kF32), kv, kv, s), Error);
  // heads not a multiple of kv_heads (4 and 3), and a shape that disagrees with the tensors.
  EXPECT_THROW(ops::attention_forward(out, lse, q, kv, kv, {1, 8, 4, 3, 16}), Error);
  EXPECT_THROW(ops::attention_forward(out, lse, q, kv, kv, {1, 8, 2, 2, 32}), Error);
  // lse of the wrong shape or dtype; head_dim beyond 256; a CPU tensor among GPU ones.
  EXPECT_THROW(ops::attention_forward(out, gpu_empty({4, 8}, DType::kF32), q, kv, kv, s), Error);
  EXPECT_THROW(ops::attention_forward(out, gpu_empty({1, 4, 8}, DType::kBF16), q, kv, kv, s),
               Error);
  EXPECT_THROW(
      ops::attention_forward(gpu_empty({1, 512}, DType::kBF16), gpu_empty({1, 1, 1}, DType::kF32),
                             gpu_empty({1, 512}, DType::kBF16), gpu_empty({1, 512}, DType::kBF16),
                             gpu_empty({1, 512}, DType::kBF16), {1, 1, 1, 1, 512}),
      Error);
  EXPECT_THROW(ops::attention_forward(out, lse, q, host_f32({8, 32}), kv, s), Error);
  // Backward: dk of the query shape.
  EXPECT_THROW(ops::attention_backward(q, q, kv, q, q, kv, kv, out, lse, s), Error);
}

}  // namespace
}  // namespace tandem::testing_gpu
