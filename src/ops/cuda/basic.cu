// PLACEHOLDER: these ops throw until their kernels are written.
#include "ops/cuda/cuda_ops.h"

namespace tandem::ops::cuda {

void axpy(const Tensor&, const Tensor&, double, Accumulate) {
  TANDEM_CHECK(false, "ops::cuda::axpy is not written yet");
}

void scale(const Tensor&, double) {
  TANDEM_CHECK(false, "ops::cuda::scale is not written yet");
}

double sum_squares(const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::sum_squares is not written yet");
}

bool all_finite(const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::all_finite is not written yet");
}

void convert(const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::convert is not written yet");
}

void embedding_forward(const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::embedding_forward is not written yet");
}

void embedding_backward(const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::embedding_backward is not written yet");
}

void swiglu_forward(const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::swiglu_forward is not written yet");
}

void swiglu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TANDEM_CHECK(false, "ops::cuda::swiglu_backward is not written yet");
}

}  // namespace tandem::ops::cuda
