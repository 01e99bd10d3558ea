// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

void adamw_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWParams&) {
  TANDEM_CHECK(false, "ops::cuda::adamw_step is not written yet");
}

}  // namespace tandem::ops::cuda
