// GPU tests of the cuBLASLt products (linear layers), the cross-entropy, the fused LM head and
// AdamW. Oracle: the CPU ops (through ops.h) on the same inputs rounded to the GPU's storage
// dtypes, held to gpu_test.h's tolerance table. Where rounding the GPU must do makes the error
// depend on the data (the LM head's bf16 logits and dlogits, fp32 sums over a long k), the test
// adds that rounding's error bound (for a product, c * (|A| @ |B|)), computed per element on the
// CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/gpu_test.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/lm_head.h"
#include "ops/ops.h"

namespace tandem::testing_gpu {
namespace {

using ops::Accumulate;

Tensor host_f32(const Shape& shape) {
  return Tensor::zeros(shape, DType::kF32, MemCategory::kOther, "ref", Device::kCPU);
}

// Targets in [0, v) from `seed`, on the host.
Tensor random_targets(int64_t n, int64_t v, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::kI32, MemCategory::kOther, "targets", Device::kCPU);
  for (int64_t i = 0; i < n; ++i)
    t.data<int32_t>()[i] =
        static_cast<int32_t>(splitmix64(seed * 7919 + uint64_t(i)) % uint64_t(v));
  return t;
}

Tensor abs_of(const Tensor& host) {
  Tensor a = host_f32(host.shape());
  for (int64_t i = 0; i < host.numel(); ++i) a.data<float>()[i] = std::fabs(host.data<float>()[i]);
  return a;
}

Tensor copy_of(const Tensor& host) { return host.to(Device::kCPU); }

// |got - want| <= tol.atol + tol.rtol |want| + extra[i] elementwise (host f32); reports the worst.
void expect_close_plus(const Tensor& got, const Tensor& want, Tolerance tol, const Tensor& extra,
                       const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const float *g = got.data<float>(), *w = want.data<float>(), *e = extra.data<float>();
  int64_t worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double err = std::fabs(double(g[i]) - double(w[i]));
    const double bound = tol.atol + tol.rtol * std::fabs(double(w[i])) + double(e[i]);
    if (!(err <= bound) && (worst < 0 || err - bound > worst_excess)) {
      worst = i;
      worst_excess = err - bound;
    }
  }
  EXPECT_LT(worst, 0) << what << ": element " << worst << " is " << (worst >= 0 ? g[worst] : 0)
                      << ", reference " << (worst >= 0 ? w[worst] : 0) << ", allowed extra "
                      << (worst >= 0 ? e[worst] : 0);
}

// The message of the tandem::Error `f` throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- linear layers ----

enum class LinearOp { kForward, kBackwardInput, kBackwardWeight };

struct LinearShape {
  int64_t m, in, out;
};

// The two operands' and the output's shapes of `op`, and the op itself (any device).
struct LinearCall {
  Shape a, b, c;
  std::function<void(const Tensor&, const Tensor&, const Tensor&, Accumulate)> run;
};
LinearCall linear_call(LinearOp op, const LinearShape& s) {
  switch (op) {
    case LinearOp::kForward:  // y[m, out] = x[m, in] @ w[out, in]^T
      return {
          {s.m, s.in}, {s.out, s.in}, {s.m, s.out}, [](auto& y, auto& x, auto& w, Accumulate a) {
            ops::linear_forward(y, x, w, a);
          }};
    case LinearOp::kBackwardInput:  // dx[m, in] = dy[m, out] @ w[out, in]
      return {
          {s.m, s.out}, {s.out, s.in}, {s.m, s.in}, [](auto& dx, auto& dy, auto& w, Accumulate a) {
            ops::linear_backward_input(dx, dy, w, a);
          }};
    case LinearOp::kBackwardWeight:  // dw[out, in] = dy[m, out]^T @ x[m, in]
      return {
          {s.m, s.out}, {s.m, s.in}, {s.out, s.in}, [](auto& dw, auto& dy, auto& x, Accumulate a) {
            ops::linear_backward_weight(dw, dy, x, a);
          }};
  }
  return {};
}

// What the operands hold: uniform values in [-1, 1), or small integers, whose products and
// sums (below 2^24) every f32 order computes exactly.
enum class Operands { kUniform, kSmallIntegers };

Tensor integers_host(const Shape& shape, uint64_t seed, int64_t bound) {
  Tensor t = host_f32(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t r = splitmix64(seed * 0x9E3779B97F4A7C15ull + uint64_t(i));
    t.data<float>()[i] = static_cast<float>(int64_t(r % uint64_t(2 * bound + 1)) - bound);
  }
  return t;
}

// Runs `op` on the GPU (bf16 operands, `out` result starting from other values) and on the CPU
// (the operands rounded to bf16, in f32), and compares: by the table, or exactly for integer
// operands and an f32 result.
void check_linear(LinearOp op, const LinearShape& s, DType out, Accumulate acc, uint64_t seed,
                  Operands kind = Operands::kUniform) {
  SCOPED_TRACE(::testing::Message()
               << "op " << int(op) << ", m=" << s.m << " in=" << s.in << " out=" << s.out << ", "
               << dtype_name(out) << ", " << (acc == Accumulate::kAdd ? "add" : "overwrite"));
  const LinearCall call = linear_call(op, s);
  const bool ints = kind == Operands::kSmallIntegers;
  const Tensor a = ints ? integers_host(call.a, seed, 2) : random_host(call.a, seed);
  const Tensor b = ints ? integers_host(call.b, seed + 1, 2) : random_host(call.b, seed + 1);
  const Tensor c0 = ints ? integers_host(call.c, seed + 2, 8) : random_host(call.c, seed + 2);
  const Tensor gc = to_gpu(c0, out);
  call.run(gc, to_gpu(a, DType::kBF16), to_gpu(b, DType::kBF16), acc);
  const Tensor rc = copy_of(rounded(c0, out));
  call.run(rc, rounded(a, DType::kBF16), rounded(b, DType::kBF16), acc);
  Tolerance tol = ints && out == DType::kF32 ? Tolerance{0, 0} : tolerance_for(out);
  if (out == DType::kBF16 && acc == Accumulate::kAdd && !ints) {
    // cuBLASLt rounds the product to bf16 before adding a bf16 C (seen on the H200: errors of
    // one bf16 ulp of the product where product and C cancel), as PyTorch's bf16 gradient
    // accumulation does: allow half a bf16 ulp (2^-8 relative) of the largest product element.
    Tensor prod = host_f32(call.c);
    prod.zero_();
    call.run(prod, rounded(a, DType::kBF16), rounded(b, DType::kBF16), Accumulate::kOverwrite);
    double max_prod = 0;
    for (int64_t i = 0; i < prod.numel(); ++i) {
      max_prod = std::max(max_prod, std::fabs(double(prod.data<float>()[i])));
    }
    tol.atol += max_prod * 0x1p-8;
  }
  expect_close(to_host_f32(gc), rc, tol, "linear result");
}

