// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

void router_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::router_forward is not written yet");
}

void router_counts(const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::router_counts is not written yet");
}

double router_aux_loss(const Tensor&, const Tensor&, int64_t, double) {
  TANDEM_CHECK(false, "ops::cuda::router_aux_loss is not written yet");
}

void router_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, double, double) {
  TANDEM_CHECK(false, "ops::cuda::router_backward is not written yet");
}

void moe_permutation(const Tensor&, const Tensor&, const Tensor&, int64_t) {
  TANDEM_CHECK(false, "ops::cuda::moe_permutation is not written yet");
}

void permute_forward(const Tensor&, const Tensor&, const Tensor&, int64_t) {
  TANDEM_CHECK(false, "ops::cuda::permute_forward is not written yet");
}

void permute_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, Accumulate) {
  TANDEM_CHECK(false, "ops::cuda::permute_backward is not written yet");
}

void combine_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::combine_forward is not written yet");
}

void combine_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::combine_backward is not written yet");
}

}  // namespace tandem::ops::cuda
