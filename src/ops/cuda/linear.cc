// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

void linear_forward(const Tensor&, const Tensor&, const Tensor&, Accumulate) {
  TANDEM_CHECK(false, "ops::cuda::linear_forward is not written yet");
}

void linear_backward_input(const Tensor&, const Tensor&, const Tensor&, Accumulate) {
  TANDEM_CHECK(false, "ops::cuda::linear_backward_input is not written yet");
}

void linear_backward_weight(const Tensor&, const Tensor&, const Tensor&, Accumulate) {
  TANDEM_CHECK(false, "ops::cuda::linear_backward_weight is not written yet");
}

}  // namespace tandem::ops::cuda