// {37, 29, 53}: odd everywhere, rows 2-byte aligned; {0, 16, 8}: an expert with no token (the
// weight gradient's k == 0); {6, 0, 3}: in == 0 (the forward's k == 0). With k <= 256 and
// uniform operands the two f32 summation orders differ by a few 1e-6 at most, inside the table.
constexpr LinearShape kLinearShapes[] = {
    {37, 29, 53}, {64, 256, 128}, {1, 5, 7}, {0, 16, 8}, {6, 0, 3}};

TEST(CudaLinear, EveryOpMatchesCpuForEveryOutputDtypeAndMode) {
  uint64_t seed = 100;
  for (LinearOp op : {LinearOp::kForward, LinearOp::kBackwardInput, LinearOp::kBackwardWeight})
    for (const LinearShape& s : kLinearShapes)
      for (DType out : {DType::kF32, DType::kBF16})
        for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd})
          check_linear(op, s, out, acc, seed += 3);
}

TEST(CudaLinear, LongReductionsAreExactOnIntegers) {
  // k = 4096: uniform operands would leave the two fp32 summation orders up to k * 2^-24 *
  // (|A| @ |B|) apart, beyond the table; integer operands make every order exact, so the
  // transposes and leading dimensions of the long-k paths are checked bit for bit.
  for (DType out : {DType::kF32, DType::kBF16}) {
    check_linear(LinearOp::kForward, {16, 4096, 32}, out, Accumulate::kOverwrite, 7,
                 Operands::kSmallIntegers);
    check_linear(LinearOp::kBackwardInput, {16, 48, 4096}, out, Accumulate::kAdd, 8,
                 Operands::kSmallIntegers);
    check_linear(LinearOp::kBackwardWeight, {4096, 24, 40}, out, Accumulate::kAdd, 9,
                 Operands::kSmallIntegers);
  }
}

TEST(CudaLinear, UnalignedViewsAndRepeatedShapesGiveTheSameProduct) {
  // x is rows [1, 38) of a [38, 29] bf16 tensor: its data starts 58 bytes into the block, which
  // a plan built for aligned pointers must not be used for (Note [GEMM plan cache]).
  const int64_t m = 37, in = 29, out = 53;
  const Tensor x_full = random_host({m + 1, in}, 40), w = random_host({out, in}, 41);
  const Tensor gx = to_gpu(x_full, DType::kBF16).narrow_rows(1, m);
  const Tensor gw = to_gpu(w, DType::kBF16);
  const Tensor ref = host_f32({m, out});
  ops::linear_forward(ref, rounded(x_full, DType::kBF16).narrow_rows(1, m),
                      rounded(w, DType::kBF16));
  const Tensor y1 = Tensor::empty({m, out}, DType::kF32, MemCategory::kOther, "y", Device::kCUDA);
  const Tensor y2 = Tensor::empty({m, out}, DType::kF32, MemCategory::kOther, "y", Device::kCUDA);
  ops::linear_forward(y1, gx, gw);
  ops::linear_forward(y2, gx, gw);  // the cached plan
  const Tensor h1 = to_host_f32(y1), h2 = to_host_f32(y2);
  expect_close(h1, ref, tolerance_for(DType::kF32), "unaligned x");
  for (int64_t i = 0; i < h1.numel(); ++i)
    ASSERT_EQ(h1.data<float>()[i], h2.data<float>()[i]) << "element " << i;
}

// y = r + x @ w^T with the residual as cuBLASLt's C (separate from y, and in place): small
// integer operands make every order exact, so f32 and bf16 results equal the CPU's bit for bit.
TEST(CudaLinear, ForwardResidualMatchesCpuExactlyOnIntegers) {
  const int64_t m = 48, in = 16, out = 40;
  const Tensor x = integers_host({m, in}, 11, 2), w = integers_host({out, in}, 12, 2);
  const Tensor r = integers_host({m, out}, 13, 3);
  const Tensor ref = host_f32({m, out});
  ops::linear_forward_residual(ref, x, w, r);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor gx = to_gpu(x, DType::kBF16), gw = to_gpu(w, DType::kBF16);
    const Tensor gr = to_gpu(r, dt);
    const Tensor y = to_gpu(integers_host({m, out}, 14, 5), dt);  // overwritten
    ops::linear_forward_residual(y, gx, gw, gr);
    ops::linear_forward_residual(gr, gx, gw, gr);  // in place
    const Tensor hy = to_host_f32(y), hr = to_host_f32(gr);
    for (int64_t i = 0; i < ref.numel(); ++i) {
      ASSERT_EQ(hy.data<float>()[i], ref.data<float>()[i]) << dtype_name(dt) << " element " << i;
      ASSERT_EQ(hr.data<float>()[i], ref.data<float>()[i]) << dtype_name(dt) << " in place " << i;
    }
  }
  const Tensor gx = to_gpu(x, DType::kBF16), gw = to_gpu(w, DType::kBF16);
  const Tensor y = Tensor::empty({m, out}, DType::kF32, MemCategory::kOther, "y", Device::kCUDA);
  const Tensor r16 = to_gpu(r, DType::kBF16);
  const std::string err = error_of([&] { ops::linear_forward_residual(y, gx, gw, r16); });
  EXPECT_NE(err.find("'r'"), std::string::npos) << err;
}

