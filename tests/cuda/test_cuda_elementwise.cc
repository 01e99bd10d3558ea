// CUDA elementwise, reduction, embedding, norm, rope, SwiGLU and permutation ops against
// the CPU reference (ops::cpu through ops.h, f32, inputs rounded to the GPU's storage dtype),
// within gpu_test.h's tolerance per output dtype. Oracles: the CPU op for every float output;
// exact equality for integer outputs (counts, permutations), for pure copies
// (embedding rows, permuted rows) and for f32 <-> bf16 conversion bits; a second identical run
// for the ops that promise run-to-run reproducibility.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "gpu_test.h"
#include "ops/fp8.h"

namespace tandem::testing_gpu {
namespace {

using ops::Accumulate;
constexpr DType kF32 = DType::kF32;
constexpr DType kBF16 = DType::kBF16;
constexpr Accumulate kModes[] = {Accumulate::kOverwrite, Accumulate::kAdd};
constexpr Tolerance kExact{0, 0};

using testing_gpu::name;  // gpu_test.h's, for a DType, beside this one
std::string name(Accumulate acc) { return acc == Accumulate::kAdd ? "add" : "overwrite"; }

// The reference's copy of an input as the GPU stores it, in fresh host memory (ops write to it).
Tensor ref_copy(const Tensor& h, DType dt) { return rounded(h, dt).to(Device::kCPU); }

// `h` on the GPU as `dt`, in a view that starts one element past an aligned address: the
// kernels' scalar path (no 16-byte vectors).
Tensor misaligned_gpu(const Tensor& h, DType dt) {
  Tensor flat = host({h.numel() + 1});
  for (int64_t i = 0; i < h.numel(); ++i) flat.data<float>()[i + 1] = h.data<float>()[i];
  return to_gpu(flat, dt).narrow_rows(1, h.numel()).reshape(h.shape());
}

// ---- elementwise and reductions ----

TEST(CudaElementwise, AxpyEveryDtypeMixAndMode) {
  for (DType ty : {kF32, kBF16}) {
    for (DType tx : {kF32, kBF16}) {
      for (Accumulate acc : kModes) {
        for (int64_t n : {0, 7, 4096 + 5}) {
          for (bool misaligned : {false, true}) {
            const std::string what = "axpy y " + name(ty) + " x " + name(tx) + " " + name(acc) +
                                     " n " + std::to_string(n) + (misaligned ? " misaligned" : "");
            Tensor y0 = random_host({n}, 1), x0 = random_host({n}, 2);
            Tensor y = misaligned ? misaligned_gpu(y0, ty) : to_gpu(y0, ty);
            Tensor x = to_gpu(x0, tx);
            ops::axpy(y, x, 0.75, acc);
            Tensor want = ref_copy(y0, ty);
            ops::axpy(want, ref_copy(x0, tx), 0.75, acc);
            expect_close(to_host_f32(y), want, tolerance_for(ty), what);
          }
        }
      }
    }
  }
}

TEST(CudaElementwise, ScaleBothDtypes) {
  for (DType dt : {kF32, kBF16}) {
    for (int64_t n : {5, 4096 + 3}) {
      for (bool misaligned : {false, true}) {
        Tensor x0 = random_host({n}, 3);
        Tensor x = misaligned ? misaligned_gpu(x0, dt) : to_gpu(x0, dt);
        ops::scale(x, -1.5);
        Tensor want = ref_copy(x0, dt);
        ops::scale(want, -1.5);
        expect_close(to_host_f32(x), want, tolerance_for(dt), "scale " + name(dt));
      }
    }
  }
}

TEST(CudaElementwise, SumSquaresMatchesDoubleSum) {
  for (DType dt : {kF32, kBF16}) {
    for (int64_t n : {0, 1, 13, (1 << 20) + 3}) {
      Tensor x0 = random_host({n}, 4, 3.0);
      const double got = ops::sum_squares(to_gpu(x0, dt));
      const double want = ops::sum_squares(rounded(x0, dt));
      // Both sum exact double products in double; only the order differs.
      EXPECT_NEAR(got, want, 1e-12 * want) << name(dt) << " n " << n;
    }
    Tensor odd = random_host({1001}, 5);
    EXPECT_NEAR(ops::sum_squares(misaligned_gpu(odd, dt)), ops::sum_squares(rounded(odd, dt)),
                1e-12 * ops::sum_squares(rounded(odd, dt)));
  }
}

TEST(CudaElementwise, AllFiniteFindsNanAndInf) {
  for (DType dt : {kF32, kBF16}) {
    for (int64_t n : {1, 9, 10000}) {
      Tensor x0 = random_host({n}, 6);
      EXPECT_TRUE(ops::all_finite(to_gpu(x0, dt))) << name(dt) << " n " << n;
      for (float bad :
           {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            -std::numeric_limits<float>::infinity()}) {
        for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
          Tensor y0 = x0.to(Device::kCPU);
          y0.data<float>()[at] = bad;
          EXPECT_FALSE(ops::all_finite(to_gpu(y0, dt))) << name(dt) << " n " << n << " at " << at;
          EXPECT_FALSE(ops::all_finite(misaligned_gpu(y0, dt))) << name(dt) << " misaligned";
        }
      }
    }
    EXPECT_TRUE(ops::all_finite(to_gpu(host({0}), dt)));
  }
}

// f32 -> bf16 must give the host's bits exactly: ties to even, NaN, infinities, denormals.
TEST(CudaElementwise, ConvertMatchesHostBits) {
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f + 0x1p-8f,
                            1.0f + 3 * 0x1p-8f,
                            -(1.0f + 0x1p-8f),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1e-40f,
                            -3e-39f,
                            std::numeric_limits<float>::max(),
                            65504.0f,
                            0x1.fffffep-1f};
  const int64_t n = 1000 + int64_t(std::size(specials));
  Tensor src = random_host({n}, 7, 1000.0);
  for (size_t i = 0; i < std::size(specials); ++i) src.data<float>()[i * 37] = specials[i];
  for (bool misaligned : {false, true}) {
    Tensor gsrc = misaligned ? misaligned_gpu(src, kF32) : to_gpu(src, kF32);
    Tensor gdst = Tensor::empty({n}, kBF16, MemCategory::kOther, "dst", Device::kCUDA);
    ops::convert(gdst, gsrc);
    Tensor want = host({n}, kBF16);
    ops::convert(want, src);
    Tensor got = gdst.to(Device::kCPU);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got.data<BF16>()[i].bits, want.data<BF16>()[i].bits)
          << "element " << i << " = " << src.data<float>()[i];
    }
    // bf16 -> f32 is exact.
    Tensor back = Tensor::empty({n}, kF32, MemCategory::kOther, "back", Device::kCUDA);
    ops::convert(back, gdst);
    Tensor back_want = host({n});
    ops::convert(back_want, want);
    Tensor back_got = back.to(Device::kCPU);
    for (int64_t i = 0; i < n; ++i) {
      const float g = back_got.data<float>()[i], w = back_want.data<float>()[i];
      ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w))) << "element " << i;
    }
  }
}

