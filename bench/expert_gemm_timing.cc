// Times the experts' products of shape (b) (gate and up: H 1024 -> 2F 5632; down: F 2816 ->
// H) with CUDA events, the way the experts node runs them and the ways it could: one product per
// expert in order on one stream; one per expert on lanes (Note [Lanes] in src/ops/ops.h, what
// the node does); on lanes with each lane given about the same rows, an expert's rows cut where
// a lane fills up; one cuBLAS grouped call for all experts (cublasGemmGroupedBatchedEx); one
// batched call (cublasGemmBatchedEx) of n rows an expert, for n the largest count (reading past
// an expert's rows, into padding), the mean, the smallest and the smallest rounded down to 64
// and 32 (timing only); the grouped op as the experts node calls it
// (Note [Batched bulk of the experts' products]); and one product over every row with a single
// expert's weights (the rate of one large product: an upper bound). Rows per expert even (EP2's 4
// experts or one GPU's 8 at 1,024 rows) and uneven (a busier rank's). Each variant's output is
// checked against the in-order products. Beside the GPU's time, the host's time to issue the
// in-order products, the grouped and batched calls and the op (host_issue_ms in cuda_timing.h),
// and, at shape (c), the op's host time when every call brings row counts it has not met (as
// training does). Standalone (no Google Benchmark): `expert_gemm_timing [iterations] [c]`.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda_timing.h"
#include "ops/ops.h"

namespace {

using tandem::Device;
using tandem::DType;
using tandem::MemCategory;
using tandem::Shape;
using tandem::Tensor;
using tandem::bench::host_f32;
using tandem::bench::host_issue_ms;
using tandem::bench::random_gpu;
using tandem::bench::time_ms;

constexpr int kWarmup = 2;  // calls before the timed ones

#define CUBLAS_OK(call)                                                              \
  do {                                                                               \
    const cublasStatus_t st_ = (call);                                               \
    TANDEM_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #call, " failed: status ", int(st_)); \
  } while (0)

// Largest |a - b| over |b|'s largest, on the host.
double max_rel_diff(const Tensor& a, const Tensor& b) {
  const Tensor x = host_f32(a), y = host_f32(b);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    diff = std::fmax(diff, std::fabs(double(x.data<float>()[i]) - y.data<float>()[i]));
    scale = std::fmax(scale, std::fabs(double(y.data<float>()[i])));
  }
  return diff / std::fmax(scale, 1e-30);
}

// Each lane a contiguous run of about total / lanes rows, an expert's rows cut where a lane
// fills up (at a multiple of 128 rows): {lane, expert, first row, rows} per piece.
struct Piece {
  int64_t lane, expert, begin, rows;
};
std::vector<Piece> balanced_pieces(const std::vector<int64_t>& rows, int64_t lanes) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const int64_t target = ((total + lanes - 1) / lanes + 127) / 128 * 128;
  std::vector<Piece> out;
  int64_t lane = 0, room = target, begin = 0;
  for (int64_t e = 0; e < static_cast<int64_t>(rows.size()); ++e) {
    int64_t left = rows[e];
    while (left > 0) {
      const int64_t take = lane == lanes - 1 ? left : std::min(left, room);
      out.push_back({lane, e, begin, take});
      begin += take;
      left -= take;
      room -= take;
      if (room <= 0 && lane < lanes - 1) {
        ++lane;
        room = target;
      }
    }
  }
  return out;
}