// Note [Grouped expert products]: the grouped calls against the CPU's block-by-block products,
// bit for bit on small integer operands (every summation order is exact), with experts without
// rows and blocks of odd sizes; an f32 output is refused by name. The row counts exercise Note
// [Batched bulk of the experts' products] (grouped_linear.cc): {5, 0, 17, 3, 1} batches one
// expert's 17 rows and groups the rest; {40, 0, 37, 45, 3, 41} batches the first 37 rows of four
// experts and groups their remaining 3, 8 and 4 rows with the expert of 3.
TEST(CudaLinear, GroupedExpertProductsMatchCpuExactlyOnIntegers) {
  const int64_t in = 24, out = 40;
  std::vector<Tensor> w_host, w_gpu;
  for (size_t e = 0; e < 6; ++e) {
    w_host.push_back(integers_host({out, in}, 30 + e, 2));
    w_gpu.push_back(to_gpu(w_host.back(), DType::kBF16));
  }
  const auto equal = [](const Tensor& got_gpu, const Tensor& want, const std::string& what) {
    const Tensor got = to_host_f32(got_gpu);
    ASSERT_EQ(got.shape(), want.shape()) << what;
    for (int64_t i = 0; i < want.numel(); ++i)
      ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << what << " element " << i;
  };
  for (const std::vector<int32_t>& counts :
       {std::vector<int32_t>{5, 0, 17, 3, 1}, std::vector<int32_t>{40, 0, 37, 45, 3, 41}}) {
    int64_t rows_total = 0;
    for (const int32_t r : counts) rows_total += r;
    const std::vector<Tensor> wh(w_host.begin(), w_host.begin() + counts.size());
    const std::vector<Tensor> wg(w_gpu.begin(), w_gpu.begin() + counts.size());
    const Tensor x = integers_host({rows_total, in}, 21, 2);
    const Tensor dy = integers_host({rows_total, out}, 22, 2);
    const DType dt = DType::kBF16;  // the grouped call's only output dtype
    const Tensor y_ref = host_f32({rows_total, out}), dx_ref = host_f32({rows_total, in});
    ops::grouped_linear_forward(y_ref, x, wh, counts);
    ops::grouped_linear_backward_input(dx_ref, dy, wh, counts);
    const Tensor y = to_gpu(integers_host({rows_total, out}, 23, 5), dt);  // overwritten
    const Tensor dx = to_gpu(integers_host({rows_total, in}, 24, 5), dt);
    ops::grouped_linear_forward(y, to_gpu(x, DType::kBF16), wg, counts);
    ops::grouped_linear_backward_input(dx, to_gpu(dy, DType::kBF16), wg, counts);
    const std::string rows_named = std::to_string(rows_total) + " rows";
    equal(y, y_ref, "forward, " + rows_named);
    equal(dx, dx_ref, "input gradient, " + rows_named);
  }
  const std::vector<int32_t> rows = {5, 0, 17, 3, 1};
  const int64_t total = 26;
  const std::vector<Tensor> w5(w_gpu.begin(), w_gpu.begin() + 5);
  const Tensor x = integers_host({total, in}, 21, 2);
  const std::vector<int32_t> short_rows = {5, 0, 17, 3, 0};
  const std::string err = error_of([&] {
    ops::grouped_linear_forward(to_gpu(host_f32({total, out}), DType::kBF16),
                                to_gpu(x, DType::kBF16), w5, short_rows);
  });
  EXPECT_NE(err.find("sum to 25"), std::string::npos) << err;
  const std::string f32 = error_of([&] {
    ops::grouped_linear_forward(to_gpu(host_f32({total, out}), DType::kF32),
                                to_gpu(x, DType::kBF16), w5, rows);
  });
  EXPECT_NE(f32.find("'y'"), std::string::npos) << f32;
}

TEST(CudaLinear, RejectsWrongDtypesAndShapes) {
  const Tensor x32 = to_gpu(random_host({4, 3}, 1), DType::kF32);
  const Tensor w = to_gpu(random_host({5, 3}, 2), DType::kBF16);
  const Tensor y = Tensor::empty({4, 5}, DType::kF32, MemCategory::kOther, "y", Device::kCUDA);
  const std::string dtype = error_of([&] { ops::linear_forward(y, x32, w); });
  EXPECT_NE(dtype.find("linear_forward: tensor 'x' is f32, expected bf16"), std::string::npos)
      << dtype;
  const Tensor y_bad = Tensor::empty({4, 6}, DType::kF32, MemCategory::kOther, "y", Device::kCUDA);
  const Tensor x = to_gpu(random_host({4, 3}, 3), DType::kBF16);
  const std::string shape = error_of([&] { ops::linear_forward(y_bad, x, w); });
  EXPECT_NE(shape.find("tensor 'y' has shape"), std::string::npos) << shape;
}

TEST(CudaGemm, MeasuresAPlausibleMatrixRate) {
  const double tflops = ops::cuda::measure_bf16_matmul_tflops(512, 512, 512, 5);
  EXPECT_GT(tflops, 0.0);
  EXPECT_LT(tflops, 1e4);
}