TEST(CudaElementwise, ConvertSameDtypeCopiesAcrossShapes) {
  for (DType dt : {kF32, kBF16}) {
    Tensor src0 = random_host({6, 7}, 8);
    Tensor src = to_gpu(src0, dt);
    Tensor dst = Tensor::empty({42}, dt, MemCategory::kOther, "dst", Device::kCUDA);
    ops::convert(dst, src);
    expect_close(to_host_f32(dst), rounded(src0, dt).reshape({42}), kExact, "copy " + name(dt));
  }
  Tensor a = Tensor::empty({5}, kF32, MemCategory::kOther, "a", Device::kCUDA);
  Tensor b = Tensor::empty({6}, kBF16, MemCategory::kOther, "b", Device::kCUDA);
  EXPECT_THROW(ops::convert(a, b), Error);
}

// ---- embedding ----

TEST(CudaEmbedding, ForwardCopiesRowsExactly) {
  const int64_t v = 50, n = 37;
  for (DType dt : {kF32, kBF16}) {
    for (int64_t h : {256, 12, 7}) {
      Tensor table0 = random_host({v, h}, 9);
      Tensor ids = random_ids({n}, v, 10);
      Tensor out = Tensor::empty({n, h}, kBF16, MemCategory::kOther, "out", Device::kCUDA);
      ops::embedding_forward(out, ids.to(Device::kCUDA), to_gpu(table0, dt));
      Tensor want = host({n, h});
      ops::embedding_forward(want, ids, rounded(table0, dt));
      // One bf16 rounding of the table value, the same rounding on both sides.
      expect_close(to_host_f32(out), rounded(want, kBF16), kExact,
                   "embedding " + name(dt) + " h " + std::to_string(h));
    }
  }
}

