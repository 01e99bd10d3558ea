// cuBLASLt behind gemm.h: the row-major to column-major mapping, the per-shape plan cache
// (Note [GEMM plan cache]) and the matrix-rate measurement of the benchmark.
#include "ops/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <compare>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/wait.h"
#include "core/tensor.h"
#include "core/tuning.h"

namespace tandem::ops::cuda {

namespace {

// Note [GEMM plan cache]: a plan (the matmul descriptor, the three layouts and the algorithm
// cuBLASLt's heuristic picked) depends on the dtypes, transposes, sizes, leading dimensions,
// whether C is read (beta != 0) and the operands' pointer alignment (the heuristic may only pick
// kernels whose alignment needs the pointers meet; a view into the middle of a tensor can be
// 2-byte aligned). Plans are immutable once built and shared by pointer, so a lookup holds the
// mutex only for the map access and cublasLtMatmul runs unlocked. Sizes that vary per step
// (expert row counts) could grow the map without bound: past kMaxPlans it is cleared and
// refilled (in-flight users keep their plan alive).
// Note [Algorithm buckets]: expert row counts change every step, and a heuristic query costs
// tens of microseconds, thousands of them a step for a MoE model. So the algorithm is chosen
// once per bucket of the varying sizes (m and k, and a gemm_batched's batch count, rounded up to
// a power of two, at least 64) and reused for every exact shape in the bucket; a new exact shape
// then costs only its layouts.
// Should cuBLASLt reject a bucket's algorithm for some exact shape, that shape gets its own
// heuristic query and the product is retried (run_product below).
constexpr size_t kMaxPlans = 4096;

// Note [Tuned algorithms]: cuBLASLt's heuristic ranks its candidates by a model of the GPU, and
// for the narrow products of small layers (a 768-wide weight gradient fills only part of the
// chip) its first choice is often not the fastest. So when a shape (or a bucket) is first met,
// up to kTuneCandidates of its candidates run on the call's own operands into scratch outputs,
// a few times each under CUDA events, and the fastest is kept. Only candidates whose output is
// bit for bit the first choice's may win: a run's numbers do not depend on timing noise, and
// every layout and schedule still reproduces the single-rank run exactly. Outputs above
// kTuneMaxBytes (the LM head's logits block) keep the first choice (the scratch would cost
// memory), as do products with --gemm-tune=false. The outputs are compared on the GPU and the
// host waits once for all the candidates, so a tuning costs about its candidates' runs, not a
// copy of every candidate's output to the host and a wait for each: a later step that meets a
// new bucket (an expert's rows past a power of two) pays little for it.
constexpr int kTuneCandidates = 8;
constexpr int kTuneRuns = 3;
constexpr int64_t kTuneMaxBytes = int64_t{160} << 20;

struct GemmKey {
  DType c_dtype;
  Trans trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  bool reads_c;
  uint32_t align_a, align_b, align_c;
  int64_t batch = 0;  // > 0: that many products through pointer arrays (gemm_batched)
  auto operator<=>(const GemmKey&) const = default;
};

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  // cuBLASLt's operands: `first` is our B, `second` our A (see make_plan); `c` serves C and D.
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool from_bucket =
      false;  // algo chosen for another shape of its bucket (Note [Algorithm buckets])

  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    // Destruction cannot fail in a way we could act on; statuses are ignored.
    if (c) (void)cublasLtMatrixLayoutDestroy(c);
    if (second) (void)cublasLtMatrixLayoutDestroy(second);
    if (first) (void)cublasLtMatrixLayoutDestroy(first);
    if (op) (void)cublasLtMatmulDescDestroy(op);
  }
};

struct PlanCache {
  std::mutex mutex;
  std::map<GemmKey, std::shared_ptr<const GemmPlan>> plans;
  std::map<GemmKey, cublasLtMatmulAlgo_t> bucket_algos;  // Note [Algorithm buckets]
};

int64_t bucket_size(int64_t v) {
  int64_t b = 64;
  while (b < v) b *= 2;
  return b;
}

