// Times the GPU flash attention (ops::attention_forward / backward on CUDA tensors) with CUDA
// events: every D 64 tile variant (Note [Attention variants] in src/ops/cuda/attention_mma.cuh) on
// the two benchmark shapes, each checked against variant 0, then D 128 at shape (c) and multi-head
// latent attention's q/k 192 with v 128 at shape (d), the defaults and each other tiling of D
// 128's forward (both shapes) and deterministic backward (shape (c)); prints TFLOP/s. Causal FLOPs:
// forward 2*b*h*s*s*(D+Dv)/2 (the two products over the lower triangle), backward 2.5x that.
// With `overlap`: memory-bound work issued on a second stream beside shape (d)'s attention, against
// the same work after it (whether the GPU runs them side by side: the experts' weight gradients,
// 64 experts of 384 rows, beside the backward; AdamW over 138 million weights beside two
// backwards and beside four forwards). With `documents`: shapes (b), (c) and (d) within
// documents of seq, seq / 2, 512 and 128 tokens (--reset-attention-mask) against plain causal
// attention, the ratio of their times (Note [Attention document bounds]). Standalone (no Google
// Benchmark): `attention_timing [iterations] [overlap | documents]`.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/tensor.h"
#include "cuda_timing.h"
#include "ops/cuda/attention.h"
#include "ops/ops.h"