TEST(CudaEmbedding, ForwardRejectsBadIdsNamingIdRowAndRange) {
  const int64_t v = 50, n = 12, h = 16;
  Tensor table = to_gpu(random_host({v, h}, 11), kBF16);
  Tensor out = Tensor::empty({n, h}, kBF16, MemCategory::kOther, "out", Device::kCUDA);
  for (int32_t bad : {50, -1, 1 << 30}) {
    Tensor ids = random_ids({n}, v, 12);
    ids.data<int32_t>()[5] = bad;
    ids.data<int32_t>()[9] = 77;  // a later bad row: the first one is reported
    try {
      ops::embedding_forward(out, ids.to(Device::kCUDA), table);
      ADD_FAILURE() << "id " << bad << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("id " + std::to_string(bad) + " at row 5"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[0, 50)"), std::string::npos) << msg;
    }
  }
  // Empty batches do nothing.
  ops::embedding_forward(Tensor::empty({0, h}, kBF16, MemCategory::kOther, "o", Device::kCUDA),
                         host({0}, DType::kI32).to(Device::kCUDA), table);
}

TEST(CudaEmbedding, BackwardSumsRepeatedIdsInTokenOrder) {
  for (int64_t h : {64, 13}) {
    const int64_t v = 5, n = 300;  // every id repeats many times
    Tensor dtable0 = random_host({v + 2, h}, 13);
    Tensor dout0 = random_host({n, h}, 14);
    Tensor ids = random_ids({n}, v, 15);  // rows v, v + 1 receive nothing
    Tensor dtable = dtable0.to(Device::kCUDA);
    ops::embedding_backward(dtable, to_gpu(dout0, kBF16), ids.to(Device::kCUDA));
    Tensor want = dtable0.to(Device::kCPU);
    ops::embedding_backward(want, rounded(dout0, kBF16), ids);
    const Tensor got = dtable.to(Device::kCPU);
    expect_close(got, want, tolerance_for(kF32), "embedding_backward h " + std::to_string(h));
    // A second run from the same start gives the same bits (no atomics).
    Tensor again = dtable0.to(Device::kCUDA);
    ops::embedding_backward(again, to_gpu(dout0, kBF16), ids.to(Device::kCUDA));
    expect_close(again.to(Device::kCPU), got, kExact, "embedding_backward rerun");
  }
}

// ---- rmsnorm ----

struct NormCase {
  int64_t n, h;
};
// Widths for each kernel variant: forward and backward warp-per-row with 1, 2, 3, 4 groups per
// lane (256/24/64, 384, 768, 1000/1024), forward block-per-8-rows with 8, 16 groups per lane
// (2048, 4096) and reloading (8192, 12288); backward block-per-row with 1, 2, 4 groups per
// thread (2048, 4096, 8192) and reloading (12288); widths that are not multiples of 8 (scalar
// kernels); one row; no rows; more rows than blocks (3000 x 64); more rows than the warp-per-row
// kernels' resident warps, so each warp strides over several rows and loads the next one ahead
// (20000 x 64, 12000 x 384, 9000 x 768, 9000 x 1024); more backward blocks than the dg kernel
// reads in one batch (2100 x 2048: over 512 partials).
constexpr NormCase kNormCases[] = {
    {37, 256},  {50, 384},   {5, 4096},   {3, 8192},    {2, 12288},   {7, 2048},
    {33, 1000}, {1, 24},     {9, 100},    {4, 7},       {0, 64},      {3000, 64},
    {40, 1024}, {9000, 768}, {20000, 64}, {12000, 384}, {9000, 1024}, {2100, 2048}};

TEST(CudaNorm, RmsnormForward) {
  for (const NormCase& c : kNormCases) {
    for (DType gdt : {kF32, kBF16}) {
      for (bool misaligned : {false, true}) {
        const std::string what = "rmsnorm_forward n " + std::to_string(c.n) + " h " +
                                 std::to_string(c.h) + " g " + name(gdt) +
                                 (misaligned ? " misaligned" : "");
        Tensor x0 = random_host({c.n, c.h}, 16, 2.0), g0 = random_host({c.h}, 17);
        Tensor x = misaligned ? misaligned_gpu(x0, kBF16) : to_gpu(x0, kBF16);
        Tensor y = Tensor::empty({c.n, c.h}, kBF16, MemCategory::kOther, "y", Device::kCUDA);
        Tensor rstd = Tensor::empty({c.n}, kF32, MemCategory::kOther, "rstd", Device::kCUDA);
        ops::rmsnorm_forward(y, rstd, x, to_gpu(g0, gdt), 1e-5);
        Tensor y_want = host({c.n, c.h}), rstd_want = host({c.n});
        ops::rmsnorm_forward(y_want, rstd_want, rounded(x0, kBF16), rounded(g0, gdt), 1e-5);
        expect_close(to_host_f32(y), y_want, tolerance_for(kBF16), what + " y");
        expect_close(to_host_f32(rstd), rstd_want, tolerance_for(kF32), what + " rstd");
      }
    }
  }
}

TEST(CudaNorm, RmsnormBackwardBothModes) {
  for (const NormCase& c : kNormCases) {
    for (DType gdt : {kF32, kBF16}) {
      for (Accumulate acc : kModes) {
        const std::string what = "rmsnorm_backward n " + std::to_string(c.n) + " h " +
                                 std::to_string(c.h) + " g " + name(gdt) + " " + name(acc);
        Tensor x0 = random_host({c.n, c.h}, 18, 2.0), g0 = random_host({c.h}, 19);
        Tensor dy0 = random_host({c.n, c.h}, 20), dx0 = random_host({c.n, c.h}, 21);
        Tensor dg0 = random_host({c.h}, 22);
        const Tensor xr = rounded(x0, kBF16), gr = rounded(g0, gdt);
        Tensor y_ref = host({c.n, c.h}), rstd = host({c.n});
        ops::rmsnorm_forward(y_ref, rstd, xr, gr, 1e-5);

        Tensor dx = to_gpu(dx0, kBF16), dg = dg0.to(Device::kCUDA);
        const Tensor dy = to_gpu(dy0, kBF16), x = to_gpu(x0, kBF16), g = to_gpu(g0, gdt);
        const Tensor rstd_gpu = rstd.to(Device::kCUDA);
        ops::rmsnorm_backward(dx, dg, dy, x, g, rstd_gpu, acc);
        Tensor dx_want = ref_copy(dx0, kBF16), dg_want = dg0.to(Device::kCPU);
        ops::rmsnorm_backward(dx_want, dg_want, rounded(dy0, kBF16), xr, gr, rstd, acc);
        expect_close(to_host_f32(dx), dx_want, tolerance_for(kBF16), what + " dx");
        const Tensor dg_got = dg.to(Device::kCPU);
        expect_close(dg_got, dg_want, tolerance_for(kF32), what + " dg");

        // Run to run, dg has the same bits (blocks reduced in a fixed order).
        Tensor dg_again = dg0.to(Device::kCUDA), dx_again = to_gpu(dx0, kBF16);
        ops::rmsnorm_backward(dx_again, dg_again, dy, x, g, rstd_gpu, acc);
        expect_close(dg_again.to(Device::kCPU), dg_got, kExact, what + " dg rerun");
      }
    }
  }
}

TEST(CudaNorm, RmsnormBackwardInPlaceAndMisaligned) {
  for (const NormCase& c : {NormCase{37, 256}, NormCase{9, 100}, NormCase{5, 4096}}) {
    Tensor x0 = random_host({c.n, c.h}, 23), g0 = random_host({c.h}, 24);
    Tensor dy0 = random_host({c.n, c.h}, 25), dg0 = random_host({c.h}, 26);
    const Tensor xr = rounded(x0, kBF16);
    Tensor y_ref = host({c.n, c.h}), rstd = host({c.n});
    ops::rmsnorm_forward(y_ref, rstd, xr, g0, 1e-5);
    Tensor dx_want = ref_copy(dy0, kBF16), dg_want = dg0.to(Device::kCPU);
    ops::rmsnorm_backward(dx_want, dg_want, dx_want, xr, g0, rstd, Accumulate::kOverwrite);
    // dx aliases dy.
    Tensor dxy = to_gpu(dy0, kBF16), dg = dg0.to(Device::kCUDA);
    ops::rmsnorm_backward(dxy, dg, dxy, to_gpu(x0, kBF16), to_gpu(g0, kF32), rstd.to(Device::kCUDA),
                          Accumulate::kOverwrite);
    expect_close(to_host_f32(dxy), dx_want, tolerance_for(kBF16), "in-place dx");
    expect_close(dg.to(Device::kCPU), dg_want, tolerance_for(kF32), "in-place dg");
    // Misaligned x: the scalar kernel.
    Tensor dx = Tensor::empty({c.n, c.h}, kBF16, MemCategory::kOther, "dx", Device::kCUDA);
    Tensor dg2 = dg0.to(Device::kCUDA);
    ops::rmsnorm_backward(dx, dg2, to_gpu(dy0, kBF16), misaligned_gpu(x0, kBF16), to_gpu(g0, kF32),
                          rstd.to(Device::kCUDA), Accumulate::kOverwrite);
    expect_close(to_host_f32(dx), dx_want, tolerance_for(kBF16), "misaligned dx");
    expect_close(dg2.to(Device::kCPU), dg_want, tolerance_for(kF32), "misaligned dg");
  }
}

// ---- rope ----

struct RopeCase {
  int64_t batch, seq, heads, head_dim;
  double theta;
};

// The case's frequencies; a theta of 500000 takes Llama 3's scaling too (original context 1024,
// so the long cases' positions reach every band).
template <class Case>
RopeSpec rope_spec(const Case& c) {
  RopeSpec r(c.theta);
  if (c.theta == 500000.0) {
    r.scaling = RopeScaling::kLlama3;
    r.original_max_position = 1024;
  }
  return r;
}
// Vector path (D/2 a multiple of 8), scalar path (D/2 = 3, 1), heads not a multiple of the
// 4 a thread serves, and long positions with a large theta and Llama 3 scaling.
constexpr RopeCase kRopeCases[] = {{2, 37, 3, 64, 10000.0},     {1, 5, 5, 6, 10000.0},
                                   {3, 16, 1, 16, 10000.0},     {2, 9, 7, 2, 10000.0},
                                   {1, 4096, 1, 128, 500000.0}, {0, 4, 2, 64, 10000.0}};

TEST(CudaRope, ForwardAndBackwardOutOfPlaceAndInPlace) {
  for (const RopeCase& c : kRopeCases) {
    const int64_t n = c.batch * c.seq, w = c.heads * c.head_dim;
    for (bool backward : {false, true}) {
      for (bool in_place : {false, true}) {
        const std::string what = std::string(backward ? "rope_backward" : "rope_forward") +
                                 " seq " + std::to_string(c.seq) + " heads " +
                                 std::to_string(c.heads) + " D " + std::to_string(c.head_dim) +
                                 (in_place ? " in place" : "");
        auto rope = backward ? ops::rope_backward : ops::rope_forward;
        Tensor x0 = random_host({n, w}, 27, 2.0);
        Tensor x = to_gpu(x0, kBF16);
        Tensor out =
            in_place ? x : Tensor::empty({n, w}, kBF16, MemCategory::kOther, "out", Device::kCUDA);
        rope(out, x, c.seq, c.heads, c.head_dim, rope_spec(c));
        Tensor want = host({n, w});
        rope(want, rounded(x0, kBF16), c.seq, c.heads, c.head_dim, rope_spec(c));
        expect_close(to_host_f32(out), want, tolerance_for(kBF16), what);
      }
    }
  }
}

TEST(CudaRope, MisalignedAndBadShapes) {
  const int64_t n = 8, heads = 2, d = 16;
  Tensor x0 = random_host({n, heads * d}, 28);
  Tensor x = misaligned_gpu(x0, kBF16);
  Tensor out = Tensor::empty({n, heads * d}, kBF16, MemCategory::kOther, "out", Device::kCUDA);
  ops::rope_forward(out, x, 4, heads, d, RopeSpec(10000.0));
  Tensor want = host({n, heads * d});
  ops::rope_forward(want, rounded(x0, kBF16), 4, heads, d, RopeSpec(10000.0));
  expect_close(to_host_f32(out), want, tolerance_for(kBF16), "rope misaligned");
  EXPECT_THROW(ops::rope_forward(out, x, 4, heads, 15, RopeSpec(10000.0)), Error);  // odd head_dim
  EXPECT_THROW(ops::rope_forward(out, x, 4, 3, d, RopeSpec(10000.0)), Error);      // width mismatch
  EXPECT_THROW(ops::rope_forward(out, x, 0, heads, d, RopeSpec(10000.0)), Error);  // seq 0
}

struct RopeQkCase {
  int64_t batch, seq, heads, kv_heads, head_dim;
  double theta;
};
// Vector path with grouped and equal kv heads (a block's rows cross sequence ends when seq is
// short), the scalar path (D/2 = 3), a block holding many sequences (one head each of D 16),
// long positions with a large theta, and no rows.
constexpr RopeQkCase kRopeQkCases[] = {
    {2, 37, 4, 2, 64, 10000.0}, {2, 300, 12, 12, 64, 10000.0},  {1, 5, 3, 1, 6, 10000.0},
    {40, 3, 1, 1, 16, 10000.0}, {1, 4096, 2, 1, 128, 500000.0}, {0, 4, 2, 2, 64, 10000.0}};

TEST(CudaRope, QkForwardAndBackwardMatchTheCpuAndTheSingleTensorOp) {
  for (const RopeQkCase& c : kRopeQkCases) {
    const int64_t n = c.batch * c.seq, wq = c.heads * c.head_dim, wk = c.kv_heads * c.head_dim;
    for (bool backward : {false, true}) {
      const std::string what = std::string(backward ? "rope_backward_qk" : "rope_forward_qk") +
                               " seq " + std::to_string(c.seq) + " heads " +
                               std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " D " +
                               std::to_string(c.head_dim);
      auto rope_qk = backward ? ops::rope_backward_qk : ops::rope_forward_qk;
      auto rope = backward ? ops::rope_backward : ops::rope_forward;
      const Tensor q0 = random_host({n, wq}, 29, 2.0), k0 = random_host({n, wk}, 30, 2.0);
      Tensor q = to_gpu(q0, kBF16), k = to_gpu(k0, kBF16);
      rope_qk(q, k, c.seq, c.heads, c.kv_heads, c.head_dim, rope_spec(c));
      Tensor q_want = ref_copy(q0, kBF16), k_want = ref_copy(k0, kBF16);
      rope_qk(q_want, k_want, c.seq, c.heads, c.kv_heads, c.head_dim, rope_spec(c));
      expect_close(to_host_f32(q), q_want, tolerance_for(kBF16), what + " q");
      expect_close(to_host_f32(k), k_want, tolerance_for(kBF16), what + " k");
      // One launch over both gives the bits of one launch per tensor (the same cos and sin).
      Tensor q1 = to_gpu(q0, kBF16), k1 = to_gpu(k0, kBF16);
      rope(q1, q1, c.seq, c.heads, c.head_dim, rope_spec(c));
      rope(k1, k1, c.seq, c.kv_heads, c.head_dim, rope_spec(c));
      expect_close(to_host_f32(q), to_host_f32(q1), kExact, what + " q against rope");
      expect_close(to_host_f32(k), to_host_f32(k1), kExact, what + " k against rope");
    }
  }
}

TEST(CudaRope, QkMisalignedAndBadShapes) {
  const int64_t n = 12, heads = 4, kv_heads = 2, d = 16;
  const Tensor q0 = random_host({n, heads * d}, 31), k0 = random_host({n, kv_heads * d}, 32);
  // A misaligned k takes both tensors down the scalar path.
  Tensor q = to_gpu(q0, kBF16), k = misaligned_gpu(k0, kBF16);
  ops::rope_forward_qk(q, k, 5, heads, kv_heads, d, RopeSpec(10000.0));
  Tensor q_want = ref_copy(q0, kBF16), k_want = ref_copy(k0, kBF16);
  ops::rope_forward_qk(q_want, k_want, 5, heads, kv_heads, d, RopeSpec(10000.0));
  expect_close(to_host_f32(q), q_want, tolerance_for(kBF16), "rope_forward_qk misaligned q");
  expect_close(to_host_f32(k), k_want, tolerance_for(kBF16), "rope_forward_qk misaligned k");
  Tensor k_short = to_gpu(random_host({n - 1, kv_heads * d}, 33), kBF16);
  EXPECT_THROW(ops::rope_forward_qk(q, k_short, 5, heads, kv_heads, d, RopeSpec(10000.0)),
               Error);  // rows
  EXPECT_THROW(ops::rope_forward_qk(q, k, 5, heads, heads, d, RopeSpec(10000.0)),
               Error);  // k's width
  EXPECT_THROW(ops::rope_backward_qk(q, k, 5, heads, kv_heads, 15, RopeSpec(10000.0)),
               Error);  // odd D
  EXPECT_THROW(ops::rope_backward_qk(q, k, 0, heads, kv_heads, d, RopeSpec(10000.0)),
               Error);  // seq 0
}

// ---- SwiGLU ----

// gate_up [M, 2F] rows (gate | up): F a multiple of 8 (the vector path) or not (scalar), an
// aligned or misaligned base, an empty batch.
TEST(CudaSwiglu, ForwardAndBackward) {
  for (const Shape& shape : {Shape{37, 129}, Shape{64, 256}, Shape{3, 5}, Shape{0, 8}}) {
    for (bool misaligned : {false, true}) {
      const std::string what = "swiglu " + shape_str(shape) + (misaligned ? " misaligned" : "");
      const Shape packed = {shape[0], 2 * shape[1]};
      Tensor gu0 = random_host(packed, 29, 6.0);
      Tensor d0 = random_host(shape, 31);
      Tensor gate_up = misaligned ? misaligned_gpu(gu0, kBF16) : to_gpu(gu0, kBF16);
      Tensor dout = to_gpu(d0, kBF16);
      const Tensor gur = rounded(gu0, kBF16), dr = rounded(d0, kBF16);
      Tensor out = Tensor::empty(shape, kBF16, MemCategory::kOther, "out", Device::kCUDA);
      ops::swiglu_forward(out, gate_up);
      Tensor out_want = host(shape);
      ops::swiglu_forward(out_want, gur);
      expect_close(to_host_f32(out), out_want, tolerance_for(kBF16), what + " forward");
      Tensor d_gate_up = Tensor::empty(packed, kBF16, MemCategory::kOther, "dgu", Device::kCUDA);
      ops::swiglu_backward(d_gate_up, dout, gate_up);
      Tensor dgu_want = host(packed);
      ops::swiglu_backward(dgu_want, dr, gur);
      expect_close(to_host_f32(d_gate_up), dgu_want, tolerance_for(kBF16), what + " d_gate_up");
    }
  }
  Tensor odd = Tensor::empty({4, 7}, kBF16, MemCategory::kOther, "odd", Device::kCUDA);
  Tensor out = Tensor::empty({4, 3}, kBF16, MemCategory::kOther, "out", Device::kCUDA);
  EXPECT_THROW(ops::swiglu_forward(out, odd), Error);
}

// ---- bias and sigmoid gate ----

// bias_forward adds b to every row; bias_backward sums dy's rows (many rows: several chunks,
// summed in a fixed order, so a second run gives the same bits).
TEST(CudaBias, ForwardAndBackward) {
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{37, 24}, {1000, 640}, {5, 3}, {0, 8}}) {
    const std::string what = "bias m " + std::to_string(m) + " n " + std::to_string(n);
    const Tensor y0 = random_host({m, n}, 40), b = random_host({n}, 41);
    for (DType bt : {kF32, kBF16}) {
      Tensor y = to_gpu(y0, kBF16);
      ops::bias_forward(y, to_gpu(b, bt));
      Tensor want = ref_copy(y0, kBF16);
      ops::bias_forward(want, ref_copy(b, bt));
      expect_close(to_host_f32(y), want, tolerance_for(kBF16), what + " forward " + name(bt));
    }
    const Tensor dy = random_host({m, n}, 42), db0 = random_host({n}, 43);
    Tensor db = db0.to(Device::kCUDA);
    ops::bias_backward(db, to_gpu(dy, kBF16));
    Tensor db_want = ref_copy(db0, kF32);
    ops::bias_backward(db_want, ref_copy(dy, kBF16));
    expect_close(db.to(Device::kCPU), db_want, tolerance_for(kF32), what + " backward");
    Tensor again = db0.to(Device::kCUDA);
    ops::bias_backward(again, to_gpu(dy, kBF16));
    expect_close(again.to(Device::kCPU), db.to(Device::kCPU), kExact, what + " rerun");
  }
}