// The tuner's comparison (Note [Tuned algorithms] in ops/cuda/gemm.cc): the differing words of
// two device buffers, counted on the host over the same words; a second call adds to the count.
TEST(CudaGemm, CountsDifferingWordsAsTheHostDoes) {
  const int64_t words = 1'000'003;
  Tensor a = Tensor::empty({words}, DType::kI32, MemCategory::kOther, "a", Device::kCPU);
  Tensor b = Tensor::empty({words}, DType::kI32, MemCategory::kOther, "b", Device::kCPU);
  uint32_t want = 0;
  for (int64_t i = 0; i < words; ++i) {
    const uint64_t r = splitmix64(uint64_t(i) + 17);
    a.data<int32_t>()[i] = static_cast<int32_t>(r);
    // About one word in 500 differs, in any bit (the sign's too).
    const bool flip = r % 500 == 0;
    b.data<int32_t>()[i] = static_cast<int32_t>(r ^ (flip ? uint64_t{1} << (r >> 59) : 0));
    want += a.data<int32_t>()[i] != b.data<int32_t>()[i] ? 1 : 0;
  }
  ASSERT_GT(want, 1000u);
  const Tensor da = a.to(Device::kCUDA), db = b.to(Device::kCUDA);
  const Tensor count = Tensor::zeros({1}, DType::kI32, MemCategory::kOther, "count", Device::kCUDA);
  auto* c = static_cast<uint32_t*>(count.raw_data());
  ops::cuda::count_differing_words(da.raw_data(), db.raw_data(), words, c);
  EXPECT_EQ(static_cast<uint32_t>(count.to(Device::kCPU).data<int32_t>()[0]), want);
  ops::cuda::count_differing_words(da.raw_data(), da.raw_data(), words, c);  // none differ
  ops::cuda::count_differing_words(db.raw_data(), da.raw_data(), words - 1, c);
  const bool last_differs = a.data<int32_t>()[words - 1] != b.data<int32_t>()[words - 1];
  EXPECT_EQ(static_cast<uint32_t>(count.to(Device::kCPU).data<int32_t>()[0]),
            2 * want - (last_differs ? 1 : 0));
}

// ---- cross-entropy ----

TEST(CudaCrossEntropy, ForwardMatchesCpu) {
  // V = 50257 (odd): every row starts at another alignment, so each takes the scalar head, the
  // 16-byte body and the scalar tail; the narrowed view shifts the whole tensor by one row.
  struct Case {
    int64_t n, v;
    bool narrowed;
  };
  for (const Case c :
       {Case{37, 53, false}, Case{8, 1000, false}, Case{3, 50257, false}, Case{5, 1001, true}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << c.n << "x" << c.v << " " << dtype_name(dt)
                                        << (c.narrowed ? " narrowed" : ""));
      const int64_t rows = c.n + (c.narrowed ? 1 : 0);
      const Tensor logits = random_host({rows, c.v}, uint64_t(c.v) + rows, 4.0);
      const Tensor targets = random_targets(c.n, c.v, uint64_t(c.n));
      const int64_t first = c.narrowed ? 1 : 0;
      const double got = ops::cross_entropy_forward(to_gpu(logits, dt).narrow_rows(first, c.n),
                                                    targets.to(Device::kCUDA));
      const double want =
          ops::cross_entropy_forward(rounded(logits, dt).narrow_rows(first, c.n), targets);
      // Per row an f32 log-sum-exp against the CPU's double one; the sum is in double on both.
      const Tolerance tol = tolerance_for(DType::kF32);
      EXPECT_NEAR(got, want, tol.rtol * std::fabs(want) + tol.atol * double(c.n));
    }
  }
}

TEST(CudaCrossEntropy, BackwardMatchesCpuForEveryDtypeMixAndInPlace) {
  const int64_t n = 7;
  for (const int64_t v : {int64_t{53}, int64_t{4099}}) {
    const Tensor logits = random_host({n, v}, uint64_t(v), 4.0);
    const Tensor targets = random_targets(n, v, 3);
    const Tensor gt = targets.to(Device::kCUDA);
    for (DType in : {DType::kF32, DType::kBF16}) {
      const Tensor want = host_f32({n, v});
      ops::cross_entropy_backward(want, rounded(logits, in), targets, 0.37);
      for (DType out : {DType::kF32, DType::kBF16}) {
        for (bool in_place : {false, true}) {
          if (in_place && in != out) continue;
          SCOPED_TRACE(::testing::Message() << "v " << v << ", " << dtype_name(in) << " -> "
                                            << dtype_name(out) << (in_place ? " in place" : ""));
          const Tensor gl = to_gpu(logits, in);
          const Tensor gd =
              in_place ? gl
                       : Tensor::empty({n, v}, out, MemCategory::kOther, "dlogits", Device::kCUDA);
          ops::cross_entropy_backward(gd, gl, gt, 0.37);
          expect_close(to_host_f32(gd), want, tolerance_for(out), "dlogits");
        }
      }
    }
  }
}

TEST(CudaCrossEntropy, BadTargetsThrowNamingTheRow) {
  const Tensor logits = to_gpu(random_host({6, 53}, 5), DType::kF32);
  Tensor targets = random_targets(6, 53, 6);
  targets.data<int32_t>()[3] = 53;
  const Tensor gt = targets.to(Device::kCUDA);
  const std::string fwd = error_of([&] { (void)ops::cross_entropy_forward(logits, gt); });
  EXPECT_NE(fwd.find("cross_entropy_forward: target 53 at row 3 is outside [0, 53)"),
            std::string::npos)
      << fwd;
  targets.data<int32_t>()[3] = 0;
  targets.data<int32_t>()[5] = -1;
  const Tensor gt2 = targets.to(Device::kCUDA);
  const Tensor d = Tensor::empty({6, 53}, DType::kF32, MemCategory::kOther, "d", Device::kCUDA);
  const std::string bwd = error_of([&] { ops::cross_entropy_backward(d, logits, gt2, 1.0); });
  EXPECT_NE(bwd.find("cross_entropy_backward: target -1 at row 5 is outside [0, 53)"),
            std::string::npos)
      << bwd;
}

// ---- LM head fused with cross-entropy ----

// Forces the LM head's rows per block for one scope.
class LmHeadBlockRows {
 public:
  explicit LmHeadBlockRows(int64_t rows)
      : previous_(ops::cuda::set_lm_head_block_rows_for_testing(rows)) {}
  ~LmHeadBlockRows() { ops::cuda::set_lm_head_block_rows_for_testing(previous_); }
  LmHeadBlockRows(const LmHeadBlockRows&) = delete;
  LmHeadBlockRows& operator=(const LmHeadBlockRows&) = delete;

