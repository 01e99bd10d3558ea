// Argument checks shared by the CPU ops; each names the op, the tensor and what was expected.
#include "ops/cpu/common.h"

namespace tandem::ops::cpu {
namespace {

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

}  // namespace tandem::ops::cpu