TEST(CudaSigmoidGate, ForwardAndBackwardInPlaceToo) {
  for (const auto& [m, h] : {std::pair<int64_t, int64_t>{37, 24}, {300, 1024}, {3, 5}, {0, 8}}) {
    const std::string what = "sigmoid gate m " + std::to_string(m) + " h " + std::to_string(h);
    const Tensor z = random_host({m, h}, 44), logit = random_host({m}, 45, 3.0);
    Tensor y = Tensor::empty({m, h}, kBF16, MemCategory::kOther, "y", Device::kCUDA);
    Tensor gate = Tensor::empty({m}, kF32, MemCategory::kOther, "g", Device::kCUDA);
    ops::sigmoid_gate_forward(y, gate, to_gpu(z, kBF16), logit.to(Device::kCUDA));
    Tensor y_want = host({m, h}), gate_want = host({m});
    ops::sigmoid_gate_forward(y_want, gate_want, ref_copy(z, kBF16), logit);
    expect_close(to_host_f32(y), y_want, tolerance_for(kBF16), what + " y");
    expect_close(gate.to(Device::kCPU), gate_want, tolerance_for(kF32), what + " gate");
    const Tensor dy = random_host({m, h}, 46);
    for (bool in_place : {false, true}) {
      Tensor d_y = to_gpu(dy, kBF16);
      Tensor dz =
          in_place ? d_y : Tensor::empty({m, h}, kBF16, MemCategory::kOther, "dz", Device::kCUDA);
      Tensor dl = Tensor::empty({m}, kBF16, MemCategory::kOther, "dl", Device::kCUDA);
      ops::sigmoid_gate_backward(dz, dl, d_y, to_gpu(z, kBF16), gate);
      Tensor dz_want = host({m, h}), dl_want = host({m});
      ops::sigmoid_gate_backward(dz_want, dl_want, ref_copy(dy, kBF16), ref_copy(z, kBF16),
                                 gate.to(Device::kCPU));
      const std::string how = in_place ? " in place" : "";
      expect_close(to_host_f32(dz), dz_want, tolerance_for(kBF16), what + " dz" + how);
      expect_close(to_host_f32(dl), dl_want, tolerance_for(kBF16), what + " dlogit" + how);
    }
  }
}