 private:
  int64_t previous_;
};

// Note [LM head tolerance]: the GPU rounds the logits z to bf16 before its fp32 softmax
// (lm_head.cu); the CPU keeps them in f32. Each rounding is at most half an ulp, |e_j| <= u |z_j|
// with u = 2^-8, so the GPU's results differ from the CPU's by at most (per row, p = softmax(z),
// t the target):
//   lse:      a = e^(2 u max|z|) u sum_j p_j |z_j|  (mean value theorem: along the way from z to
//             z + e each p_j is within a factor e^(2 u max|z|) of its value at z, since lse is
//             1-Lipschitz in the max norm);
//   loss:     a + u |z_t|;
//   dlogits:  scale p_j expm1(u |z_j| + a) from p (the one-hot term is exact), and after rounding
//             to bf16 u |dlogits| more; dx and dw then carry that bound through |w| and |x|.
// That is 4% of a probability at |z| = 10. Random signs keep the real errors well below these sums
// of absolute values; the bounds are what the rounding allows, not a margin picked to pass. fp32
// arithmetic in another order stays under tolerance_for(kF32) on top.
struct LogitRoundingBounds {
  Tensor lse;       // [n] f32
  double loss = 0;  // of the summed loss
  Tensor dlogits;   // [n, v] f32, of the bf16 dlogits
};

// The bounds of Note [LM head tolerance] from the CPU's f32 logits [n, v], lse [n], targets [n].
LogitRoundingBounds logit_rounding_bounds(const Tensor& logits, const Tensor& lse,
                                          const Tensor& targets, double scale) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const double u = std::ldexp(1.0, -8);
  LogitRoundingBounds b{host_f32({n}), 0.0, host_f32({n, v})};
  for (int64_t r = 0; r < n; ++r) {
    const float* z = logits.data<float>() + r * v;
    const double l = lse.data<float>()[r];
    const int64_t t = targets.data<int32_t>()[r];
    double mean_abs = 0, most = 0;  // sum_j p_j |z_j|, max_j |z_j|
    for (int64_t j = 0; j < v; ++j) {
      mean_abs += std::exp(z[j] - l) * std::fabs(z[j]);
      most = std::max(most, std::fabs(double(z[j])));
    }
    const double a = std::exp(2 * u * most) * u * mean_abs;
    b.lse.data<float>()[r] = static_cast<float>(a);
    b.loss += a + u * std::fabs(double(z[t]));
    float* e = b.dlogits.data<float>() + r * v;
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(z[j] - l), dl = (p - (j == t ? 1.0 : 0.0)) * scale;
      e[j] = static_cast<float>(u * std::fabs(dl) +
                                (1 + u) * scale * p * std::expm1(u * std::fabs(z[j]) + a));
    }
  }
  return b;
}

struct LmHeadCase {
  int64_t n, h, v, block_rows;  // block_rows 0: the op's own choice (one block here)
};
constexpr LmHeadCase kLmHeadCases[] = {
    {37, 29, 53, 8},       // 4 full blocks and one of 5 rows
    {37, 29, 53, 0},       // one block
    {300, 64, 1000, 128},  // V % 8 == 0: no scalar tail
    {5, 16, 50257, 2},     // odd V: padded logit rows, scalar tails
    {3, 16, 60001, 0},     // one row per SM (above V ~ 57.7k two do not fit in its shared memory)
    {3, 16, 120001, 0},    // a row wider than shared memory (V above 116088 on an H200): the
                           // one-call op's two-kernel path
};

TEST(CudaLmHead, ForwardAndBackwardMatchCpu) {
  uint64_t seed = 500;
  for (const LmHeadCase& c : kLmHeadCases) {
    for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
      SCOPED_TRACE(::testing::Message()
                   << "n=" << c.n << " h=" << c.h << " v=" << c.v << " block " << c.block_rows
                   << ", dw " << (acc == Accumulate::kAdd ? "add" : "overwrite"));
      const LmHeadBlockRows block(c.block_rows);
      const Tensor x = random_host({c.n, c.h}, seed += 3), w = random_host({c.v, c.h}, seed + 1);
      const Tensor dw0 = random_host({c.v, c.h}, seed + 2, 0.1);
      const Tensor targets = random_targets(c.n, c.v, seed);
      const Tensor xr = rounded(x, DType::kBF16), wr = rounded(w, DType::kBF16);
      const Tensor gx = to_gpu(x, DType::kBF16), gw = to_gpu(w, DType::kBF16);
      const Tensor gt = targets.to(Device::kCUDA);
      const double scale = 1.0 / double(c.n);

      // Forward: lse per row and the summed loss, within Note [LM head tolerance].
      const Tensor glse =
          Tensor::empty({c.n}, DType::kF32, MemCategory::kOther, "lse", Device::kCUDA);
      const Tensor lse = host_f32({c.n});
      const double got = ops::lm_head_ce_forward(glse, gx, gw, gt);
      const double want = ops::lm_head_ce_forward(lse, xr, wr, targets);
      const Tensor logits = host_f32({c.n, c.v});
      ops::linear_forward(logits, xr, wr);
      const LogitRoundingBounds bound = logit_rounding_bounds(logits, lse, targets, scale);
      const Tolerance f32 = tolerance_for(DType::kF32);
      EXPECT_NEAR(got, want, f32.rtol * std::fabs(want) + f32.atol * double(c.n) + bound.loss)
          << "loss";
      expect_close_plus(to_host_f32(glse), lse, f32, bound.lse, "lse");

      // Backward, each side from its own forward's lse.
      const Tensor gdx =
          Tensor::empty({c.n, c.h}, DType::kBF16, MemCategory::kOther, "dx", Device::kCUDA);
      const Tensor gdw = to_gpu(dw0, DType::kF32);
      ops::lm_head_ce_backward(gdx, gdw, gx, gw, gt, glse, scale, acc);
      const Tensor dx = host_f32({c.n, c.h}), dw = copy_of(dw0);
      ops::lm_head_ce_backward(dx, dw, xr, wr, targets, lse, scale, acc);

      // The dlogits' bound (Note [LM head tolerance]) through both products: |e| @ |w| for dx,
      // |e|^T @ |x| for dw.
      const Tensor dx_extra = host_f32({c.n, c.h}), dw_extra = host_f32({c.v, c.h});
      ops::linear_backward_input(dx_extra, bound.dlogits, abs_of(wr));
      ops::linear_backward_weight(dw_extra, bound.dlogits, abs_of(xr), Accumulate::kOverwrite);
      expect_close_plus(to_host_f32(gdx), dx, tolerance_for(DType::kBF16), dx_extra, "dx");
      expect_close_plus(to_host_f32(gdw), dw, f32, dw_extra, "dw");

      // Forward and backward in one call: the same products in the same order as the two calls
      // above, and per row the same sums (Note [Fused loss rows] in lm_head.cu), so the same bits.
      const Tensor glse2 =
          Tensor::empty({c.n}, DType::kF32, MemCategory::kOther, "lse2", Device::kCUDA);
      const Tensor gdx2 =
          Tensor::empty({c.n, c.h}, DType::kBF16, MemCategory::kOther, "dx2", Device::kCUDA);
      const Tensor gdw2 = to_gpu(dw0, DType::kF32);
      const double got2 =
          ops::lm_head_ce_forward_backward(gdx2, gdw2, glse2, gx, gw, gt, scale, acc).get();
      EXPECT_EQ(got2, got) << "loss of the one-call op";
      expect_close(to_host_f32(glse2), to_host_f32(glse), {0, 0}, "lse of the one-call op");
      expect_close(to_host_f32(gdx2), to_host_f32(gdx), {0, 0}, "dx of the one-call op");
      expect_close(to_host_f32(gdw2), to_host_f32(gdw), {0, 0}, "dw of the one-call op");
    }
  }
}