// The key under which `key`'s algorithm is shared: sizes bucketed, leading dimensions dropped
// to the bucket too (they follow the sizes for contiguous operands).
GemmKey bucket_key(const GemmKey& key) {
  GemmKey b = key;
  b.m = bucket_size(key.m);
  b.k = bucket_size(key.k);
  if (key.batch > 0) b.batch = bucket_size(key.batch);
  b.lda = b.ldb = b.ldc = 0;
  return b;
}

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // never destroyed: outlives every static caller
  return *cache;
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing `p`.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t low = a & (~a + 1);
  return (low == 0 || low > 256) ? 256u : static_cast<uint32_t>(low);
}

cudaDataType_t cuda_dtype(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, T value) {
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// The workspace a product's kernels may use: the stream's, past the pointer arrays for a
// gemm_batched (kPointerArrayBytes in gemm.h).
size_t workspace_bytes(const GemmKey& key) {
  return tandem::cuda::cublaslt_workspace_bytes() - (key.batch > 0 ? kPointerArrayBytes : 0);
}

// The heuristic's candidates for `plan` under `key`'s alignment, best first (at most `count`);
// throws when none fits.
std::vector<cublasLtMatmulAlgo_t> candidate_algos(GemmPlan& plan, const GemmKey& key, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)>
      guard(pref, &cublasLtMatmulPreferenceDestroy);
  set_pref<uint64_t>(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes(key));
  // A split-k reduction "in place" or "in the output type" would round partial sums to bf16.
  if (key.c_dtype == DType::kBF16) {
    set_pref<uint32_t>(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                       CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  }
  set_pref<uint32_t>(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  set_pref<uint32_t>(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_pref<uint32_t>(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref<uint32_t>(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(tandem::cuda::cublaslt_handle(), plan.op,
                                                     plan.first, plan.second, plan.c, plan.c, pref,
                                                     count, results.data(), &found));
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i].algo);
  }
  TANDEM_CHECK(!algos.empty(), "gemm: cuBLASLt has no algorithm for m=", key.m, " n=", key.n,
               " k=", key.k, " (trans_a ", key.trans_a == Trans::kYes, ", trans_b ",
               key.trans_b == Trans::kYes, ", lda ", key.lda, ", ldb ", key.ldb, ", ldc ", key.ldc,
               ", C ", dtype_name(key.c_dtype), ", alignment ", key.align_a, "/", key.align_b, "/",
               key.align_c, " bytes)");
  return algos;
}

// The operands of the call that builds a plan, for tuning it on them (Note [Tuned algorithms]).
struct TuneCall {
  const void* a;
  const void* b;
  const void* c;
  float alpha, beta;
};

bool tuning_enabled() { return tuning().gemm_tune; }  // --gemm-tune

// Runs every candidate on the call's operands into scratch outputs and keeps the fastest of
// those whose output equals the first candidate's bit for bit (Note [Tuned algorithms]).
cublasLtMatmulAlgo_t tune(const GemmPlan& plan, const GemmKey& key,
                          const std::vector<cublasLtMatmulAlgo_t>& algos, const TuneCall& call) {
  const int64_t bytes = key.m * key.ldc * dtype_size(key.c_dtype);
  if (algos.size() < 2 || bytes > kTuneMaxBytes || !tuning_enabled()) return algos.front();
  const cudaStream_t stream = tandem::cuda::current_stream();
  const int64_t words = (bytes + 3) / 4;
  // Zeroed, so the padding past n in each row compares equal too.
  const Tensor reference = Tensor::zeros({words}, DType::kI32, MemCategory::kOther,
                                         "gemm.tune.reference", Device::kCUDA);
  const Tensor trial =
      Tensor::zeros({words}, DType::kI32, MemCategory::kOther, "gemm.tune.trial", Device::kCUDA);
  const auto n = static_cast<int64_t>(algos.size());
  // Each candidate's count of words differing from the first choice's output, compared on the
  // GPU: the host copies n counts, not n outputs, and waits once for all the candidates.
  const Tensor differing =
      Tensor::zeros({n}, DType::kI32, MemCategory::kOther, "gemm.tune.differing", Device::kCUDA);
  auto run = [&](const cublasLtMatmulAlgo_t& algo, const Tensor& d) {
    return cublasLtMatmul(tandem::cuda::cublaslt_handle(), plan.op, &call.alpha, call.b, plan.first,
                          call.a, plan.second, &call.beta, call.c, plan.c, d.raw_data(), plan.c,
                          &algo, tandem::cuda::cublaslt_workspace(stream),
                          tandem::cuda::cublaslt_workspace_bytes(), stream);
  };
  if (run(algos.front(), reference) != CUBLAS_STATUS_SUCCESS) return algos.front();
  std::vector<cudaEvent_t> marks(static_cast<size_t>(2 * n), nullptr);
  for (cudaEvent_t& e : marks) TANDEM_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<bool> ran(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n; ++i) {
    const cublasLtMatmulAlgo_t& algo = algos[static_cast<size_t>(i)];
    if (run(algo, trial) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up, and the output to compare
    count_differing_words(reference.raw_data(), trial.raw_data(), words,
                          static_cast<uint32_t*>(differing.raw_data()) + i);
    TANDEM_CUDA_CHECK(cudaEventRecord(marks[static_cast<size_t>(2 * i)], stream));
    for (int r = 0; r < kTuneRuns; ++r) (void)run(algo, trial);
    TANDEM_CUDA_CHECK(cudaEventRecord(marks[static_cast<size_t>(2 * i + 1)], stream));
    ran[static_cast<size_t>(i)] = true;
  }
  std::vector<uint32_t> counts(static_cast<size_t>(n));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(counts.data(), differing.raw_data(), counts.size() * 4,
                                    cudaMemcpyDeviceToHost, stream));
  tandem::cuda::wait_stream(stream, "the candidates' trial runs (tuning a product's algorithm)");
  cublasLtMatmulAlgo_t best = algos.front();
  float best_ms = -1;
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<size_t>(i);
    if (!ran[u] || counts[u] != 0) continue;
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[2 * u], marks[2 * u + 1]));
    if (best_ms < 0 || ms < best_ms) {
      best_ms = ms;
      best = algos[u];
    }
  }
  for (cudaEvent_t e : marks) (void)cudaEventDestroy(e);
  return best;
}