namespace {

namespace attn = tandem::ops::cuda;
using tandem::Device;
using tandem::DType;
using tandem::MemCategory;
using tandem::Shape;
using tandem::Tensor;
using tandem::bench::host_f32;
using tandem::bench::random_gpu;
using tandem::bench::time_ms;
using tandem::ops::AttentionShape;

// Causal FLOPs of one forward call (the two products over the lower triangle: S = Q K^T over D,
// O = P V over Dv).
double forward_flops(const AttentionShape& s) {
  return 2.0 * double(s.batch) * double(s.heads) * double(s.seq) * double(s.seq) *
         double(s.head_dim + s.v_dim()) / 2.0;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {  // host f32 tensors of one shape
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  double mx = 0;
  for (int64_t i = 0; i < a.numel(); ++i) mx = std::max(mx, std::fabs(double(x[i]) - y[i]));
  return mx;
}

// The inputs and outputs of one shape, on the GPU.
struct Problem {
  AttentionShape s;
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
};
Problem make_problem(const AttentionShape& s) {
  const int64_t n = s.batch * s.seq, qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  const int64_t vw = s.kv_heads * s.v_dim(), ow = s.heads * s.v_dim();
  const auto gpu = [](const Shape& shape, DType dtype) {
    return Tensor::empty(shape, dtype, MemCategory::kOther, "bench", Device::kCUDA);
  };
  return {s,
          random_gpu({n, qw}, 1),
          random_gpu({n, kw}, 2),
          random_gpu({n, vw}, 3),
          random_gpu({n, ow}, 4),
          gpu({n, ow}, DType::kBF16),
          gpu({s.batch, s.heads, s.seq}, DType::kF32),
          gpu({n, qw}, DType::kBF16),
          gpu({n, kw}, DType::kBF16),
          gpu({n, vw}, DType::kBF16)};
}
void forward(const Problem& p) { tandem::ops::attention_forward(p.out, p.lse, p.q, p.k, p.v, p.s); }
void backward(const Problem& p) {
  tandem::ops::attention_backward(p.dq, p.dk, p.dv, p.dout, p.q, p.k, p.v, p.out, p.lse, p.s);
}

// One line per forward and per backward variant (Note [Attention variants] in attention_mma.cuh):
// time and TFLOP/s, and the largest difference of its outputs from variant 0's (a broken variant
// shows as a large one). Every backward runs on variant 0's out and lse.
void bench_variants(const char* label, const AttentionShape& s, int iters) {
  const Problem p = make_problem(s);
  const double fwd_flops = forward_flops(s), bwd_flops = 2.5 * fwd_flops;
  std::printf("shape %s: batch %lld seq %lld heads %lld kv %lld D %lld\n", label,
              static_cast<long long>(s.batch), static_cast<long long>(s.seq),
              static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads),
              static_cast<long long>(s.head_dim));
  const std::vector<const char*> fwd_names = attn::attention_forward_variant_names();
  Tensor ref_out, ref_lse;
  for (int i = 0; i < static_cast<int>(fwd_names.size()); ++i) {
    attn::select_attention_variants(i, 0);
    const double ms = time_ms(iters, [&] { forward(p); });
    const Tensor out = host_f32(p.out), lse = host_f32(p.lse);
    if (i == 0) ref_out = out, ref_lse = lse;
    std::printf("  %s fwd %d %-18s %8.3f ms %6.1f TFLOP/s | max|dO| %.2e max|dLSE| %.2e\n", label,
                i, fwd_names[size_t(i)], ms, fwd_flops / (ms * 1e9), max_abs_diff(out, ref_out),
                max_abs_diff(lse, ref_lse));
  }
  attn::select_attention_variants(0, 0);
  forward(p);  // variant 0's out and lse for every backward
  const std::vector<const char*> bwd_names = attn::attention_backward_variant_names();
  Tensor ref[3];
  for (int i = 0; i < static_cast<int>(bwd_names.size()); ++i) {
    attn::select_attention_variants(0, i);
    const double ms = time_ms(iters, [&] { backward(p); });
    const Tensor got[3] = {host_f32(p.dq), host_f32(p.dk), host_f32(p.dv)};
    if (i == 0) std::copy(std::begin(got), std::end(got), std::begin(ref));
    std::printf("  %s bwd %d %-18s %8.3f ms %6.1f TFLOP/s | max|d dQ| %.2e dK %.2e dV %.2e\n",
                label, i, bwd_names[size_t(i)], ms, bwd_flops / (ms * 1e9),
                max_abs_diff(got[0], ref[0]), max_abs_diff(got[1], ref[1]),
                max_abs_diff(got[2], ref[2]));
  }
  attn::select_attention_variants(-1, -1);
}

// The forward and backward of one shape, in the variants chosen now (by default index 0 of each
// table).
void bench_default(const AttentionShape& s, int iters) {
  const Problem p = make_problem(s);
  const double fwd_ms = time_ms(iters, [&] { forward(p); });
  const double bwd_ms = time_ms(iters, [&] { backward(p); });
  const double fwd_flops = forward_flops(s), bwd_flops = 2.5 * fwd_flops;
  std::printf(
      "batch %lld seq %lld heads %lld kv %lld D %lld Dv %lld | fwd %.3f ms %.1f TFLOP/s | "
      "bwd %.3f ms %.1f TFLOP/s\n",
      static_cast<long long>(s.batch), static_cast<long long>(s.seq),
      static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads),
      static_cast<long long>(s.head_dim), static_cast<long long>(s.v_dim()), fwd_ms,
      fwd_flops / (fwd_ms * 1e9), bwd_ms, bwd_flops / (bwd_ms * 1e9));
}

// bench_default at shape `s` under every entry but the default of one D 128 table (`select` picks
// one by index; the default's line is the one printed before), then back to the default.
void bench_d128_variants(const char* table, const std::vector<const char*>& names,
                         void (*select)(int), const AttentionShape& s, int iters) {
  for (int i = 1; i < static_cast<int>(names.size()); ++i) {
    select(i);
    std::printf("  %s %d %s: ", table, i, names[size_t(i)]);
    bench_default(s, iters);
  }
  select(-1);
}

