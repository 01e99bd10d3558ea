// Argument checks shared by the CUDA ops (common.h).
#include "ops/cuda/common.h"

#include <sstream>

namespace tandem::ops::cuda {

namespace {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::ostringstream out;
  size_t i = 0;
  for (DType d : dtypes) out << (i++ ? " or " : "") << dtype_name(d);
  return out.str();
}

}  // namespace

void expect_cuda_rank(const char* op, const char* name, const Tensor& t,
                      std::initializer_list<DType> dtypes, int64_t rank) {
  TANDEM_CHECK(t.defined(), op, ": tensor '", name, "' is undefined");
  TANDEM_CHECK(t.device() == Device::kCUDA, op, ": tensor '", name,
               "' is on the CPU; every tensor of a CUDA op must be on the GPU");
  TANDEM_CHECK(!t.released(), op, ": tensor '", name, "' was released");
  bool ok = false;
  for (DType d : dtypes) ok = ok || d == t.dtype();
  TANDEM_CHECK(ok, op, ": tensor '", name, "' is ", dtype_name(t.dtype()), ", expected ",
               dtype_list(dtypes));
  TANDEM_CHECK(rank < 0 || t.dim() == rank, op, ": tensor '", name, "' has shape ",
               shape_str(t.shape()), ", expected rank ", rank);
}

void expect_cuda(const char* op, const char* name, const Tensor& t,
                 std::initializer_list<DType> dtypes, const Shape& shape) {
  expect_cuda_rank(op, name, t, dtypes, -1);
  TANDEM_CHECK(t.shape() == shape, op, ": tensor '", name, "' has shape ", shape_str(t.shape()),
               ", expected ", shape_str(shape));
}

}  // namespace tandem::ops::cuda
