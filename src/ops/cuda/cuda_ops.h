// The CUDA ops: the list of ops.h in namespace ops::cuda. Callers use ops.h, which dispatches
// here for device tensors. dtype rules for device tensors: docs/cuda.md ("Op dtypes").
#pragma once

#include "ops/ops.h"

namespace tandem::ops::cuda {
#include "ops/op_decls.inc"

// Note [Lanes] (ops.h): lane_mark() marks the current stream's work so far; side lane l in
// [1, Lanes::kMaxLanes) waits for the mark; runs fn with lane l current; the current stream waits
// for lane l's work so far.
void lane_mark();
void lane_fork(int lane);
void lane_run(int lane, const std::function<void()>& fn);
void lane_join(int lane);
}  // namespace tandem::ops::cuda