// The `overlap` mode (see the top of the file): each pair serial on one stream, then the second
// of it issued on another stream beside the first (joined at the end).
void bench_overlap(int iters) {
  const AttentionShape d{1, 4096, 16, 16, 192, 128, 0.0722};
  const Problem p = make_problem(d);
  forward(p);
  const int64_t experts = 64, rows = 384, total = experts * rows, h = 2048, f = 1408;
  const Tensor x = random_gpu({total, h}, 11), act = random_gpu({total, f}, 12);
  const Tensor dy = random_gpu({total, h}, 13), dgu = random_gpu({total, 2 * f}, 14);
  std::vector<Tensor> g_gu, g_down;
  for (int64_t e = 0; e < experts; ++e) {
    g_gu.push_back(Tensor::zeros({2 * f, h}, DType::kF32, MemCategory::kOther, "g", Device::kCUDA));
    g_down.push_back(Tensor::zeros({h, f}, DType::kF32, MemCategory::kOther, "g", Device::kCUDA));
  }
  const auto wgrad = [&] {
    tandem::ops::Lanes l(x);
    for (int64_t e = 0; e < experts; ++e) {
      l.run(e, [&, e] {
        tandem::ops::linear_backward_weight(g_down[e], dy.narrow_rows(e * rows, rows),
                                            act.narrow_rows(e * rows, rows));
        tandem::ops::linear_backward_weight(g_gu[e], dgu.narrow_rows(e * rows, rows),
                                            x.narrow_rows(e * rows, rows));
      });
    }
    l.join();
  };
  const int64_t nw = 553000000 / 4;  // a quarter of one shape (d) MoE layer's expert weights
  const auto f32 = [](int64_t n, const char* t) {
    return Tensor::zeros({n}, DType::kF32, MemCategory::kOther, t, Device::kCUDA);
  };
  const Tensor pw = f32(nw, "p"), m = f32(nw, "m"), v = f32(nw, "v"), g = f32(nw, "g");
  const Tensor pb = Tensor::zeros({nw}, DType::kBF16, MemCategory::kOther, "pb", Device::kCUDA);
  const auto adam = [&] {
    tandem::ops::adamw_step_flat(pw, m, v, pb, g, {}, 1.0, {1e-3, 0.9, 0.95, 1e-8, 0.1, 1});
  };
  cudaStream_t side = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork = nullptr, done = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const auto beside = [&](const std::function<void()>& main_fn,
                          const std::function<void()>& side_fn) {
    const cudaStream_t cur = tandem::cuda::current_stream();
    TANDEM_CUDA_CHECK(cudaEventRecord(fork, cur));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
    {
      tandem::cuda::StreamScope on(side);
      side_fn();
    }
    main_fn();
    TANDEM_CUDA_CHECK(cudaEventRecord(done, side));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(cur, done, 0));
  };
  const auto bwd = [&] { backward(p); };
  const auto bwd2 = [&] {
    backward(p);
    backward(p);
  };
  const double a = time_ms(iters, bwd), w = time_ms(iters, wgrad), ad = time_ms(iters, adam);
  std::printf("overlap: attention backward %.3f ms, expert wgrad %.3f ms, adamw(%lld) %.3f ms\n", a,
              w, static_cast<long long>(nw), ad);
  std::printf("  attn bwd then wgrad serial %.3f | beside %.3f\n",
              time_ms(iters,
                      [&] {
                        bwd();
                        wgrad();
                      }),
              time_ms(iters, [&] { beside(bwd, wgrad); }));
  std::printf("  2 attn bwd then adamw serial %.3f | beside %.3f\n",
              time_ms(iters,
                      [&] {
                        bwd2();
                        adam();
                      }),
              time_ms(iters, [&] { beside(bwd2, adam); }));
  const auto fwd4 = [&] {
    for (int i = 0; i < 4; ++i) forward(p);
  };
  std::printf("  4 attn fwd %.3f, then adamw serial %.3f | beside %.3f\n", time_ms(iters, fwd4),
              time_ms(iters,
                      [&] {
                        fwd4();
                        adam();
                      }),
              time_ms(iters, [&] { beside(fwd4, adam); }));
  TANDEM_CUDA_CHECK(cudaEventDestroy(fork));
  TANDEM_CUDA_CHECK(cudaEventDestroy(done));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(side));
}

