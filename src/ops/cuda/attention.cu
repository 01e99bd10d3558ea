// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

void attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionShape&) {
  TANDEM_CHECK(false, "ops::cuda::attention_forward is not written yet");
}

void attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionShape&) {
  TANDEM_CHECK(false, "ops::cuda::attention_backward is not written yet");
}

}  // namespace tandem::ops::cuda