// ---- token permutation ----

struct PermCase {
  int64_t n, k, e;
};
constexpr PermCase kPermCases[] = {{1000, 2, 8}, {37, 3, 37}, {513, 4, 256},
                                   {10, 1, 1},   {5, 2, 64},  {0, 2, 8}};

TEST(CudaMoe, PermutationIsTheCpuOrderExactly) {
  for (const PermCase& c : kPermCases) {
    const std::string what = "moe_permutation n " + std::to_string(c.n) + " k " +
                             std::to_string(c.k) + " E " + std::to_string(c.e);
    Tensor idx = random_ids({c.n, c.k}, c.e, 38);  // repeats within a token allowed
    Tensor perm = Tensor::empty({c.n * c.k}, DType::kI32, MemCategory::kOther, "p", Device::kCUDA);
    Tensor counts = Tensor::empty({c.e}, DType::kI32, MemCategory::kOther, "c", Device::kCUDA);
    ops::moe_permutation(perm, counts, idx.to(Device::kCUDA), Tensor(), c.e);
    Tensor perm_want = host({c.n * c.k}, DType::kI32), counts_want = host({c.e}, DType::kI32);
    ops::moe_permutation(perm_want, counts_want, idx, Tensor(), c.e);
    EXPECT_EQ(ints(perm), ints(perm_want)) << what;
    EXPECT_EQ(ints(counts), ints(counts_want)) << what;
  }
}

