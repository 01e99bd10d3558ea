// The deferred optimizer update (TrainConfig::defer_optimizer, --defer-optimizer): each step
// ends with AdamW::defer_step, and the next step updates each weight just before the first node
// that reads it (Note [The update beside the first forward] in deferred_update.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/stage.h"
#include "runtime/streams.h"

namespace tandem::runtime {

// For each node, in elements of the flat buffers, the end of the prefix of weights that it and
// the nodes before it read.
std::vector<int64_t> node_weight_ends(const model::Parameters& params,
                                      const std::vector<model::NodeRef>& nodes);

class DeferredUpdate {
 public:
  explicit DeferredUpdate(Streams& streams) : streams_(&streams) {}

  // What of stage s's deferred update lies before element `end`, issued on the compute stream
  // of `half` (on the GPU a span of the trace); nothing when none is pending there. With the
  // distributed optimizer, also the weights before `end` still to be gathered
  // (Note [Weights gathered beside the forward] in distributed_optimizer.cc).
  void update(StageRuntime& s, int64_t end, int half = 0);
  // The weights node i reads before its forward; a backward reads them all.
  void before_node(StageRuntime& s, size_t i, bool forward, int half = 0) {
    update(s, forward ? s.weight_ends[i] : s.params->numel(), half);
  }
  // What is left of the last step's update, on every stage.
  void finish(std::vector<StageRuntime>& stages);

 private:
  Streams* streams_;
};

}  // namespace tandem::runtime