// cuBLASLt is column-major. A row-major [r, c] matrix with leading dimension ld is the
// column-major [c, r] matrix with the same ld, so row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B and its second our A, each with the
// same transpose flag as ours (B stored [k, n] is column-major [n, k] = op(B)^T untransposed).
// call: the operands to tune on (null: take the heuristic's first choice).
std::shared_ptr<const GemmPlan> make_plan(const GemmKey& key, bool exact, const TuneCall* call) {
  auto plan = std::make_shared<GemmPlan>();
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = key.trans_b == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = key.trans_a == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &op_first, sizeof(op_first)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &op_second, sizeof(op_second)));
  // Column-major (rows, cols) of each operand as stored: rows is the row-major width.
  const bool tb = key.trans_b == Trans::kYes, ta = key.trans_a == Trans::kYes;
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->first, CUDA_R_16BF, u(tb ? key.k : key.n),
                                                 u(tb ? key.n : key.k), key.ldb));
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->second, CUDA_R_16BF, u(ta ? key.m : key.k),
                                                 u(ta ? key.k : key.m), key.lda));
  TANDEM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->c, cuda_dtype(key.c_dtype), u(key.n), u(key.m), key.ldc));
  if (key.batch > 0) {  // gemm_batched: each operand an array of pointers
    const auto count = static_cast<int32_t>(key.batch);
    const auto mode = static_cast<uint32_t>(CUBLASLT_BATCH_MODE_POINTER_ARRAY);
    for (cublasLtMatrixLayout_t layout : {plan->first, plan->second, plan->c}) {
      TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
    }
  }
  PlanCache& cache = plan_cache();
  if (!exact) {
    std::lock_guard lock(cache.mutex);
    auto it = cache.bucket_algos.find(bucket_key(key));
    if (it != cache.bucket_algos.end()) {
      plan->algo = it->second;
      plan->from_bucket = true;
      return plan;
    }
  }
  const std::vector<cublasLtMatmulAlgo_t> algos =
      candidate_algos(*plan, key, call != nullptr ? kTuneCandidates : 1);
  plan->algo = call != nullptr ? tune(*plan, key, algos, *call) : algos.front();
  if (!exact) {
    std::lock_guard lock(cache.mutex);
    cache.bucket_algos.emplace(bucket_key(key), plan->algo);
  }
  return plan;
}

