// The reference trainer: a global batch run as micro-batches one after another through the whole
// model on one rank, then clipping and AdamW. It is the oracle that every schedule and parallel
// layout is tested against (tests/dist, tests/runtime), so it is written for clarity and
// determinism. `tandem train` runs PipelineTrainer (pipeline_trainer.h) on every layout,
// one process included.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/config.h"
#include "data/dataset.h"
#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/optimizer.h"
#include "runtime/step.h"

namespace tandem::runtime {

class ReferenceTrainer {
 public:
  // dtype: kF32 to train; kF64 for gradient checks.
  ReferenceTrainer(const ModelConfig& m, const TrainConfig& t, const data::Dataset& data,
                   DType dtype = DType::kF32);

  // Runs forward and backward over the global batch, accumulating gradients (scaled by
  // 1 / num_microbatches). Returns the losses; does not update the weights.
  StepResult forward_backward(int64_t iteration);
  // One whole training step: forward_backward, clip, AdamW, judged as Note [Non-finite steps]
  // (step.h) says.
  StepResult step();

  int64_t iteration() const { return iteration_; }
  void set_iteration(int64_t it) { iteration_ = it; }
  model::Parameters& params() { return *params_; }
  const model::Parameters& params() const { return *params_; }
  const model::ModelChunk& chunk() const { return *chunk_; }
  AdamW& optimizer() { return *optimizer_; }
  const AdamW& optimizer() const { return *optimizer_; }
  const ModelConfig& model_config() const { return model_; }
  const TrainConfig& train_config() const { return train_; }

  // Test hook: called in step() after the backward pass with the gradients and the 1-based
  // iteration of the step, e.g. to poison a gradient with NaN (tests of Note [Non-finite steps]).
  using GradientHook = std::function<void(model::Parameters& params, int64_t iteration)>;
  void set_after_backward_hook(GradientHook hook) { after_backward_ = std::move(hook); }

 private:
  ModelConfig model_;
  TrainConfig train_;
  const data::Dataset* data_;
  std::unique_ptr<model::Parameters> params_;
  std::unique_ptr<model::ModelChunk> chunk_;
  std::unique_ptr<AdamW> optimizer_;
  int64_t iteration_ = 0;
  GradientHook after_backward_;
};

}  // namespace tandem::runtime
