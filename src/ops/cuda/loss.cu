// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

double cross_entropy_forward(const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::cross_entropy_forward is not written yet");
}

void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, double) {
  TANDEM_CHECK(false, "ops::cuda::cross_entropy_backward is not written yet");
}

}  // namespace tandem::ops::cuda