// Note [Expert placement]: sorted by a shuffled place of each expert, as the CPU sorts.
TEST(CudaMoe, PermutationByPlaceIsTheCpuOrderExactly) {
  for (const PermCase& c : kPermCases) {
    const std::string what =
        "moe_permutation by place n " + std::to_string(c.n) + " E " + std::to_string(c.e);
    Tensor idx = random_ids({c.n, c.k}, c.e, 39);
    std::vector<int32_t> places(static_cast<size_t>(c.e));
    std::iota(places.begin(), places.end(), 0);
    std::shuffle(places.begin(), places.end(), std::mt19937(static_cast<unsigned>(c.e)));
    Tensor slot = host({c.e}, DType::kI32);
    std::copy(places.begin(), places.end(), slot.data<int32_t>());
    Tensor perm = Tensor::empty({c.n * c.k}, DType::kI32, MemCategory::kOther, "p", Device::kCUDA);
    Tensor counts = Tensor::empty({c.e}, DType::kI32, MemCategory::kOther, "c", Device::kCUDA);
    ops::moe_permutation(perm, counts, idx.to(Device::kCUDA), Tensor(), c.e,
                         slot.to(Device::kCUDA));
    Tensor perm_want = host({c.n * c.k}, DType::kI32), counts_want = host({c.e}, DType::kI32);
    ops::moe_permutation(perm_want, counts_want, idx, Tensor(), c.e, slot);
    EXPECT_EQ(ints(perm), ints(perm_want)) << what;
    EXPECT_EQ(ints(counts), ints(counts_want)) << what;
  }
}