// exact: query the heuristic for this very shape (after a bucket's algorithm was rejected).
std::shared_ptr<const GemmPlan> find_plan(const GemmKey& key, const TuneCall* call,
                                          bool exact = false) {
  PlanCache& cache = plan_cache();
  if (!exact) {
    std::lock_guard lock(cache.mutex);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) return it->second;
  }
  // Built unlocked: two threads may both build the same plan; the last one stored wins.
  std::shared_ptr<const GemmPlan> plan = make_plan(key, exact, exact ? nullptr : call);
  std::lock_guard lock(cache.mutex);
  if (cache.plans.size() >= kMaxPlans) cache.plans.clear();
  cache.plans[key] = plan;
  return plan;
}

// Runs the product of `key` on the current stream (for a gemm_batched, a, b, c_in and c are
// pointer arrays), its plan found or built; a bucket's algorithm that cuBLASLt rejects for this
// exact shape is replaced by one queried for it (Note [Algorithm buckets]).
void run_product(const GemmKey& key, const TuneCall* call, float alpha, const void* a,
                 const void* b, float beta, const void* c_in, void* c) {
  const cudaStream_t stream = tandem::cuda::current_stream();
  // A gemm_batched's kernels work past its caller's pointer arrays (kPointerArrayBytes).
  char* workspace = static_cast<char*>(tandem::cuda::cublaslt_workspace(stream)) +
                    (key.batch > 0 ? kPointerArrayBytes : 0);
  std::shared_ptr<const GemmPlan> plan = find_plan(key, call);
  const auto run = [&] {
    return cublasLtMatmul(tandem::cuda::cublaslt_handle(), plan->op, &alpha, b, plan->first, a,
                          plan->second, &beta, c_in, plan->c, c, plan->c, &plan->algo, workspace,
                          workspace_bytes(key), stream);
  };
  cublasStatus_t status = run();
  if (status != CUBLAS_STATUS_SUCCESS && plan->from_bucket) {
    plan = find_plan(key, nullptr, /*exact=*/true);
    status = run();
  }
  TANDEM_CUBLAS_CHECK(status);
}

}  // namespace

void gemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          int64_t lda, const void* b, int64_t ldb, float beta, void* c, DType c_dtype, int64_t ldc,
          const void* c_in) {
  if (c_in == nullptr) c_in = c;
  TANDEM_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m=", m, " n=", n, " k=", k);
  TANDEM_CHECK(c_dtype == DType::kF32 || c_dtype == DType::kBF16, "gemm: C is ",
               dtype_name(c_dtype), ", expected f32 or bf16");
  const int64_t a_width = trans_a == Trans::kYes ? m : k;
  const int64_t b_width = trans_b == Trans::kYes ? k : n;
  TANDEM_CHECK(lda >= a_width && ldb >= b_width && ldc >= n, "gemm: leading dimensions lda=", lda,
               " ldb=", ldb, " ldc=", ldc, " are below the row widths ", a_width, ", ", b_width,
               ", ", n);
  if (m == 0 || n == 0) return;
  TANDEM_CHECK(c != nullptr, "gemm: C is null for a ", m, "x", n, " product");
  const cudaStream_t stream = tandem::cuda::current_stream();
  if (k == 0) {
    // An empty sum: C = beta * C. Only the two values the ops use are supported.
    TANDEM_CHECK(beta == 0.0f || beta == 1.0f, "gemm: k == 0 supports beta 0 or 1, not ", beta);
    TANDEM_CHECK(beta == 0.0f || c_in == c, "gemm: k == 0 with a separate C input");
    if (beta == 0.0f) {
      const auto esz = static_cast<size_t>(dtype_size(c_dtype));
      TANDEM_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * esz, 0,
                                          static_cast<size_t>(n) * esz, static_cast<size_t>(m),
                                          stream));
    }
    return;
  }
  TANDEM_CHECK(a != nullptr && b != nullptr, "gemm: operand A or B is null for m=", m, " n=", n,
               " k=", k);
  const GemmKey key{.c_dtype = c_dtype,
                    .trans_a = trans_a,
                    .trans_b = trans_b,
                    .m = m,
                    .n = n,
                    .k = k,
                    .lda = lda,
                    .ldb = ldb,
                    .ldc = ldc,
                    .reads_c = beta != 0.0f,
                    .align_a = alignment_of(a),
                    .align_b = alignment_of(b),
                    .align_c = std::min(alignment_of(c), alignment_of(c_in))};
  const TuneCall call{a, b, c_in, alpha, beta};
  run_product(key, &call, alpha, a, b, beta, c_in, c);
}