// --eod-mask-loss (Note [Loss mask] in model/end_nodes.cc): the masked ops against the CPU's,
// within the unmasked bounds (a masked row's terms are zero on both sides); every third row
// dropped, across blocks, on the one-row-a-block path and the two-kernel one; and the one-call
// op gives the two calls' bits.
TEST(CudaLmHead, MaskedRowsAddNothingAsOnTheCpu) {
  for (const LmHeadCase& c : {LmHeadCase{37, 29, 53, 8}, LmHeadCase{3, 16, 120001, 0}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " v=" << c.v);
    const LmHeadBlockRows block(c.block_rows);
    const Tensor x = random_host({c.n, c.h}, 900), w = random_host({c.v, c.h}, 901);
    const Tensor targets = random_targets(c.n, c.v, 902);
    Tensor mask = host_f32({c.n});
    for (int64_t r = 0; r < c.n; ++r) mask.data<float>()[r] = r % 3 == 1 ? 0.0f : 1.0f;
    const Tensor xr = rounded(x, DType::kBF16), wr = rounded(w, DType::kBF16);
    const Tensor gx = to_gpu(x, DType::kBF16), gw = to_gpu(w, DType::kBF16);
    const Tensor gt = targets.to(Device::kCUDA), gmask = mask.to(Device::kCUDA);
    const double scale = 0.5;
    const auto gpu = [](const Shape& s, DType t) {
      return Tensor::zeros(s, t, MemCategory::kOther, "gpu", Device::kCUDA);
    };
    const Tensor glse = gpu({c.n}, DType::kF32), lse = host_f32({c.n});
    const double got = ops::lm_head_ce_forward_masked(glse, gx, gw, gt, gmask);
    const double want = ops::lm_head_ce_forward_masked(lse, xr, wr, targets, mask);
    const Tensor logits = host_f32({c.n, c.v});
    ops::linear_forward(logits, xr, wr);
    const LogitRoundingBounds bound = logit_rounding_bounds(logits, lse, targets, scale);
    const Tolerance f32 = tolerance_for(DType::kF32);
    EXPECT_NEAR(got, want, f32.rtol * std::fabs(want) + f32.atol * double(c.n) + bound.loss)
        << "masked loss";
    const Tensor gdx = gpu({c.n, c.h}, DType::kBF16), gdw = gpu({c.v, c.h}, DType::kF32);
    ops::lm_head_ce_backward_masked(gdx, gdw, gx, gw, gt, glse, scale, gmask,
                                    Accumulate::kOverwrite);
    const Tensor dx = host_f32({c.n, c.h}), dw = host_f32({c.v, c.h});
    ops::lm_head_ce_backward_masked(dx, dw, xr, wr, targets, lse, scale, mask,
                                    Accumulate::kOverwrite);
    const Tensor dx_extra = host_f32({c.n, c.h}), dw_extra = host_f32({c.v, c.h});
    ops::linear_backward_input(dx_extra, bound.dlogits, abs_of(wr));
    ops::linear_backward_weight(dw_extra, bound.dlogits, abs_of(xr), Accumulate::kOverwrite);
    expect_close_plus(to_host_f32(gdx), dx, tolerance_for(DType::kBF16), dx_extra, "masked dx");
    expect_close_plus(to_host_f32(gdw), dw, f32, dw_extra, "masked dw");
    const Tensor gdx2 = gpu({c.n, c.h}, DType::kBF16), gdw2 = gpu({c.v, c.h}, DType::kF32);
    const Tensor glse2 = gpu({c.n}, DType::kF32);
    EXPECT_EQ(ops::lm_head_ce_forward_backward_masked(gdx2, gdw2, glse2, gx, gw, gt, scale, gmask,
                                                      Accumulate::kOverwrite)
                  .get(),
              got)
        << "masked loss of the one-call op";
    expect_close(to_host_f32(gdx2), to_host_f32(gdx), {0, 0}, "masked dx of the one-call op");
    expect_close(to_host_f32(gdw2), to_host_f32(gdw), {0, 0}, "masked dw of the one-call op");
  }
}

