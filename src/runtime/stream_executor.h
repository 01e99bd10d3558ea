// The stream executor: a stage's nodes for one micro-batch (a plain F, B, I or W action) or two
// (a combined pair, combined.cc), issued on the rank's streams (streams.h) in an order that keeps
// every stream's work, and so every result, that of running the actions one after another.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "model/chunk.h"
#include "runtime/activation_offload.h"
#include "runtime/comm_overlap.h"
#include "runtime/deferred_update.h"
#include "runtime/grad_reduce.h"
#include "runtime/groups.h"
#include "runtime/stage.h"
#include "runtime/streams.h"
#include "schedule/action.h"

namespace tandem::runtime {

// One micro-batch's part of an action: a plain compute action, or one half of a pair (kForward,
// kBackward with its weight halves, or kBackwardInput), its input in place.
struct NodeWork {
  schedule::Action action;
  StageRuntime* stage;
  model::MicroBatchState* state;
  model::NodeContext context;
  // Whether the layers' chosen saved tensors go to the host between forward and backward (Note
  // [Activation offload] in activation_offload.h): training steps with --offload-activations.
  bool offload = false;
};

class StreamExecutor {
 public:
  // offload: null without --offload-activations.
  StreamExecutor(Streams& streams, DeferredUpdate& deferred, GradReducer& reducer, Groups& groups,
                 CommOverlap overlap, ActivationOffload* offload = nullptr);

  // A plain compute action's nodes, in the chunk's order (backward: from its last node).
  void run(const NodeWork& w);
  // A pair's two halves (FB or FF), node by node in the combined order (combined.cc); returns
  // once every node is issued and the host's threads have run theirs.
  void run_pair(schedule::ActionKind kind, std::array<NodeWork, 2>& halves);

 private:
  // One micro-batch's chain of nodes: the stream its last node ran on and the event its
  // successor waits for.
  struct Chain {
    StreamId stream;
    StreamEvent done;
  };
  // Whether dispatch and combine of a pair go on the communication stream: overlap asked for,
  // and an all-to-all to overlap (EP > 1).
  bool overlaps() const;
  // Node i of w's stage, the part w's action names (F; B with or without its weight gradient;
  // W): on the communication stream if overlap and it is dispatch or combine, else on the
  // compute stream, after the chain's event; the chain then ends at this node, or at its input
  // gradient (Note [Weight gradients off the chain] in combined.cc). half: which stream pair
  // (0, or 1 for a pair's second half under CommOverlap::kSplit).
  void issue_node(const NodeWork& w, size_t i, bool overlap, Chain& chain, int half = 0);
  // Chunk::prepare_forward_node of node i on the communication stream, after the chain's event,
  // measured as the first part of that node (Note [Counts ahead of the rows] in
  // model/moe_exchange.cc).
  void prepare_node(const NodeWork& w, size_t i, Chain& chain, int half = 0);
  // Note [Nodes on the communication stream] (combined.cc).
  void record_on_comm(const model::LayerActs& layer, int half);
  // Note [Activation offload]: a forward's layer goes out after its last node; a backward's
  // layer is waited for at its first node (in backward order), which brings the next one back.
  void offload_after(const NodeWork& w, size_t i, const Chain& chain);
  void reload_before(const NodeWork& w, size_t i, StreamId stream, int half);
  // The compute stream waits for the chain's last node (measured when that was an all-to-all).
  void join(const Chain& chain, const std::string& what);
  // The unpaired first forward with its all-to-all on the communication stream and the
  // deferred update beside it (Note [The update beside the first forward]).
  void forward_beside_update(const NodeWork& w);
  // The trace entry of one node of micro-batch mb ("F3 attention", "W3 experts"); dispatch and
  // combine count as all-to-all only with EP > 1 (else they only hand tensors over).
  SpanInfo node_span(NodeKind kind, NodePhase phase, int32_t mb, bool on_comm, int half) const;

  Streams* streams_;
  DeferredUpdate* deferred_;
  GradReducer* reducer_;
  Groups* groups_;
  CommOverlap overlap_;
  ActivationOffload* offload_;
};

}  // namespace tandem::runtime
