// The sequential trainer: a global batch run as micro-batches one after another through the
// whole model on one rank, then clipping and AdamW. It is the reference that every schedule and
// parallel layout is compared against, so it is written for clarity and determinism.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/allocator.h"
#include "core/config.h"
#include "data/dataset.h"
#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/optimizer.h"
#include "runtime/timeline.h"

namespace tandem::runtime {

// Whether a step changed the weights: kSkipped when its loss or gradients were not finite and
// the policy is NonFinitePolicy::kSkip (no optimizer update, gradients zeroed).
enum class StepStatus : uint8_t { kApplied, kSkipped };

struct StepResult {
  int64_t iteration = 0;   // 1-based, after the step
  StepStatus status = StepStatus::kApplied;
  double loss = 0;         // mean over micro-batches of (lm_loss + aux_loss)
  double lm_loss = 0;      // mean cross-entropy
  double aux_loss = 0;     // mean of the summed router aux losses
  double grad_norm = 0;    // before clipping
  double lr = 0;
  int64_t tokens = 0;
  double seconds = 0;
  MemoryStats memory;              // at the end of the step, with the step's peaks
  int64_t activation_peak = 0;     // peak bytes of kActivation during the step
};

// Tokens of one micro-batch: inputs and next-token targets, [micro_batch * seq] i32 each.
struct MicroBatchTokens {
  Tensor ids, targets;
};

// Reads micro-batch `mb` of step `iteration` (0-based) from the dataset: sample indices
// iteration * global_batch + mb * micro_batch + row, each seq + 1 tokens long. This is the one
// place that decides which samples a micro-batch gets (data-parallel sharding belongs here), so
// the data position of a checkpoint is its iteration alone.
MicroBatchTokens load_micro_batch(const data::Dataset& data, const ModelConfig& m,
                                  const TrainConfig& t, int64_t iteration, int64_t mb);

// Note [Non-finite steps]'s stop: throws tandem::Error naming the iteration and whether the loss
// or the gradients were at fault when `finite` is false and the policy is kStop (the one
// message of every trainer); otherwise returns.
void check_step_verdict(const TrainConfig& t, int64_t iteration, double loss, double grad_norm,
                        bool finite);

class Trainer {
 public:
  // dtype: kF32 to train; kF64 for gradient checks.
  Trainer(const ModelConfig& m, const TrainConfig& t, const data::Dataset& data,
          DType dtype = DType::kF32);

  // Runs forward and backward over the global batch, accumulating gradients (scaled by
  // 1 / num_microbatches). Returns the losses; does not update the weights.
  StepResult forward_backward(int64_t iteration);
  // One whole training step: forward_backward, clip, AdamW. Note [Non-finite steps]: the step
  // is judged by one value, the gradients' sum of squares plus +inf when the loss is not finite
  // (a multi-rank run all-reduces that sum, so every rank takes the same decision); when it is
  // not finite, kStop throws tandem::Error naming the iteration and whether the loss or the
  // gradients were at fault, before any update; kSkip zeroes the gradients, leaves weights and
  // optimizer untouched, still advances the iteration (its data is consumed) and reports
  // StepStatus::kSkipped.
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

  // The last step's measured spans (one per micro-batch forward and backward) and its start.
  const std::vector<Span>& timeline() const { return timeline_; }
  double step_start_seconds() const { return step_start_; }

 private:
  ModelConfig model_;
  TrainConfig train_;
  const data::Dataset* data_;
  std::unique_ptr<model::Parameters> params_;
  std::unique_ptr<model::ModelChunk> chunk_;
  std::unique_ptr<AdamW> optimizer_;
  int64_t iteration_ = 0;
  GradientHook after_backward_;
  std::vector<Span> timeline_;
  double step_start_ = 0;
};

}  // namespace tandem::runtime
