// The reference trainer: a global batch run as micro-batches one after another through the whole
// model on one rank, then clipping and AdamW. It is the oracle that every schedule and parallel
// layout is tested against (tests/dist, tests/runtime), so it is written for clarity and
// determinism. `tandem train` runs PipelineTrainer (runtime/pipeline_trainer.h) on every layout,
// one process included; this trainer lives with the tests, which link it as a small library.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/config.h"
#include "data/dataset.h"
#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/checkpoint.h"
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
  // The model's weights (tied or not), their gradients after forward_backward, and what the
  // optimizer steps; with tied embeddings the nodes run on untied_
  // (Note [Tying in the reference] in reference_trainer.cc).
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
  // Note [Tying in the reference]: runs the model with an LM head of its own.
  void untie_weights();
  void tie_gradients();

  std::unique_ptr<model::Parameters> params_;
  // Note [Tying in the reference]: with tied embeddings, the model untied, which the nodes run
  // on; null otherwise.
  std::unique_ptr<model::Parameters> untied_;
  std::unique_ptr<model::ModelChunk> chunk_;
  std::unique_ptr<AdamW> optimizer_;
  int64_t iteration_ = 0;
  GradientHook after_backward_;
};

// The trainer's whole state as a checkpoint: weights, Adam moments (in the parameters' dtype,
// F32 when training) and training_position_json.
CheckpointState trainer_checkpoint(const ReferenceTrainer& trainer, const nlohmann::json& data);

// Restores weights, Adam moments and step count, and the iteration from a kTandem state, so the
// following steps are bitwise those of an uninterrupted run; from a kHuggingFace state only the
// weights (iteration 0, fresh optimizer). restore_chunks with the trainer's one chunk: checks
// everything first and changes nothing on failure.
void restore_trainer(ReferenceTrainer& trainer, const CheckpointState& state);

}  // namespace tandem::runtime