// The permutation of a random routing, on the host.
Tensor host_perm(const PermCase& c, uint64_t seed) {
  Tensor idx = random_ids({c.n, c.k}, c.e, seed);
  Tensor perm = host({c.n * c.k}, DType::kI32), counts = host({c.e}, DType::kI32);
  ops::moe_permutation(perm, counts, idx, Tensor(), c.e);
  return perm;
}

constexpr int64_t kWidths[] = {256, 13, 64};

TEST(CudaMoe, PermuteForwardAndBackward) {
  for (const PermCase& c : kPermCases) {
    for (int64_t h : kWidths) {
      const std::string what = "permute n " + std::to_string(c.n) + " k " + std::to_string(c.k) +
                               " h " + std::to_string(h);
      const Tensor perm = host_perm(c, 39), perm_gpu = perm.to(Device::kCUDA);
      Tensor x0 = random_host({c.n, h}, 40);
      Tensor out = Tensor::empty({c.n * c.k, h}, kBF16, MemCategory::kOther, "o", Device::kCUDA);
      ops::permute_forward(out, to_gpu(x0, kBF16), perm_gpu, c.k);
      Tensor out_want = host({c.n * c.k, h});
      ops::permute_forward(out_want, rounded(x0, kBF16), perm, c.k);
      expect_close(to_host_f32(out), out_want, kExact, what + " forward");
      for (Accumulate acc : kModes) {
        Tensor d0 = random_host({c.n * c.k, h}, 41), dx0 = random_host({c.n, h}, 42);
        Tensor dx = to_gpu(dx0, kBF16);
        ops::permute_backward(dx, to_gpu(d0, kBF16), perm_gpu, c.k, acc);
        Tensor dx_want = ref_copy(dx0, kBF16);
        ops::permute_backward(dx_want, rounded(d0, kBF16), perm, c.k, acc);
        expect_close(to_host_f32(dx), dx_want, tolerance_for(kBF16),
                     what + " backward " + name(acc));
      }
    }
  }
}

// `count` blocks of random sizes (some empty) tiling [0, rows) of the input, laid out in a
// shuffled order in the output.
std::vector<ops::RowBlock> shuffled_blocks(int64_t count, uint64_t seed, int64_t& rows) {
  std::vector<ops::RowBlock> blocks(static_cast<size_t>(count));
  rows = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = static_cast<int64_t>(splitmix64(seed * 7919 + uint64_t(i)) % 5);  // 0..4
    blocks[i] = {rows, 0, n};
    rows += n;
  }
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[splitmix64(seed + i) % i]);
  }
  int64_t at = 0;
  for (size_t i : order) {
    blocks[i].to = at;
    at += blocks[i].rows;
  }
  return blocks;
}

TEST(CudaMoe, CopyRowBlocksIsTheCpuCopy) {
  // 16-byte vectors (h 1024 bf16), bytes (h 3 bf16, 6-byte rows; a misaligned base), f32 rows;
  // 100 blocks take two launches.
  struct Case {
    int64_t h, blocks;
    DType dt;
    bool misaligned;
  };
  for (const Case c :
       {Case{1024, 8, kBF16, false}, Case{1024, 100, kBF16, false}, Case{3, 100, kBF16, false},
        Case{8, 20, kBF16, true}, Case{5, 30, kF32, false}}) {
    const std::string what = "h " + std::to_string(c.h) + " blocks " + std::to_string(c.blocks) +
                             " " + name(c.dt) + (c.misaligned ? " misaligned" : "");
    int64_t rows = 0;
    const std::vector<ops::RowBlock> blocks = shuffled_blocks(c.blocks, 50 + c.h, rows);
    const Tensor in0 = random_host({rows, c.h}, 51), out0 = random_host({rows + 2, c.h}, 52);
    const Tensor in = c.misaligned ? misaligned_gpu(in0, c.dt) : to_gpu(in0, c.dt);
    const Tensor out = c.misaligned ? misaligned_gpu(out0, c.dt) : to_gpu(out0, c.dt);
    ops::copy_row_blocks(out, in, blocks);
    Tensor want = ref_copy(out0, c.dt);
    ops::copy_row_blocks(want, rounded(in0, c.dt), blocks);
    expect_close(to_host_f32(out), want, kExact, what);
  }
}