// y [R, out] = x [R, in] @ W_e^T per expert's rows.
void bench_case(const char* name, const std::vector<int64_t>& rows, int64_t in, int64_t out_dim,
                int iters, cublasHandle_t blas) {
  const int64_t experts = static_cast<int64_t>(rows.size());
  int64_t total = 0;
  std::vector<int64_t> begin;
  for (int64_t r : rows) {
    begin.push_back(total);
    total += r;
  }
  const Tensor x = random_gpu({total, in}, 1);
  std::vector<Tensor> w;
  for (int64_t e = 0; e < experts; ++e) w.push_back(random_gpu({out_dim, in}, 10 + e));
  auto out = [&] {
    return Tensor::zeros({total, out_dim}, DType::kBF16, MemCategory::kOther, "y", Device::kCUDA);
  };
  const Tensor ref = out(), lanes_y = out(), grouped_y = out(), one_y = out();
  const double flops = 2.0 * double(total) * double(in) * double(out_dim);
  auto report = [&](const char* how, double ms, double diff) {
    std::printf("  %-30s %8.3f ms %7.1f TFLOP/s  max rel diff %.2e\n", how, ms, flops / (ms * 1e9),
                diff);
  };
  // The host's time to issue one call (Note in cuda_timing.h's host_issue_ms): where it
  // exceeds the GPU's, a node issued with the GPU idle runs at the host's pace.
  auto host_report = [&](const char* how, double ms) {
    std::printf("  %-30s %8.3f ms on the host to issue\n", how, ms);
  };
  std::printf("%s, [R, %lld] @ [%lld, %lld]^T: %lld experts, rows", name,
              static_cast<long long>(in), static_cast<long long>(out_dim),
              static_cast<long long>(in), static_cast<long long>(experts));
  for (int64_t r : rows) std::printf(" %lld", static_cast<long long>(r));
  std::printf(" (%lld)\n", static_cast<long long>(total));

  const auto in_order_call = [&] {
    for (int64_t e = 0; e < experts; ++e)
      tandem::ops::linear_forward(ref.narrow_rows(begin[e], rows[e]),
                                  x.narrow_rows(begin[e], rows[e]), w[e]);
  };
  report("per expert, in order", time_ms(iters, in_order_call, kWarmup), 0);
  // At most 5 calls: 128 launches each would otherwise fill the stream's queue, which the
  // host then waits on.
  host_report("per expert, in order", host_issue_ms(std::min(iters, 5), in_order_call));

  const double lanes = time_ms(
      iters,
      [&] {
        tandem::ops::Lanes l(x);
        for (int64_t e = 0; e < experts; ++e) {
          l.run(e, [&, e] {
            tandem::ops::linear_forward(lanes_y.narrow_rows(begin[e], rows[e]),
                                        x.narrow_rows(begin[e], rows[e]), w[e]);
          });
        }
        l.join();
      },
      kWarmup);
  report("per expert, lanes", lanes, max_rel_diff(lanes_y, ref));

  // The same pieces issued largest first: lane = position % lanes (what the node could do), and
  // each next largest on the lane with the fewest rows so far (longest processing time first).
  std::vector<int64_t> by_rows(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) by_rows[static_cast<size_t>(e)] = e;
  std::stable_sort(by_rows.begin(), by_rows.end(),
                   [&](int64_t a, int64_t b) { return rows[a] > rows[b]; });
  const int lane_count = tandem::ops::Lanes::count();
  for (const bool lpt : {false, true}) {
    const Tensor y = out();
    const double ms = time_ms(
        iters,
        [&] {
          tandem::ops::Lanes l(x);
          std::vector<int64_t> load(static_cast<size_t>(lane_count), 0);
          for (size_t i = 0; i < by_rows.size(); ++i) {
            const int64_t e = by_rows[i];
            int64_t lane = static_cast<int64_t>(i) % lane_count;
            if (lpt) lane = std::min_element(load.begin(), load.end()) - load.begin();
            load[static_cast<size_t>(lane)] += rows[e];
            l.run(lane, [&, e] {
              tandem::ops::linear_forward(y.narrow_rows(begin[e], rows[e]),
                                          x.narrow_rows(begin[e], rows[e]), w[e]);
            });
          }
          l.join();
        },
        kWarmup);
    report(lpt ? "lanes, largest first, LPT" : "lanes, largest first", ms, max_rel_diff(y, ref));
  }

  const std::vector<Piece> pieces = balanced_pieces(rows, tandem::ops::Lanes::count());
  const Tensor balanced_y = out();
  const double balanced = time_ms(
      iters,
      [&] {
        tandem::ops::Lanes l(x);
        for (const Piece& p : pieces) {
          l.run(p.lane, [&, p] {
            tandem::ops::linear_forward(balanced_y.narrow_rows(p.begin, p.rows),
                                        x.narrow_rows(p.begin, p.rows), w[p.expert]);
          });
        }
        l.join();
      },
      kWarmup);
  report(("lanes, rows balanced (" + std::to_string(pieces.size()) + " pieces)").c_str(), balanced,
         max_rel_diff(balanced_y, ref));

  // Grouped: column-major Y^T[2F, R_e] = W_e'^T (W_e row-major [2F, H] is column-major
  // [H, 2F]) times X_e^T (column-major [H, R_e]), each expert its own group.
  const auto count = static_cast<size_t>(experts);
  std::vector<cublasOperation_t> ta(count, CUBLAS_OP_T), tb(count, CUBLAS_OP_N);
  std::vector<int> m(count, int(out_dim)), n(count), k(count, int(in)), one(count, 1);
  std::vector<int> lda(count, int(in)), ldb(count, int(in)), ldc(count, int(out_dim));
  std::vector<float> alpha(count, 1.0f), beta(count, 0.0f);
  std::vector<const void*> a_host(count), b_host(count);
  std::vector<void*> c_host(count);
  for (size_t e = 0; e < count; ++e) {
    n[e] = int(rows[e]);
    a_host[e] = w[e].raw_data();
    b_host[e] = x.narrow_rows(begin[e], rows[e]).raw_data();
    c_host[e] = grouped_y.narrow_rows(begin[e], rows[e]).raw_data();
  }
  void** ptrs = nullptr;  // A, B and C pointer arrays, back to back
  TANDEM_CUDA_CHECK(cudaMalloc(&ptrs, 3 * count * sizeof(void*)));
  std::vector<const void*> all(a_host);
  all.insert(all.end(), b_host.begin(), b_host.end());
  for (void* c : c_host) all.push_back(c);
  TANDEM_CUDA_CHECK(
      cudaMemcpy(ptrs, all.data(), all.size() * sizeof(void*), cudaMemcpyHostToDevice));
  CUBLAS_OK(cublasSetStream(blas, tandem::cuda::current_stream()));
  const auto grouped_call = [&] {
    CUBLAS_OK(cublasGemmGroupedBatchedEx(
        blas, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
        reinterpret_cast<const void* const*>(ptrs), CUDA_R_16BF, lda.data(),
        reinterpret_cast<const void* const*>(ptrs + count), CUDA_R_16BF, ldb.data(), beta.data(),
        ptrs + 2 * count, CUDA_R_16BF, ldc.data(), int(experts), one.data(), CUBLAS_COMPUTE_32F));
  };
  report("cuBLAS grouped", time_ms(iters, grouped_call, kWarmup), max_rel_diff(grouped_y, ref));
  host_report("cuBLAS grouped", host_issue_ms(iters, grouped_call));
  TANDEM_CUDA_CHECK(cudaFree(ptrs));

  // Batched (one shape for every expert, cublasGemmBatchedEx): n rows each, read from the
  // expert's first row on (past its rows into the next expert's: the extra output rows are
  // padding in an output of experts x n rows); n the largest count (every row covered), the
  // mean, the smallest and the smallest rounded down to 64 and 32 (the op's batched bulk is one
  // of these). Timing only.
  int64_t least = rows[0];
  for (int64_t r : rows) least = std::min(least, r);
  for (const int64_t variant :
       {int64_t{-1}, int64_t{-2}, least, least / 64 * 64, least / 32 * 32}) {
    const bool pad_to_max = variant == -1;
    int64_t nb = 0;
    for (int64_t r : rows) nb = pad_to_max ? std::max(nb, r) : nb + r;
    if (variant == -2) nb /= experts;
    if (variant >= 0) nb = variant;
    if (nb <= 0) continue;
    const Tensor xp = random_gpu({total + nb, in}, 2);
    const Tensor yp = Tensor::zeros({experts * nb, out_dim}, DType::kBF16, MemCategory::kOther,
                                    "yp", Device::kCUDA);
    std::vector<const void*> bp;
    for (size_t e = 0; e < count; ++e) bp.push_back(a_host[e]);
    for (size_t e = 0; e < count; ++e) bp.push_back(xp.narrow_rows(begin[e], nb).raw_data());
    for (size_t e = 0; e < count; ++e)
      bp.push_back(yp.narrow_rows(static_cast<int64_t>(e) * nb, nb).raw_data());
    void** bptrs = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&bptrs, 3 * count * sizeof(void*)));
    TANDEM_CUDA_CHECK(
        cudaMemcpy(bptrs, bp.data(), bp.size() * sizeof(void*), cudaMemcpyHostToDevice));
    const float one_f = 1.0f, zero_f = 0.0f;
    const auto batched_call = [&] {
      CUBLAS_OK(
          cublasGemmBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(out_dim), int(nb), int(in),
                              &one_f, reinterpret_cast<const void* const*>(bptrs), CUDA_R_16BF,
                              int(in), reinterpret_cast<const void* const*>(bptrs + count),
                              CUDA_R_16BF, int(in), &zero_f, bptrs + 2 * count, CUDA_R_16BF,
                              int(out_dim), int(experts), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    const double batched = time_ms(iters, batched_call, kWarmup);
    const std::string label = "batched, n = " + std::to_string(nb);
    host_report(label.c_str(), host_issue_ms(iters, batched_call));
    // Its own rate: experts x n rows in the time, padding or not.
    std::printf("  %-30s %8.3f ms %7.1f TFLOP/s  (experts x %lld rows)\n", label.c_str(), batched,
                2.0 * double(experts * nb) * double(in) * double(out_dim) / (batched * 1e9),
                static_cast<long long>(nb));
    TANDEM_CUDA_CHECK(cudaFree(bptrs));
  }

  {
    std::vector<int32_t> rows32(rows.begin(), rows.end());
    const Tensor op_y = out();
    const auto op_call = [&] { tandem::ops::grouped_linear_forward(op_y, x, w, rows32); };
    report("grouped op (bulk + rest)", time_ms(iters, op_call, kWarmup), max_rel_diff(op_y, ref));
    host_report("grouped op (bulk + rest)", host_issue_ms(iters, op_call));
  }
  const double single = time_ms(
      iters, [&] { tandem::ops::linear_forward(one_y, x, w[0]); }, kWarmup);
  report("one product, all rows", single, -1);
}