// Note [Attention document bounds] in attention_mma.cuh: the forward and backward of `s` within
// documents of `doc` tokens each (key_begin from Megatron's masks: each document's first
// position; `doc` >= seq: bounds of all zeros, the masking's own cost) against plain causal
// attention of the same tokens, with the ratio of their times.
void bench_documents(const char* label, const AttentionShape& s, int iters) {
  const Problem plain = make_problem(s);
  const double fwd0 = time_ms(iters, [&] { forward(plain); });
  const double bwd0 = time_ms(iters, [&] { backward(plain); });
  std::printf("shape %s: plain causal fwd %.3f ms bwd %.3f ms\n", label, fwd0, bwd0);
  for (const int64_t doc : {s.seq, s.seq / 2, int64_t{512}, int64_t{128}}) {
    std::vector<int32_t> begin(static_cast<size_t>(s.batch * s.seq));
    for (size_t r = 0; r < begin.size(); ++r) {
      const int64_t i = static_cast<int64_t>(r) % s.seq;
      begin[r] = static_cast<int32_t>(i / doc * doc);
    }
    Tensor host = Tensor::empty({s.batch * s.seq}, DType::kI32, MemCategory::kOther, "bench");
    std::copy(begin.begin(), begin.end(), host.data<int32_t>());
    Problem p = make_problem(s);
    p.s.key_begin = host.to(Device::kCUDA);
    const double fwd = time_ms(iters, [&] { forward(p); });
    const double bwd = time_ms(iters, [&] { backward(p); });
    std::printf("  %s documents of %5lld: fwd %.3f ms (x%.3f) bwd %.3f ms (x%.3f) both x%.3f\n",
                label, static_cast<long long>(doc), fwd, fwd / fwd0, bwd, bwd / bwd0,
                (fwd + bwd) / (fwd0 + bwd0));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    const bool overlap = argc > 2 && std::string(argv[2]) == "overlap";
    const bool documents = argc > 2 && std::string(argv[2]) == "documents";
    if (iters < 1 || (argc > 2 && !overlap && !documents)) {
      std::fprintf(stderr, "usage: attention_timing [iterations >= 1] [overlap | documents]\n");
      return 2;
    }
    tandem::cuda::initialize(0);
    if (overlap) {
      bench_overlap(iters);
      return 0;
    }
    if (documents) {
      std::printf("GPU: %s, %d iterations\n", tandem::cuda::device_description().c_str(), iters);
      bench_documents("b", {2, 2048, 16, 8, 64}, iters);
      bench_documents("c", {1, 4096, 32, 4, 128}, iters);
      bench_documents("d", {1, 4096, 16, 16, 192, 128, 0.0722}, iters);
      return 0;
    }
    std::printf("GPU: %s, %d iterations\n", tandem::cuda::device_description().c_str(), iters);
    bench_variants("a", {8, 1024, 12, 12, 64}, iters);
    bench_variants("b", {2, 2048, 16, 8, 64}, iters);
    bench_default({4, 1024, 16, 16, 128}, iters);  // D 128 (the other tensor-core path)
    const AttentionShape c{1, 4096, 32, 4, 128};   // shape (c)'s: Qwen3-MoE's heads
    const AttentionShape d{1, 4096, 16, 16, 192, 128, 0.0722};  // shape (d)'s: MLA
    const std::vector<const char*> fwd128 = attn::attention_forward128_variant_names();
    bench_default(c, iters);
    bench_d128_variants("D 128 forward", fwd128, attn::select_attention_forward128_variant, c,
                        iters);
    bench_d128_variants("D 128 backward", attn::attention_backward128_variant_names(),
                        attn::select_attention_backward128_variant, c, iters);
    bench_default(d, iters);
    bench_d128_variants("D 192/128 forward", fwd128, attn::select_attention_forward128_variant, d,
                        iters);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_timing: %s\n", e.what());
    return 1;
  }
}
