// The sequential trainer: a global batch run as micro-batches one after another through the
// whole model on one rank, then clipping and AdamW. It is the reference that every schedule and
// parallel layout is compared against, so it is written for clarity and determinism.
#pragma once

#include <cstdint>
#include <memory>

#include "core/allocator.h"
#include "core/config.h"
#include "data/dataset.h"
#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/optimizer.h"

namespace tandem::runtime {

struct StepResult {
  int64_t iteration = 0;   // 1-based, after the step
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
// iteration * global_batch + mb * micro_batch + row, each seq + 1 tokens long.
MicroBatchTokens load_micro_batch(const data::Dataset& data, const ModelConfig& m,
                                  const TrainConfig& t, int64_t iteration, int64_t mb);

class Trainer {
 public:
  // dtype: kF32 to train; kF64 for gradient checks.
  Trainer(const ModelConfig& m, const TrainConfig& t, const data::Dataset& data,
          DType dtype = DType::kF32);

  // Runs forward and backward over the global batch, accumulating gradients (scaled by
  // 1 / num_microbatches). Returns the losses; does not update the weights.
  StepResult forward_backward(int64_t iteration);
  // One whole training step: forward_backward, clip, AdamW.
  StepResult step();

  int64_t iteration() const { return iteration_; }
  void set_iteration(int64_t it) { iteration_ = it; }
  model::Parameters& params() { return *params_; }
  const model::ModelChunk& chunk() const { return *chunk_; }
  AdamW& optimizer() { return *optimizer_; }

 private:
  ModelConfig model_;
  TrainConfig train_;
  const data::Dataset* data_;
  std::unique_ptr<model::Parameters> params_;
  std::unique_ptr<model::ModelChunk> chunk_;
  std::unique_ptr<AdamW> optimizer_;
  int64_t iteration_ = 0;
};

}  // namespace tandem::runtime