// Rows per expert as a router deals `total` rows to `experts` (draw `seed`): uniformly, or
// skewed towards the first experts (u^2).
std::vector<int64_t> routed_rows(int64_t experts, int64_t total, uint64_t seed, bool skewed) {
  std::vector<int64_t> rows(static_cast<size_t>(experts), 0);
  uint64_t state = seed;
  for (int64_t i = 0; i < total; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(state >> 11) / 9007199254740992.0;
    rows[static_cast<size_t>(static_cast<double>(experts) * (skewed ? u * u : u))] += 1;
  }
  return rows;
}

// The grouped op as training calls it: every call with rows per expert it has not seen before
// (each micro-batch and layer routes afresh), then the same counts again. The host's time to
// issue a call with new counts is what the GPU waits for when the experts' node starts with
// nothing queued (Note [Routing counts on the host] in src/model/nodes.h).
void bench_varying_counts(const char* name, int64_t experts, int64_t total, int64_t in,
                          int64_t out_dim, int iters) {
  const Tensor x = random_gpu({total, in}, 1);
  std::vector<Tensor> w;
  for (int64_t e = 0; e < experts; ++e) w.push_back(random_gpu({out_dim, in}, 10 + e));
  const Tensor y =
      Tensor::zeros({total, out_dim}, DType::kBF16, MemCategory::kOther, "y", Device::kCUDA);
  static uint64_t next_seed = 1000;  // fresh counts for every call of every case
  std::vector<std::vector<int32_t>> sets;
  for (int i = 0; i < iters + 1; ++i) {
    const std::vector<int64_t> r = routed_rows(experts, total, next_seed++, false);
    sets.emplace_back(r.begin(), r.end());
  }
  size_t at = 0;
  auto call = [&] { tandem::ops::grouped_linear_forward(y, x, w, sets[at++ % sets.size()]); };
  const double fresh = host_issue_ms(iters, call);  // its first call (set 0) is the warm-up
  at = 0;
  const double again = host_issue_ms(iters, call);
  at = 0;
  const double gpu = time_ms(iters, call, 0);
  std::printf(
      "%s, [R, %lld] @ [%lld, %lld]^T, counts new each call: host %.3f ms to issue "
      "(the same counts again: %.3f ms), GPU %.3f ms a call\n",
      name, static_cast<long long>(in), static_cast<long long>(out_dim), static_cast<long long>(in),
      fresh, again, gpu);
}

