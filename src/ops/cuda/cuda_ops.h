// The CUDA ops: the list of ops.h in namespace ops::cuda. Callers use ops.h, which dispatches
// here for device tensors. dtype rules for device tensors: docs/cuda.md ("Op dtypes").
#pragma once

#include "ops/ops.h"

namespace tandem::ops::cuda {
#include "ops/op_decls.inc"
}  // namespace tandem::ops::cuda