TEST(CudaLmHead, NoRowsLeaveLossZeroAndHonourAccumulate) {
  const int64_t h = 8, v = 11;
  const auto empty = [](const Shape& s, DType t) {
    return Tensor::empty(s, t, MemCategory::kOther, "empty", Device::kCUDA);
  };
  const Tensor x = empty({0, h}, DType::kBF16), dx = empty({0, h}, DType::kBF16);
  const Tensor lse = empty({0}, DType::kF32), targets = empty({0}, DType::kI32);
  const Tensor w = to_gpu(random_host({v, h}, 1), DType::kBF16);
  EXPECT_EQ(ops::lm_head_ce_forward(lse, x, w, targets), 0.0);
  const Tensor dw0 = random_host({v, h}, 2);
  const Tensor kept = to_gpu(dw0, DType::kF32);
  ops::lm_head_ce_backward(dx, kept, x, w, targets, lse, 1.0, Accumulate::kAdd);
  expect_close(to_host_f32(kept), dw0, {0, 0}, "dw with kAdd and no rows");
  const Tensor zeroed = to_gpu(dw0, DType::kF32);
  ops::lm_head_ce_backward(dx, zeroed, x, w, targets, lse, 1.0, Accumulate::kOverwrite);
  expect_close(to_host_f32(zeroed), host_f32({v, h}), {0, 0}, "dw with kOverwrite and no rows");
}

TEST(CudaLmHead, BadTargetsThrowNamingTheRow) {
  const LmHeadBlockRows block(8);  // the bad row sits in the third block
  const int64_t n = 24, h = 16, v = 53;
  const Tensor x = to_gpu(random_host({n, h}, 1), DType::kBF16);
  const Tensor w = to_gpu(random_host({v, h}, 2), DType::kBF16);
  const Tensor lse = Tensor::empty({n}, DType::kF32, MemCategory::kOther, "lse", Device::kCUDA);
  Tensor targets = random_targets(n, v, 3);
  targets.data<int32_t>()[20] = 70000;
  const Tensor gt = targets.to(Device::kCUDA);
  const std::string fwd = error_of([&] { (void)ops::lm_head_ce_forward(lse, x, w, gt); });
  EXPECT_NE(fwd.find("lm_head_ce_forward: target 70000 at row 20 is outside [0, 53)"),
            std::string::npos)
      << fwd;
  targets.data<int32_t>()[20] = 0;
  targets.data<int32_t>()[6] = -2;
  const Tensor gt2 = targets.to(Device::kCUDA);
  const Tensor dx = Tensor::empty({n, h}, DType::kBF16, MemCategory::kOther, "dx", Device::kCUDA);
  const Tensor dw = Tensor::zeros({v, h}, DType::kF32, MemCategory::kOther, "dw", Device::kCUDA);
  const std::string bwd = error_of([&] { ops::lm_head_ce_backward(dx, dw, x, w, gt2, lse, 1.0); });
  EXPECT_NE(bwd.find("lm_head_ce_backward: target -2 at row 6 is outside [0, 53)"),
            std::string::npos)
      << bwd;
  // The fused op returns at once; its loss throws when asked for, naming the lowest bad row
  // (rows 6 and 17 are bad, in different blocks) and its target.
  targets.data<int32_t>()[17] = 53;
  const Tensor gt3 = targets.to(Device::kCUDA);
  ops::PendingScalar loss = ops::lm_head_ce_forward_backward(dx, dw, lse, x, w, gt3, 1.0);
  const std::string both = error_of([&] { (void)loss.get(); });
  EXPECT_NE(both.find("lm_head_ce_forward_backward: target -2 at row 6 is outside [0, 53)"),
            std::string::npos)
      << both;
  // Good targets: the pending loss is the waiting forward's, bit for bit.
  const Tensor good = random_targets(n, v, 4).to(Device::kCUDA);
  const double want = ops::lm_head_ce_forward(lse, x, w, good);
  EXPECT_EQ(ops::lm_head_ce_forward_backward(dx, dw, lse, x, w, good, 1.0).get(), want);
}

// ---- AdamW ----

TEST(CudaAdamW, SeveralStepsMatchCpuAlignedAndNot) {
  // 4099 elements: the float4 body plus a 3-element tail; the unaligned case (every tensor a view
  // one element into its block) takes the scalar kernel throughout.
  const int64_t n = 4099;
  for (bool unaligned : {false, true}) {
    SCOPED_TRACE(unaligned ? "unaligned" : "aligned");
    const int64_t skip = unaligned ? 1 : 0;
    const auto gpu = [&](const Tensor& host) {
      const Tensor full =
          Tensor::zeros({n + skip}, DType::kF32, MemCategory::kOther, "adamw", Device::kCUDA);
      const Tensor view = full.narrow_rows(skip, n);
      view.copy_from(host);
      return view;
    };
    const Tensor p = random_host({n}, 11), zeros = host_f32({n});
    const Tensor gp = gpu(p), gm = gpu(zeros), gv = gpu(zeros);
    const Tensor cp = copy_of(p), cm = copy_of(zeros), cv = copy_of(zeros);
    for (int64_t step = 1; step <= 5; ++step) {
      const Tensor g = random_host({n}, 20 + uint64_t(step), 0.1);
      const ops::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, step};
      ops::adamw_step(gp, gpu(g), gm, gv, hp);
      ops::adamw_step(cp, g, cm, cv, hp);
    }
    const Tolerance tol = tolerance_for(DType::kF32);
    expect_close(to_host_f32(gp), cp, tol, "param");
    expect_close(to_host_f32(gm), cm, tol, "m");
    expect_close(to_host_f32(gv), cv, tol, "v");
  }
}

