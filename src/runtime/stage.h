// A pipeline stage as its rank holds it: its part of the model, its optimizer, and the state of
// the step's micro-batches.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/distributed_optimizer.h"
#include "runtime/optimizer.h"

namespace tandem::runtime {

struct StageRuntime {
  int32_t stage = 0;
  std::unique_ptr<model::Parameters> params;
  std::unique_ptr<model::ModelChunk> chunk;
  std::unique_ptr<AdamW> optimizer;
  // --use-distributed-optimizer: the pieces of the weights and this rank's parts (Note
  // [Distributed optimizer] in distributed_optimizer.cc); null with the plain optimizer.
  std::unique_ptr<ShardedWeights> shards;
  std::vector<model::MicroBatchState> mbs;
  // Per node of chunk->nodes(): the end of the flat weights it and the nodes before it read
  // (node_weight_ends in deferred_update.h).
  std::vector<int64_t> weight_ends;
  // --moe-wgrad-merge above 1 on a MoE chunk: the experts' weight gradients waiting for their
  // group (Note [Merged expert weight gradients] in model/nodes.h); null otherwise.
  std::unique_ptr<model::MergedExpertGrads> merged_expert_grads;
};

}  // namespace tandem::runtime
