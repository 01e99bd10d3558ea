// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

void rmsnorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) {
  TANDEM_CHECK(false, "ops::cuda::rmsnorm_forward is not written yet");
}

void rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Accumulate) {
  TANDEM_CHECK(false, "ops::cuda::rmsnorm_backward is not written yet");
}

void rope_forward(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, double) {
  TANDEM_CHECK(false, "ops::cuda::rope_forward is not written yet");
}

void rope_backward(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, double) {
  TANDEM_CHECK(false, "ops::cuda::rope_backward is not written yet");
}

}  // namespace tandem::ops::cuda
