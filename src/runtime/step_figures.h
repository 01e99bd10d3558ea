// Figures of the weights and gradients that Megatron-LM logs on request (--log-params-norm,
// --log-num-zeros-in-grad), over the whole model: each element counted once, whichever ranks
// hold it (Note [Counted once] in step_figures.cc). Both are collectives over the world: every
// rank calls them after the same step.
#pragma once

#include <cstdint>

#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {

// The L2 norm of every weight after the step's update (a deferred update is finished first).
double params_norm(PipelineTrainer& trainer);

// How many gradient elements of the step are exactly zero (before clipping, which scales them
// as the update reads them; a skipped step's are all zero).
int64_t grad_zeros(PipelineTrainer& trainer);

}  // namespace tandem::runtime