TEST(CudaMoe, CombineForwardAndBackward) {
  for (const PermCase& c : kPermCases) {
    for (int64_t h : kWidths) {
      const std::string what = "combine n " + std::to_string(c.n) + " k " + std::to_string(c.k) +
                               " h " + std::to_string(h);
      const Tensor perm = host_perm(c, 43), perm_gpu = perm.to(Device::kCUDA);
      Tensor y0 = random_host({c.n * c.k, h}, 44), out0 = random_host({c.n, h}, 45);
      Tensor w = random_host({c.n, c.k}, 46);
      Tensor out = to_gpu(out0, kBF16);
      ops::combine_forward(out, to_gpu(y0, kBF16), perm_gpu, w.to(Device::kCUDA));
      Tensor out_want = ref_copy(out0, kBF16);
      ops::combine_forward(out_want, rounded(y0, kBF16), perm, w);
      expect_close(to_host_f32(out), out_want, tolerance_for(kBF16), what + " forward");

      Tensor d0 = random_host({c.n, h}, 47);
      Tensor dy = Tensor::empty({c.n * c.k, h}, kBF16, MemCategory::kOther, "dy", Device::kCUDA);
      Tensor dw = Tensor::empty({c.n, c.k}, kF32, MemCategory::kOther, "dw", Device::kCUDA);
      ops::combine_backward(dy, dw, to_gpu(d0, kBF16), to_gpu(y0, kBF16), perm_gpu,
                            w.to(Device::kCUDA));
      Tensor dy_want = host({c.n * c.k, h}), dw_want = host({c.n, c.k});
      ops::combine_backward(dy_want, dw_want, rounded(d0, kBF16), rounded(y0, kBF16), perm, w);
      expect_close(to_host_f32(dy), dy_want, tolerance_for(kBF16), what + " dy");
      // dtopk_w: an fp32 dot over h <= 256 products of values in [-1, 1] against the CPU's
      // double sum; its rounding (~1e-6) is within the f32 row of the table.
      expect_close(dw.to(Device::kCPU), dw_want, tolerance_for(kF32), what + " dtopk_w");
    }
  }
}

// ---- argument checks ----

TEST(CudaChecks, BadArgumentsThrowTandemErrors) {
  Tensor y = to_gpu(random_host({8}, 48), kF32);
  EXPECT_THROW(ops::axpy(y, random_host({8}, 49), 1.0), Error);                // x on the CPU
  EXPECT_THROW(ops::axpy(y, to_gpu(random_host({9}, 49), kF32), 1.0), Error);  // shape
  Tensor x32 = to_gpu(random_host({4, 8}, 50), kF32);  // rmsnorm takes bf16 activations
  Tensor y16 = Tensor::empty({4, 8}, kBF16, MemCategory::kOther, "y", Device::kCUDA);
  Tensor rstd = Tensor::empty({4}, kF32, MemCategory::kOther, "r", Device::kCUDA);
  EXPECT_THROW(ops::rmsnorm_forward(y16, rstd, x32, to_gpu(random_host({8}, 51), kF32), 1e-5),
               Error);
  Tensor logits = to_gpu(random_host({4, 8}, 52), kF32);
  Tensor idx = Tensor::empty({4, 9}, DType::kI32, MemCategory::kOther, "i", Device::kCUDA);
  Tensor w = Tensor::empty({4, 9}, kF32, MemCategory::kOther, "w", Device::kCUDA);
  Tensor probs = Tensor::empty({4, 8}, kF32, MemCategory::kOther, "p", Device::kCUDA);
  EXPECT_THROW(ops::router_forward(idx, w, probs, logits), Error);  // k = 9 > E = 8
}

// ---- FP8 (ops/fp8.h) ----

// The GPU's round trip through FP8 codes gives the CPU emulation's bits for every recipe's tiles
// (the bf16 output: the CPU's f32 result rounded to bf16), with NaN, infinities and values past
// the formats' range saturating alike.
TEST(CudaElementwise, Fp8RoundTripIsTheCpuEmulationBitForBit) {
  const int64_t rows = 200, cols = 300;
  Tensor x0 = random_host({rows, cols}, 31, 4.0);
  float* p = x0.data<float>();
  for (int64_t i = 0; i < x0.numel(); i += 7)
    p[i] *= std::pow(10.0f, static_cast<float>(i % 9) - 4);
  p[5] = 1e30f;
  p[cols + 9] = -std::numeric_limits<float>::infinity();
  p[3 * cols + 1] = 1e-30f;
  Tensor with_nan = x0.to(Device::kCPU);
  with_nan.data<float>()[2 * cols + 3] = std::numeric_limits<float>::quiet_NaN();
  const ops::Fp8Tiles cases[] = {ops::Fp8Tiles::tensorwise(fp8::Format::kE4M3, rows, cols),
                                 ops::Fp8Tiles::tensorwise(fp8::Format::kE5M2, rows, cols),
                                 ops::Fp8Tiles::blocks(fp8::Format::kE4M3, 1, 128),
                                 ops::Fp8Tiles::blocks(fp8::Format::kE4M3, 128, 1),
                                 ops::Fp8Tiles::blocks(fp8::Format::kE4M3, 128, 128),
                                 ops::Fp8Tiles::blocks(fp8::Format::kE5M2, 1, 128)};
  for (const Tensor& source : {x0, with_nan}) {
    for (const ops::Fp8Tiles& t : cases) {
      for (DType dt : {kF32, kBF16}) {
        const std::string what = std::string(enum_name(t.format)) + " tiles " +
                                 std::to_string(t.tile_rows) + "x" + std::to_string(t.tile_cols) +
                                 " " + name(dt);
        Tensor x = to_gpu(source, dt);
        Tensor y = Tensor::empty(x.shape(), dt, MemCategory::kOther, "y", Device::kCUDA);
        ops::fp8_round_trip(y, x, t);
        Tensor want = ref_copy(source, dt);
        ops::fp8_round_trip(want, want, t);
        const Tensor got = to_host_f32(y), expected = rounded(want, dt);
        int64_t differ = 0;
        for (int64_t i = 0; i < got.numel(); ++i) {
          const float g = got.data<float>()[i], w = expected.data<float>()[i];
          differ += !(g == w || (std::isnan(g) && std::isnan(w)));
        }
        EXPECT_EQ(differ, 0) << what;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::testing_gpu
