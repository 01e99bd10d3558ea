// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

double lm_head_ce_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::lm_head_ce_forward is not written yet");
}

void lm_head_ce_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, Accumulate) {
  TANDEM_CHECK(false, "ops::cuda::lm_head_ce_backward is not written yet");
}

}  // namespace tandem::ops::cuda
