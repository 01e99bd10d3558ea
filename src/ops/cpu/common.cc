// Argument checks shared by the CPU ops; each names the op, the tensor and what was expected.
// Also picks OpenBLAS's kernels on CPUs newer than the library (Note [OpenBLAS on newer CPUs]).
#include "ops/cpu/common.h"

#include <cstdlib>
#include <string_view>

// OpenBLAS's own entry points, weak so that another BLAS links too (they are then null).
extern "C" {
char* openblas_get_corename(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace tandem::ops::cpu {
namespace {

// Note [OpenBLAS on newer CPUs]
// OpenBLAS built for every x86 core (DYNAMIC_ARCH, as Debian ships it) picks its kernels from
// the CPU's model number when it loads, and a model it does not know gets its generic SSE3
// kernels ("Prescott"): Debian 12's 0.3.21 does that on Emerald Rapids Xeons (model 207), where
// sgemm then runs at 30 GFLOP/s on one core instead of 145 with the AVX-512 kernels it has.
// So before the first product, when the library runs its generic kernels on a CPU with AVX2 or
// AVX-512 and the user has not named a core (OPENBLAS_CORETYPE), we ask it to choose again as if
// OPENBLAS_CORETYPE named the kernels those features run (OpenBLAS checks the features itself
// and falls back when they are missing). Which kernels run changes only the rounding of the
// products, the same in every process on one machine.
const char* core_for_this_cpu() {
  __builtin_cpu_init();  // this runs during static initialisation, maybe before GCC's own
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

bool choose_blas_core() {
  if (openblas_get_corename == nullptr || gotoblas_dynamic_init == nullptr ||
      gotoblas_dynamic_quit == nullptr || std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    return false;
  }
  const char* now = openblas_get_corename();
  const char* core = core_for_this_cpu();
  if (now == nullptr || std::string_view(now) != "Prescott" || core == nullptr) return false;
  // gotoblas_dynamic_init reads the core from the environment; the variable is removed again so
  // that it does not reach the processes this one starts (they choose for themselves).
  setenv("OPENBLAS_CORETYPE", core, 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  return true;
}

// Runs when the program starts, after OpenBLAS has loaded and before any op.
[[maybe_unused]] const bool blas_core_chosen = choose_blas_core();

void expect_cpu(const char* op, const char* name, const Tensor& t) {
  TANDEM_CHECK(t.defined(), op, ": tensor '", name, "' is undefined");
  // The CUDA backend will sit behind the same header; until then a device tensor is a user error.
  TANDEM_CHECK(t.device() == Device::kCPU, op, ": tensor '", name,
               "' is on a CUDA device, but only the CPU backend of tandem::ops is built");
}

}  // namespace

void expect_rank(const char* op, const char* name, const Tensor& t, int64_t rank) {
  expect_cpu(op, name, t);
  TANDEM_CHECK(rank < 0 || t.dim() == rank, op, ": tensor '", name, "' has shape ",
               shape_str(t.shape()), "; expected rank ", rank);
}

DType float_dtype(const char* op, const char* name, const Tensor& t, int64_t rank) {
  expect_rank(op, name, t, rank);
  TANDEM_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64, op, ": tensor '", name,
               "' is ", dtype_name(t.dtype()), "; expected f32 or f64");
  return t.dtype();
}

void expect(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& shape) {
  expect_cpu(op, name, t);
  TANDEM_CHECK(t.dtype() == dtype, op, ": tensor '", name, "' is ", dtype_name(t.dtype()),
               "; expected ", dtype_name(dtype));
  TANDEM_CHECK(t.shape() == shape, op, ": tensor '", name, "' has shape ", shape_str(t.shape()),
               "; expected ", shape_str(shape));
}

void expect_at_least(const char* op, const char* name, int64_t v, int64_t lo) {
  TANDEM_CHECK(v >= lo, op, ": ", name, " is ", v, "; expected at least ", lo);
}

void expect_indices(const char* op, const char* what, const int32_t* ids, int64_t count,
                    int64_t limit) {
  for (int64_t n = 0; n < count; ++n) {
    TANDEM_CHECK(ids[n] >= 0 && ids[n] < limit, op, ": ", what, " ", ids[n], " at row ", n,
                 " is outside [0, ", limit, ")");
  }
}

const float* expect_loss_mask(const char* op, const Tensor& loss_mask, int64_t n) {
  expect(op, "loss_mask", loss_mask, DType::kF32, {n});
  const float* m = loss_mask.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    TANDEM_CHECK(m[r] == 0.0f || m[r] == 1.0f, op, ": loss_mask[", r, "] = ", m[r],
                 " is neither 0 nor 1");
  }
  return m;
}

}  // namespace tandem::ops::cpu
