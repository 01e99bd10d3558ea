// Host side of FloatPtr (common.cuh): built from a CUDA tensor of dtype f32 or bf16.
#pragma once

#include "core/tensor.h"
#include "ops/cuda/common.cuh"

namespace tandem::ops::cuda {

inline FloatPtr float_ptr(const Tensor& t) {
  return FloatPtr{t.raw_data(), t.dtype() == DType::kBF16};
}

}  // namespace tandem::ops::cuda
