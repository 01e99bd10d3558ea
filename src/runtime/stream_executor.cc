// The stream executor (stream_executor.h): a plain action's nodes and the node issue a combined
// pair shares (combined.cc).
#include "runtime/stream_executor.h"

#include <chrono>
#include <string>
#include <vector>

#include "schedule/deferred_update.h"
#include "schedule/node_times.h"

namespace tandem::runtime {

using schedule::ActionKind;

StreamExecutor::StreamExecutor(Streams& streams, DeferredUpdate& deferred, GradReducer& reducer,
                               Groups& groups, CommOverlap overlap, ActivationOffload* offload)
    : streams_(&streams),
      deferred_(&deferred),
      reducer_(&reducer),
      groups_(&groups),
      overlap_(overlap),
      offload_(offload) {}

namespace {
// Whether node i is its layer's last in forward order (the first of its backward).
bool ends_layer(const std::vector<model::NodeRef>& nodes, size_t i) {
  return nodes[i].layer >= 0 && (i + 1 == nodes.size() || nodes[i + 1].layer != nodes[i].layer);
}
}  // namespace

void StreamExecutor::offload_after(const NodeWork& w, size_t i, const Chain& chain) {
  if (offload_ == nullptr || !w.offload || w.action.kind != ActionKind::kForward) return;
  const std::vector<model::NodeRef>& nodes = w.stage->chunk->nodes();
  if (!ends_layer(nodes, i)) return;
  offload_->send_out(w.state->layers[static_cast<size_t>(nodes[i].layer)], chain.done,
                     chain.stream);
}

void StreamExecutor::reload_before(const NodeWork& w, size_t i, StreamId stream, int half) {
  const ActionKind kind = w.action.kind;
  if (offload_ == nullptr || !w.offload ||
      (kind != ActionKind::kBackward && kind != ActionKind::kBackwardInput)) {
    return;
  }
  const std::vector<model::NodeRef>& nodes = w.stage->chunk->nodes();
  std::vector<model::LayerActs>& layers = w.state->layers;
  const StreamId alloc = compute_stream(half);
  if (nodes[i].kind == NodeKind::kLoss && !layers.empty()) {
    offload_->bring_back(layers.back(), alloc);
  } else if (ends_layer(nodes, i)) {
    const auto l = static_cast<size_t>(nodes[i].layer);
    offload_->wait_back(layers[l], stream, alloc);
    if (l > 0) offload_->bring_back(layers[l - 1], alloc);
  }
}

bool StreamExecutor::overlaps() const {
  return overlap_ != CommOverlap::kOff && groups_->layout.ep > 1;
}

SpanInfo StreamExecutor::node_span(NodeKind kind, NodePhase phase, int32_t mb, bool on_comm,
                                   int half) const {
  const char* letter = phase == NodePhase::kForward         ? "F"
                       : phase == NodePhase::kBackwardInput ? "B"
                                                            : "W";
  SpanInfo span;
  span.track = std::string(on_comm ? "comm" : "compute") + (half ? "2" : "");
  span.name = letter + std::to_string(mb) + " " + std::string(node_kind_name(kind));
  span.kind = static_cast<int>(kind);
  span.phase = phase;
  span.all_to_all = schedule::node_is_communication(kind) && groups_->layout.ep > 1;
  return span;
}

void StreamExecutor::run(const NodeWork& w) {
  const ActionKind kind = w.action.kind;
  StageRuntime& s = *w.stage;
  // Note [One executor on two kinds of streams]: a plain action's all-to-all goes beside other
  // work only where the host issues ahead of the streams.
  const bool beside = overlaps() && streams_->issues_ahead();
  if (kind == ActionKind::kForward && beside && s.optimizer->update_pending()) {
    forward_beside_update(w);  // Note [The update beside the first forward]
    return;
  }
  // Note [The unpaired backward's all-to-all] (combined.cc).
  const bool overlap = kind == ActionKind::kBackward && beside;
  Chain chain{StreamId::kCompute, overlap ? streams_->mark(StreamId::kCompute) : StreamEvent{}};
  const size_t n = s.chunk->nodes().size();
  for (size_t k = 0; k < n; ++k) {
    issue_node(w, kind == ActionKind::kForward ? k : n - 1 - k, overlap, chain);
  }
  join(chain, "B" + std::to_string(w.action.microbatch));
}

void StreamExecutor::issue_node(const NodeWork& w, size_t i, bool overlap, Chain& chain, int half) {
  const auto host_begin = std::chrono::steady_clock::now();
  StageRuntime& s = *w.stage;
  model::MicroBatchState& state = *w.state;
  const model::NodeContext& c = w.context;
  const ActionKind kind = w.action.kind;
  const int32_t mb = w.action.microbatch;
  const model::NodeRef node = s.chunk->nodes()[i];
  // A weight-gradient action has nothing to do for a node without weights.
  const bool has_weights = schedule::node_has_weights(node.kind);
  if (kind == ActionKind::kBackwardWeight && !has_weights) return;
  const bool on_comm = overlap && schedule::node_is_communication(node.kind);
  const StreamId stream = on_comm ? comm_stream(half) : compute_stream(half);
  const char* letter = kind == ActionKind::kForward          ? "F"
                       : kind == ActionKind::kBackwardWeight ? "W"
                                                             : "B";
  const std::string name =
      letter + std::to_string(mb) + " " + std::string(node_kind_name(node.kind));
  // Note [The update beside the first forward] (deferred_update.cc): the weights this node
  // reads, on its compute stream before it (and before its wait for the chain).
  if (!on_comm) deferred_->before_node(s, i, kind == ActionKind::kForward, half);
  if (chain.stream != stream) streams_->wait(stream, chain.done, chain.stream, name);
  reload_before(w, i, stream, half);
  // A weight gradient is work of its own where the host issues ahead: it may go off the chain
  // (Note [Weight gradients off the chain] in combined.cc), and the node times keep it apart. On
  // the CPU a node's backward is one piece of work, one span.
  const bool weights =
      (kind == ActionKind::kBackward || kind == ActionKind::kBackwardWeight) && has_weights;
  const bool apart = weights && (kind == ActionKind::kBackwardWeight || streams_->issues_ahead());
  const bool off_chain = apart && overlap;
  if (kind == ActionKind::kForward) {
    streams_->run(stream, node_span(node.kind, NodePhase::kForward, mb, on_comm, half),
                  [&s, &state, &c, i] { s.chunk->forward_node(i, state, c); });
  } else if (kind != ActionKind::kBackwardWeight) {
    const bool whole = weights && !apart;
    streams_->run(stream, node_span(node.kind, NodePhase::kBackwardInput, mb, on_comm, half),
                  [&s, &state, &c, i, whole] {
                    s.chunk->backward_node(i, state, c);
                    if (whole) s.chunk->backward_weights_node(i, state, c);
                  });
    // Note [Gradients reduced beside the backward] (grad_reduce.cc).
    if (whole) reducer_->weight_grad_issued(s, i, stream);
  }
  if (on_comm && node.layer >= 0) record_on_comm(state.layers[node.layer], half);
  auto issue_weights = [&] {
    streams_->run(stream, node_span(node.kind, NodePhase::kBackwardWeight, mb, on_comm, half),
                  [&s, &state, &c, i] { s.chunk->backward_weights_node(i, state, c); });
    reducer_->weight_grad_issued(s, i, stream);
  };
  if (apart && !off_chain) issue_weights();
  chain = {stream, streams_->mark(stream)};
  offload_after(w, i, chain);
  if (off_chain) issue_weights();
  streams_->host_span(name, host_begin, std::chrono::steady_clock::now());
}

void StreamExecutor::prepare_node(const NodeWork& w, size_t i, Chain& chain, int half) {
  const auto host_begin = std::chrono::steady_clock::now();
  StageRuntime& s = *w.stage;
  model::MicroBatchState& state = *w.state;
  const model::NodeContext& c = w.context;
  const model::NodeRef node = s.chunk->nodes()[i];
  const StreamId comm = comm_stream(half);
  if (chain.stream != comm) streams_->wait(comm, chain.done, chain.stream, std::string());
  SpanInfo span = node_span(node.kind, NodePhase::kForward, w.action.microbatch, true, half);
  span.name += " counts";
  span.part = true;  // the dispatch's own span follows: one node, one count
  const std::string name = span.name;
  streams_->run(comm, std::move(span),
                [&s, &state, &c, i] { s.chunk->prepare_forward_node(i, state, c); });
  if (node.layer >= 0) record_on_comm(state.layers[node.layer], half);
  chain = {comm, streams_->mark(comm)};
  streams_->host_span(name, host_begin, std::chrono::steady_clock::now());
}

void StreamExecutor::record_on_comm(const model::LayerActs& layer, int half) {
  for (const Tensor* t : model::all_tensors(layer)) streams_->record_use(*t, comm_stream(half));
}

void StreamExecutor::join(const Chain& chain, const std::string& what) {
  if (chain.stream != StreamId::kCompute) {
    streams_->wait(StreamId::kCompute, chain.done, chain.stream, what);
  }
}

void StreamExecutor::forward_beside_update(const NodeWork& w) {
  StageRuntime& s = *w.stage;
  const std::vector<model::NodeRef>& nodes = s.chunk->nodes();
  const std::vector<int64_t>& ends = s.weight_ends;
  auto is_comm = [&](size_t i) { return schedule::node_is_communication(nodes[i].kind); };
  Chain chain{StreamId::kCompute, streams_->mark(StreamId::kCompute)};
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!is_comm(i)) {
      deferred_->update(s, ends[i]);
      issue_node(w, i, true, chain);
      continue;
    }
    // The dispatch's counts go first (Note [Counts ahead of the rows] in moe_exchange.cc), so
    // the host, waiting for them inside the dispatch, has the update queued already.
    if (nodes[i].kind == NodeKind::kDispatch) prepare_node(w, i, chain);
    // Beside the all-to-all: the planner's rule (planner/pipeline_model.h).
    deferred_->update(s, schedule::update_beside_all_to_all(ends, i, s.params->numel(), is_comm));
    issue_node(w, i, true, chain);
  }
  join(chain, "F" + std::to_string(w.action.microbatch));
}

}  // namespace tandem::runtime
