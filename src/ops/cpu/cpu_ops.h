// The CPU reference ops (OpenBLAS; f32 to train, f64 for gradient checks): the list of ops.h in
// namespace ops::cpu. Callers use ops.h, which dispatches here for CPU tensors.
#pragma once

#include "ops/ops.h"

namespace tandem::ops::cpu {
#include "ops/op_decls.inc"
}  // namespace tandem::ops::cpu