// adamw_step_flat against the CPU op: decayed ranges whose bounds fall inside float4 vectors, the
// clipping coefficient as the gradient scale (and a step at one), the bf16 compute copy (bit for
// bit what convert makes of the GPU's own weights). 600 bounds take the one-launch-per-run path.
TEST(CudaAdamW, FlatStepMatchesCpuWithScaleAndCopy) {
  const int64_t n = 4099;
  const std::vector<int64_t> few = {5, 1030, 1031, 2050, 4001, 4099};
  const std::vector<int64_t> many = [] {
    std::vector<int64_t> bounds;
    for (int64_t b = 1; bounds.size() < 600; b += 5) {
      bounds.push_back(b);
      bounds.push_back(b + 2);
    }
    return bounds;
  }();
  for (const std::vector<int64_t>* decayed : {&few, &many}) {
    for (bool unaligned : {false, true}) {
      SCOPED_TRACE(std::string(decayed == &few ? "one launch, " : "per run, ") +
                   (unaligned ? "unaligned" : "aligned"));
      const int64_t skip = unaligned ? 1 : 0;
      const auto gpu = [&](const Tensor& host, DType dt) {
        const Tensor full =
            Tensor::zeros({n + skip}, dt, MemCategory::kOther, "adamw", Device::kCUDA);
        const Tensor view = full.narrow_rows(skip, n);
        if (host.defined()) view.copy_from(host);
        return view;
      };
      const Tensor p = random_host({n}, 12), zeros = host_f32({n});
      const Tensor gp = gpu(p, DType::kF32), gm = gpu(zeros, DType::kF32);
      const Tensor gv = gpu(zeros, DType::kF32), gc = gpu(Tensor(), DType::kBF16);
      const Tensor cp = copy_of(p), cm = copy_of(zeros), cv = copy_of(zeros);
      for (int64_t step = 1; step <= 4; ++step) {
        const Tensor g = random_host({n}, 40 + uint64_t(step), 0.1);
        const double coeff = step == 3 ? 1.0 : 0.37;
        const ops::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, step};
        ops::adamw_step_flat(gp, gm, gv, gc, gpu(g, DType::kF32), *decayed, coeff, hp);
        ops::adamw_step_flat(cp, cm, cv, Tensor(), g, *decayed, coeff, hp);
      }
      const Tolerance tol = tolerance_for(DType::kF32);
      expect_close(to_host_f32(gp), cp, tol, "param");
      expect_close(to_host_f32(gm), cm, tol, "m");
      expect_close(to_host_f32(gv), cv, tol, "v");
      const Tensor want =
          Tensor::empty({n}, DType::kBF16, MemCategory::kOther, "want", Device::kCUDA);
      ops::convert(want, gp);
      const Tensor got_host = gc.to(Device::kCPU), want_host = want.to(Device::kCPU);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i)
        differ += got_host.data<BF16>()[i].bits != want_host.data<BF16>()[i].bits;
      EXPECT_EQ(differ, 0) << "elements of the bf16 copy unlike convert's";
    }
  }
}

TEST(CudaAdamW, RejectsAStepBelowOne) {
  const Tensor t = Tensor::zeros({4}, DType::kF32, MemCategory::kOther, "t", Device::kCUDA);
  const std::string msg = error_of([&] {
    ops::adamw_step(t, t, t, t, ops::AdamWParams{1e-3, 0.9, 0.999, 1e-8, 0, 0});
  });
  EXPECT_NE(msg.find("adamw_step: step is 0"), std::string::npos) << msg;
}

// Note [Lanes]: six products, one per piece of a Lanes (four lanes: two pieces share lanes 0
// and 1), against the same products one after another. Bitwise the same; the pieces see the
// work enqueued on the current stream before the Lanes (x scaled there), and the current stream
// sees theirs after join() (y scaled there).
TEST(CudaLanes, PiecesAreBitwiseTheSerialProducts) {
  constexpr int64_t kPieces = 6, kRows = 96, kIn = 192, kOut = 320;
  const Tensor x0 = random_host({kPieces * kRows, kIn}, 71);
  std::vector<Tensor> w;
  for (int64_t p = 0; p < kPieces; ++p)
    w.push_back(to_gpu(random_host({kOut, kIn}, 80 + p), DType::kBF16));
  auto products = [&](bool lanes) {
    const Tensor x = to_gpu(x0, DType::kBF16);
    ops::scale(x, 2.0);  // on the current stream, before the fork point
    const Tensor y = Tensor::empty({kPieces * kRows, kOut}, DType::kBF16, MemCategory::kOther, "y",
                                   Device::kCUDA);
    auto piece = [&](int64_t p) {
      ops::linear_forward(y.narrow_rows(p * kRows, kRows), x.narrow_rows(p * kRows, kRows), w[p]);
    };
    if (lanes) {
      ops::Lanes l(x);
      for (int64_t p = 0; p < kPieces; ++p) l.run(p, [&] { piece(p); });
      l.join();
    } else {
      for (int64_t p = 0; p < kPieces; ++p) piece(p);
    }
    ops::scale(y, 0.5);  // on the current stream, after join()
    return to_host_f32(y);
  };
  const Tensor serial = products(false);
  const Tensor laned = products(true);
  ASSERT_EQ(serial.nbytes(), laned.nbytes());
  EXPECT_EQ(std::memcmp(serial.raw_data(), laned.raw_data(), serial.nbytes()), 0);
  // And against the CPU: x * 2 through each piece's weights, halved.
  const Tensor x2 = rounded(x0, DType::kBF16);
  ops::scale(x2, 2.0);
  Tensor want = Tensor::zeros({kPieces * kRows, kOut}, DType::kF32, MemCategory::kOther, "want",
                              Device::kCPU);
  for (int64_t p = 0; p < kPieces; ++p) {
    ops::linear_forward(want.narrow_rows(p * kRows, kRows), x2.narrow_rows(p * kRows, kRows),
                        rounded(to_host_f32(w[p]), DType::kF32));
  }
  ops::scale(want, 0.5);
  expect_close(laned, want, tolerance_for(DType::kBF16), "lanes");
}

}  // namespace
}  // namespace tandem::testing_gpu