void gemm_batched(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k,
                  const void* const* a, int64_t lda, const void* const* b, int64_t ldb, void** c,
                  int64_t ldc, int64_t batch) {
  TANDEM_CHECK(m > 0 && n > 0 && k > 0 && batch > 0, "gemm_batched: sizes m=", m, " n=", n,
               " k=", k, " batch=", batch, " must be positive");
  // bf16 C not read; every matrix 16-byte aligned (the caller's promise, gemm.h).
  GemmKey key{DType::kBF16, trans_a, trans_b, m, n, k, lda, ldb, ldc, false, 16, 16, 16};
  key.batch = batch;
  // No tuning: its trial runs would need pointer arrays of scratch outputs.
  run_product(key, nullptr, 1.0f, a, b, 0.0f, c, c);
}

namespace {

// A device bf16 tensor of deterministic values in [-1, 1) (not zeros: a product of zeros draws
// less power and would overstate the sustained rate).
Tensor pattern_bf16(const Shape& shape, uint64_t seed, const char* tag) {
  Tensor host = Tensor::empty(shape, DType::kBF16, MemCategory::kOther, tag, Device::kCPU);
  BF16* p = host.data<BF16>();
  uint64_t state = seed;
  for (int64_t i = 0; i < host.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = bf16_from_float(2.0f * u - 1.0f);
  }
  Tensor dev = Tensor::empty(shape, DType::kBF16, MemCategory::kOther, tag, Device::kCUDA);
  dev.copy_from(host);
  return dev;
}

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    TANDEM_CUDA_CHECK(cudaEventCreate(&start));
    TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    (void)cudaEventDestroy(stop);
    (void)cudaEventDestroy(start);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

double measure_bf16_matmul_tflops(int64_t m, int64_t n, int64_t k, int iters) {
  TANDEM_CHECK(m > 0 && n > 0 && k > 0 && iters > 0, "measure_bf16_matmul_tflops: sizes m=", m,
               " n=", n, " k=", k, " and iters=", iters, " must be positive");
  // y[m, n] = x[m, k] @ w[n, k]^T, the linear layers' forward.
  const Tensor x = pattern_bf16({m, k}, 1, "gemm.bench.x");
  const Tensor w = pattern_bf16({n, k}, 2, "gemm.bench.w");
  const Tensor y =
      Tensor::empty({m, n}, DType::kBF16, MemCategory::kOther, "gemm.bench.y", Device::kCUDA);
  const auto run = [&] {
    gemm(Trans::kNo, Trans::kYes, m, n, k, 1.0f, x.raw_data(), k, w.raw_data(), k, 0.0f,
         y.raw_data(), DType::kBF16, n);
  };
  const cudaStream_t stream = tandem::cuda::current_stream();
  for (int i = 0; i < 3; ++i) run();  // plan built, clocks up
  EventPair events;
  TANDEM_CUDA_CHECK(cudaEventRecord(events.start, stream));
  for (int i = 0; i < iters; ++i) run();
  TANDEM_CUDA_CHECK(cudaEventRecord(events.stop, stream));
  TANDEM_CUDA_CHECK(cudaEventSynchronize(events.stop));
  float ms = 0;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
  TANDEM_CHECK(ms > 0, "measure_bf16_matmul_tflops: the timed products took no time");
  const double flops = 2.0 * double(m) * double(n) * double(k) * double(iters);
  return flops / (double(ms) * 1e-3) / 1e12;
}

}  // namespace tandem::ops::cuda