// Shape (d)'s experts' weight gradients (64 experts, H 2048, F 1408, top-6 of 4,096 tokens:
// 24,576 rows a micro-batch, about 384 an expert) over a global batch of 8 micro-batches: one
// product per expert and micro-batch added into the f32 gradients (the W node), against the rows
// of `merge` micro-batches gathered expert-major (copy_row_blocks) and summed in one product per
// expert (K `merge` times as long, so the f32 gradient is read and written `merge` times less).
void bench_wgrad_merge(int iters) {
  constexpr int64_t kExperts = 64, kH = 2048, kF = 1408, kRows = 24576, kMicro = 8;
  struct Micro {
    std::vector<int64_t> rows, begin;
    Tensor x, act, dy, dgu;
  };
  std::vector<Micro> mbs(kMicro);
  for (int64_t j = 0; j < kMicro; ++j) {
    Micro& m = mbs[j];
    m.rows = routed_rows(kExperts, kRows, 777 + j, false);
    int64_t at = 0;
    for (int64_t r : m.rows) {
      m.begin.push_back(at);
      at += r;
    }
    m.x = random_gpu({kRows, kH}, 100 + 4 * j);
    m.act = random_gpu({kRows, kF}, 101 + 4 * j);
    m.dy = random_gpu({kRows, kH}, 102 + 4 * j);
    m.dgu = random_gpu({kRows, 2 * kF}, 103 + 4 * j);
  }
  auto grads = [&] {
    std::vector<Tensor> g;
    for (int64_t e = 0; e < kExperts; ++e) {
      g.push_back(Tensor::zeros({kH, kF}, DType::kF32, MemCategory::kOther, "gd", Device::kCUDA));
      g.push_back(
          Tensor::zeros({2 * kF, kH}, DType::kF32, MemCategory::kOther, "ggu", Device::kCUDA));
    }
    return g;
  };
  // Expert e's products over rows [begin, begin + rows) of (dy, act, dgu, x).
  auto products = [&](std::vector<Tensor>& g, const Tensor& dy, const Tensor& act,
                      const Tensor& dgu, const Tensor& x, const std::vector<int64_t>& rows,
                      const std::vector<int64_t>& begin, tandem::ops::Accumulate acc) {
    tandem::ops::Lanes l(x);
    for (int64_t e = 0; e < kExperts; ++e) {
      if (rows[e] == 0) continue;
      l.run(e, [&, e] {
        tandem::ops::linear_backward_weight(g[2 * e], dy.narrow_rows(begin[e], rows[e]),
                                            act.narrow_rows(begin[e], rows[e]), acc);
        tandem::ops::linear_backward_weight(g[2 * e + 1], dgu.narrow_rows(begin[e], rows[e]),
                                            x.narrow_rows(begin[e], rows[e]), acc);
      });
    }
    l.join();
  };
  const double flops = 2.0 * double(kRows * kMicro) * double(kH) * double(3 * kF);
  std::vector<Tensor> ref = grads();
  const double per_micro = time_ms(
      iters,
      [&] {
        for (int64_t j = 0; j < kMicro; ++j) {
          products(ref, mbs[j].dy, mbs[j].act, mbs[j].dgu, mbs[j].x, mbs[j].rows, mbs[j].begin,
                   j == 0 ? tandem::ops::Accumulate::kOverwrite : tandem::ops::Accumulate::kAdd);
        }
      },
      1);
  std::printf("shape (d) experts' weight gradients, 8 micro-batches of %lld rows:\n",
              static_cast<long long>(kRows));
  std::printf("  %-34s %8.3f ms %7.1f TFLOP/s\n", "per micro-batch (the W node)", per_micro,
              flops / (per_micro * 1e9));
  for (const int64_t merge : {2, 4, 8}) {
    auto scratch = [&](int64_t width) {
      return Tensor::empty({kRows * merge, width}, DType::kBF16, MemCategory::kOther, "m",
                           Device::kCUDA);
    };
    const Tensor x = scratch(kH), act = scratch(kF), dy = scratch(kH), dgu = scratch(2 * kF);
    std::vector<Tensor> g = grads();
    // Per group: each micro-batch's expert blocks placed after the group's earlier ones.
    struct Group {
      std::vector<int64_t> rows, begin;
      std::vector<std::vector<tandem::ops::RowBlock>> blocks;  // per micro-batch of the group
    };
    std::vector<Group> groups;
    for (int64_t j0 = 0; j0 < kMicro; j0 += merge) {
      Group grp;
      grp.rows.assign(kExperts, 0);
      for (int64_t j = j0; j < j0 + merge; ++j)
        for (int64_t e = 0; e < kExperts; ++e) grp.rows[e] += mbs[j].rows[e];
      int64_t at = 0;
      for (int64_t r : grp.rows) {
        grp.begin.push_back(at);
        at += r;
      }
      std::vector<int64_t> fill = grp.begin;
      for (int64_t j = j0; j < j0 + merge; ++j) {
        std::vector<tandem::ops::RowBlock> b;
        for (int64_t e = 0; e < kExperts; ++e) {
          if (mbs[j].rows[e] == 0) continue;
          b.push_back({mbs[j].begin[e], fill[e], mbs[j].rows[e]});
          fill[e] += mbs[j].rows[e];
        }
        grp.blocks.push_back(std::move(b));
      }
      groups.push_back(std::move(grp));
    }
    double gather_ms = 0;
    auto gather = [&](const Group& grp, int64_t j0) {
      for (int64_t i = 0; i < merge; ++i) {
        const Micro& m = mbs[j0 + i];
        tandem::ops::copy_row_blocks(x, m.x, grp.blocks[i]);
        tandem::ops::copy_row_blocks(act, m.act, grp.blocks[i]);
        tandem::ops::copy_row_blocks(dy, m.dy, grp.blocks[i]);
        tandem::ops::copy_row_blocks(dgu, m.dgu, grp.blocks[i]);
      }
    };
    gather_ms = time_ms(
        iters,
        [&] {
          for (size_t q = 0; q < groups.size(); ++q) gather(groups[q], int64_t(q) * merge);
        },
        1);
    const double total = time_ms(
        iters,
        [&] {
          for (size_t q = 0; q < groups.size(); ++q) {
            gather(groups[q], int64_t(q) * merge);
            products(g, dy, act, dgu, x, groups[q].rows, groups[q].begin,
                     q == 0 ? tandem::ops::Accumulate::kOverwrite : tandem::ops::Accumulate::kAdd);
          }
        },
        1);
    double diff = 0;
    for (int64_t e : {0, 31, 63})
      for (int k = 0; k < 2; ++k)
        diff = std::fmax(diff, max_rel_diff(g[2 * e + k], ref[2 * e + k]));
    char how[64];
    std::snprintf(how, sizeof how, "merged by %lld (gather %.3f ms)", static_cast<long long>(merge),
                  gather_ms);
    std::printf("  %-34s %8.3f ms %7.1f TFLOP/s  max rel diff %.2e\n", how, total,
                flops / (total * 1e9), diff);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
    if (iters < 1) {
      std::fprintf(stderr,
                   "usage: expert_gemm_timing [iterations >= 1] [c: shape (c) only | wgrad]\n");
      return 2;
    }
    tandem::cuda::initialize(0);
    std::printf("GPU: %s, %d iterations\n", tandem::cuda::device_description().c_str(), iters);
    cublasHandle_t blas = nullptr;
    CUBLAS_OK(cublasCreate(&blas));
    const std::vector<std::pair<const char*, std::vector<int64_t>>> cases = {
        {"EP2 rank, even", {1024, 1024, 1024, 1024}},
        {"EP2 rank, uneven", {1600, 700, 1350, 1266}},
        {"EP2 rank, one hot expert", {2400, 500, 800, 700}},
        {"EP2 busier rank, 16k rows", {8200, 4100, 2700, 1245}},
        {"EP2 busier rank, hot last", {1245, 2700, 4100, 8200}},
        {"one GPU, even", std::vector<int64_t>(8, 1024)},
        {"one GPU, uneven", {1600, 700, 1350, 1266, 900, 1100, 300, 976}}};
    const bool only_c = argc > 2 && std::string(argv[2]) == "c";
    if (argc > 2 && std::string(argv[2]) == "wgrad") {
      bench_wgrad_merge(iters);
      CUBLAS_OK(cublasDestroy(blas));
      return 0;
    }
    if (!only_c) {
      for (const auto& [name, rows] : cases) {
        bench_case(name, rows, 1024, 2 * 2816, iters, blas);  // gate and up
        bench_case(name, rows, 2816, 1024, iters, blas);      // down
      }
    }
    bench_varying_counts("shape (c), uniform", 128, 32768, 2048, 2 * 768, iters);
    bench_varying_counts("shape (c), uniform", 128, 32768, 768, 2048, iters);
    // Shape (c): 128 experts of width 768, 32,768 routed rows (4,096 tokens, top-8), rows per
    // expert as a uniform router deals them (a fixed draw) and as a skewed one.
    for (const bool skewed : {false, true}) {
      const std::vector<int64_t> rows = routed_rows(128, 32768, 12345, skewed);
      const char* name = skewed ? "shape (c), skewed" : "shape (c), uniform";
      bench_case(name, rows, 2048, 2 * 768, iters, blas);  // gate and up
      bench_case(name, rows, 768, 2048, iters, blas);      // down
    }
    CUBLAS_OK(cublasDestroy(blas));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expert_gemm_timing: %s\n", e.what());
    return 1;
  }
}
