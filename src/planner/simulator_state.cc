// The simulator's per-node work: issuing spans on streams and running one half of an action
// node by node with Note [Simulation model]'s dependencies and memory rules (simulator.cc).
#include "planner/simulator_state.h"

#include <algorithm>

#include "core/error.h"
#include "schedule/deferred_update.h"

namespace tandem::schedule {

SimState::SimState(const Schedule& s, const PipelineModel& m)
    : schedule(s), model(m), ranks(s.num_ranks) {
  const size_t cells = static_cast<size_t>(s.num_stages) * s.num_microbatches;
  fwd_out.assign(cells, -1);
  bwd_out.assign(cells, -1);
  recv_f.assign(cells, -1);
  recv_b.assign(cells, -1);
  send_f.assign(cells, Interval{});
  send_b.assign(cells, Interval{});
  waiter_f.assign(cells, -1);
  waiter_b.assign(cells, -1);
  recv_after.assign(cells, 0);
  if (m.cpu_trainer) releases = send_releases(s);
  for (int32_t r = 0; r < s.num_ranks; ++r) {
    ranks[r].spans.reserve(s.ranks[r].size() * 4);
    ranks[r].mem.reserve(s.ranks[r].size() * 4);
  }
  for (const Stage& st : m.stages) {
    std::vector<int64_t> pending;
    for (const GradUnit& u : st.grad_units) {
      pending.push_back(u.weighted_nodes * s.num_microbatches);
    }
    unit_pending.push_back(std::move(pending));
    updated.push_back(m.defer_optimizer ? 0 : st.num_params);
    std::vector<int64_t> ends;
    int64_t sum = 0;
    for (const StageNode& n : st.nodes) ends.push_back(sum += n.params);
    weight_ends.push_back(std::move(ends));
  }
}

void SimState::update(int32_t rank, int32_t stage, int64_t upto, Span proto) {
  int64_t& done = updated[static_cast<size_t>(stage)];
  if (upto <= done) return;
  proto.kind = SpanKind::kUpdate;
  proto.phase = Phase::kForward;
  issue(rank, Stream::kCompute, 0.0, static_cast<double>(upto - done) * model.update_s_per_param,
        proto);
  done = upto;
}

// Note [Offload in the plan]: the runtime's rule (Note [Activation offload] in
// runtime/activation_offload.h) at the same nodes. A layer's offloaded nodes' saved bytes leave
// the device when its last forward node ends and occupy the host; its copy to the host takes
// the copy-out engine for bytes / DeviceDesc::host_copy_bytes_per_s from then (it delays no
// compute: the freed block is reused after it, which the plan does not model). They come back
// (device bytes again, host bytes gone) when the backward of the layer above begins (the loss
// node's, for the stage's top layer), their copy on the copy-in engine once that engine is free
// and the copy out has ended; the layer's first backward node starts after that copy.

// The saved bytes of the layer's offloaded nodes leaving (sign -1) or coming back (+1) to the
// device at t, node by node; returns their sum.
int64_t SimState::move_offloaded(int32_t rank, const Stage& stage, int32_t mb, int32_t layer,
                                 double t, int sign) {
  int64_t bytes = 0;
  for (int32_t k = stage.layer_node[layer]; k < stage.layer_node[layer + 1]; ++k) {
    const StageNode& n = stage.nodes[k];
    if (!n.offloaded) continue;
    memory(rank, t, sign * n.saved(mb), MemKind::kActivation, n.kind);
    bytes += n.saved(mb);
  }
  return bytes;
}

void SimState::send_out(int32_t rank, const Stage& stage, int32_t mb, int32_t layer, double t) {
  const int64_t bytes = move_offloaded(rank, stage, mb, layer, t, -1);
  if (bytes == 0) return;
  RankState& st = ranks[rank];
  st.host.emplace_back(t, bytes);
  double& engine = st.copy_free[0];
  engine = std::max(engine, t) + static_cast<double>(bytes) / model.host_copy_bytes_per_s;
  offloaded[{stage.index, mb, layer}] = {engine, -1};
}

void SimState::bring_back(int32_t rank, const Stage& stage, int32_t mb, int32_t layer, double t) {
  auto it = offloaded.find({stage.index, mb, layer});
  if (it == offloaded.end() || it->second.in_done >= 0) return;
  const int64_t bytes = move_offloaded(rank, stage, mb, layer, t, +1);
  RankState& st = ranks[rank];
  st.host.emplace_back(t, -bytes);
  double& engine = st.copy_free[1];
  engine = std::max({engine, t, it->second.out_done}) +
           static_cast<double>(bytes) / model.host_copy_bytes_per_s;
  it->second.in_done = engine;
}

double SimState::wait_back(int32_t rank, const Stage& stage, int32_t mb, int32_t layer, double t) {
  auto it = offloaded.find({stage.index, mb, layer});
  if (it == offloaded.end()) return -1;
  bring_back(rank, stage, mb, layer, t);
  const double done = it->second.in_done;
  offloaded.erase(it);
  return std::max(t, done);
}

namespace {

Span reduce_span(int32_t index, const Stage& stage, const GradUnit& u, int32_t mb) {
  Span s;
  s.action = index;
  s.layer = u.layer;
  s.stage = stage.index;
  s.microbatch = mb;
  s.kind = SpanKind::kReduce;
  s.phase = Phase::kBackwardWeight;
  s.node = u.layer >= 0                                      ? NodeKind::kAttention
           : stage.has_embed() && &u == &stage.grad_units[0] ? NodeKind::kEmbed
                                                             : NodeKind::kLoss;
  return s;
}

}  // namespace

void SimState::weight_done(int32_t rank, int32_t index, const Action& a, int32_t node, double t) {
  const Stage& stage = model.stages[a.stage];
  const auto k = static_cast<size_t>(stage.node_unit[static_cast<size_t>(node)]);
  int64_t& pending = unit_pending[static_cast<size_t>(a.stage)][k];
  TANDEM_ASSERT(pending > 0, "stage ", a.stage, " unit ", k,
                " got more weight gradients than the step's micro-batches");
  if (--pending > 0 || !model.overlap_grad_reduce) return;
  const GradUnit& u = stage.grad_units[k];
  issue(rank, Stream::kReduce, t, u.reduce_s, reduce_span(index, stage, u, a.microbatch));
}

void SimState::reduce_at_end() {
  if (model.overlap_grad_reduce) return;
  for (int32_t r = 0; r < schedule.num_ranks; ++r) {
    RankState& st = ranks[static_cast<size_t>(r)];
    const double end = std::max(st.free[0], st.free[1]);
    const auto last = static_cast<int32_t>(schedule.ranks[static_cast<size_t>(r)].size()) - 1;
    for (const int32_t s : schedule.stages_of_rank(r)) {
      const Stage& stage = model.stages[static_cast<size_t>(s)];
      for (const GradUnit& u : stage.grad_units) {
        issue(r, Stream::kReduce, end, u.reduce_s,
              reduce_span(last, stage, u, schedule.num_microbatches - 1));
      }
    }
  }
}

double SimState::issue(int32_t rank, Stream stream, double ready, double duration, Span proto) {
  double& free = ranks[rank].free[static_cast<int>(stream)];
  const double start = std::max(free, ready);
  const double end = start + duration;
  free = end;
  if (duration > 0) {
    proto.start = start;
    proto.end = end;
    proto.stream = stream;
    ranks[rank].spans.push_back(proto);
  }
  return end;
}

// Note [Merged expert weight gradients in the plan]: with --moe-wgrad-merge m > 1 an experts
// node's weight-gradient pass, as the runtime's (Note [Merged expert weight gradients] in
// model/nodes.h), either sets its micro-batch aside (its node_weight_saved_bytes stay, and d_y
// and d_gate_up, its workspace until then, become activations: expert_merge_bytes' `waiting`)
// or, as the m-th waiting or the step's last pass of the node, runs the products of the whole
// group over buffers gathered from all of it (its workspace adds each one's `gathered`) and
// frees what every one of them held. A group of one runs its own products as without merging.
// The passes come in the order the rank simulates its actions, the runtime's order. The node's
// weight-gradient time is a micro-batch's (a node-times file measured with the merge holds the
// mean over every pass, those that set their micro-batch aside included): a pass that sets its
// micro-batch aside takes none, the group's last that time for each micro-batch of the group.
SimState::WeightPass SimState::weight_pass(int32_t stage, int32_t k, const StageNode& n,
                                           int32_t mb) {
  WeightPass wm{1, n.workspace.backward_weight, -n.weight_saved(mb)};
  if (n.kind != NodeKind::kExperts || model.moe_wgrad_merge <= 1) return wm;
  MergeGroup& g = merges[{stage, k}];
  const ExpertMergeBytes& b = n.merge_bytes(mb);
  ++g.passes;
  ++g.waiting;
  g.gathered += b.gathered;
  if (g.passes < schedule.num_microbatches && g.waiting < model.moe_wgrad_merge) {
    wm.products_of = 0;
    wm.activation = b.waiting;  // x_in, act and the counts stay; d_y and d_gate_up join them
    g.held += n.weight_saved(mb) + b.waiting;
    return wm;
  }
  wm.products_of = g.waiting;
  if (g.waiting > 1) wm.workspace += g.gathered;
  wm.activation -= g.held;
  g = MergeGroup{.waiting = 0, .passes = g.passes, .held = 0, .gathered = 0};
  return wm;
}

void SimState::memory(int32_t rank, double time, int64_t delta, MemKind kind, NodeKind node) {
  if (delta != 0) ranks[rank].mem.push_back({time, delta, kind, node});
}

Span SimState::node_span(int32_t index, const Action& a, const StageNode& n, Phase phase) {
  Span s;
  s.action = index;
  s.layer = n.layer;
  s.stage = a.stage;
  s.microbatch = a.microbatch;
  s.kind = SpanKind::kNode;
  s.phase = phase;
  s.node = n.kind;
  return s;
}

Span SimState::message_span(int32_t index, const Action& a) {
  Span s;
  s.action = index;
  s.stage = a.stage;
  s.microbatch = a.microbatch;
  s.kind = a.kind == ActionKind::kSendF || a.kind == ActionKind::kSendB ? SpanKind::kSend
                                                                        : SpanKind::kRecv;
  s.stream = Stream::kComm;
  s.phase = a.kind == ActionKind::kSendF || a.kind == ActionKind::kRecvF ? Phase::kForward
                                                                         : Phase::kBackwardInput;
  return s;
}

HalfRun::HalfRun(SimState& sim, int32_t rank, int32_t index, const Action& half)
    : sim_(sim), rank_(rank), index_(index), half_(half), stage_(sim.model.stages[half.stage]) {
  const Schedule& s = sim.schedule;
  const int32_t st = half.stage, mb = half.microbatch;
  if (half.kind == ActionKind::kForward) {
    if (st > 0) {
      ready_ = s.stage_rank[st - 1] == rank ? sim.fwd_out[sim.cell(st - 1, mb)]
                                            : sim.recv_f[sim.cell(st, mb)];
    }
  } else {
    ready_ = sim.fwd_out[sim.cell(st, mb)];
    if (st + 1 < s.num_stages) {
      ready_ = std::max(ready_, s.stage_rank[st + 1] == rank ? sim.bwd_out[sim.cell(st + 1, mb)]
                                                             : sim.recv_b[sim.cell(st, mb)]);
    }
  }
  last_ = ready_;
}

void HalfRun::start_not_before(double t) {
  ready_ = std::max(ready_, t);
  last_ = std::max(last_, ready_);
}

void HalfRun::node_beside(int32_t k, double after) {
  const double chain = ready_;
  ready_ = after;
  node(k);
  ready_ = chain;
}

// Note [Document masks in the plan]: with Megatron-LM's document options each stage forms its
// micro-batch's masks (4 bytes a token each: Note [Document masks on the device] in
// runtime/step.cc) in one buffer of the training device (on the CPU the host buffer they are
// formed in) as its forward begins, and the trainers drop it when the micro-batch's backward on
// that stage is done (the input-gradient half where the weights' is split off: no weight
// gradient reads the masks). The plan holds them over the same span, as in-flight bytes: batch
// inputs, as the messages are, which no node saves.
void HalfRun::node(int32_t k) {
  const StageNode& n = stage_.nodes[k];
  const bool forward = half_.kind == ActionKind::kForward;
  // Note [Deferred update in the plan] (simulator.cc): the weights this node reads first.
  const std::vector<int64_t>& ends = sim_.weight_ends[static_cast<size_t>(stage_.index)];
  if (n.stream == Stream::kCompute) {
    sim_.update(rank_, stage_.index, forward ? ends[k] : stage_.num_params,
                SimState::node_span(index_, half_, n, Phase::kForward));
  }
  const bool has_input = forward ? stage_.index > 0 : stage_.index + 1 < sim_.schedule.num_stages;
  // Note [Offload in the plan]: the node's layer among the stage's, and whether the node ends it
  // (its last in forward order, its first in backward order).
  const int32_t layer = n.layer >= 0 ? n.layer - stage_.first_layer : -1;
  const bool ends_layer = layer >= 0 && k + 1 == stage_.layer_node[layer + 1];
  const int32_t mb = half_.microbatch;
  // The readmissions run on the compute stream (after its earlier work: a weight gradient
  // issued beside the chain too), the copy-back waits on the node's own.
  if (!forward && n.kind == NodeKind::kLoss && stage_.num_layers > 0) {
    sim_.bring_back(rank_, stage_, mb, stage_.num_layers - 1,
                    sim_.start_time(rank_, Stream::kCompute, ready_));
  } else if (!forward && ends_layer) {
    const double t = sim_.start_time(rank_, Stream::kCompute, ready_);
    if (const double back = sim_.wait_back(rank_, stage_, mb, layer, t); back >= 0) {
      ready_ = std::max(ready_, back);
    }
    if (layer > 0) sim_.bring_back(rank_, stage_, mb, layer - 1, t);
  }
  const double start = sim_.start_time(rank_, n.stream, ready_);
  double end = 0;
  if (forward && done_ == 0) {  // Note [Document masks in the plan]
    sim_.memory(rank_, start, stage_.document_mask_bytes, MemKind::kInFlight);
  }
  if (forward) {
    Span span = SimState::node_span(index_, half_, n, Phase::kForward);
    span.wait = n.wait.forward_s;
    end = sim_.issue(rank_, n.stream, ready_, n.times.forward_s, span);
    if (done_ == 0) hold_tokens(start);
    // Saved bytes before the workspace goes: the phase's peak holds both
    // (Note [Node workspace] in core/footprint.h).
    sim_.memory(rank_, start, n.workspace.forward, MemKind::kWorkspace);
    sim_.memory(rank_, end, n.saved(half_.microbatch), MemKind::kActivation, n.kind);
    sim_.memory(rank_, end, -n.workspace.forward, MemKind::kWorkspace);
    if (ends_layer) sim_.send_out(rank_, stage_, mb, layer, end);
    last_ = std::max(last_, end);
  } else {
    Span span = SimState::node_span(index_, half_, n, Phase::kBackwardInput);
    span.wait = n.wait.backward_input_s;
    end = sim_.issue(rank_, n.stream, ready_, n.times.backward_input_s, span);
    // The gradient the stage received is in flight until this node ends, not workspace.
    const int64_t ws =
        n.workspace.backward_input - (done_ == 0 && has_input ? n.workspace.incoming_grad : 0);
    sim_.memory(rank_, start, ws, MemKind::kWorkspace);
    sim_.memory(rank_, end, -ws, MemKind::kWorkspace);
    const bool weights = node_has_weights(n.kind);
    // What only the input gradient needed goes when it ends (before a W's workspace comes), the
    // rest with the weight gradient (here for a full B, at its W action for an I), as the nodes
    // release them. The difference may be negative: recomputed experts keep an act they formed
    // in the backward.
    if (weights) {
      sim_.memory(rank_, end, -(n.saved(mb) - n.weight_saved(mb)), MemKind::kActivation, n.kind);
    }
    double release = end;
    if (half_.kind == ActionKind::kBackward && weights) {
      const double w_start = sim_.start_time(rank_, Stream::kCompute, end);
      const SimState::WeightPass wm = sim_.weight_pass(half_.stage, k, n, mb);
      release = sim_.issue(rank_, Stream::kCompute, end,
                           n.times.backward_weight_s * static_cast<double>(wm.products_of),
                           SimState::node_span(index_, half_, n, Phase::kBackwardWeight));
      sim_.weight_done(rank_, index_, half_, k, release);
      // Note [Node workspace]: what the I passed on is still held.
      const int64_t held = wm.workspace + n.workspace.handed;
      sim_.memory(rank_, w_start, held, MemKind::kWorkspace);
      sim_.memory(rank_, release, -held, MemKind::kWorkspace);
      sim_.memory(rank_, release, wm.activation, MemKind::kActivation, n.kind);
    }
    if (half_.kind == ActionKind::kBackwardInput && weights) {
      // What the I keeps for its W (the W phase's figure: Note [Node workspace]) is held from
      // the I's end until the W action (SimState::run_weight), whatever runs between them.
      sim_.memory(rank_, end, n.workspace.backward_weight, MemKind::kWorkspace);
    }
    if (!weights) sim_.memory(rank_, release, -n.saved(mb), MemKind::kActivation, n.kind);
    last_ = std::max(last_, release);
    // The CPU trainer runs a full B's weight half inside the node's work, before the next node
    // (runtime/stream_executor.cc); the GPU's goes off the chain.
    if (sim_.model.cpu_trainer) end = release;
  }
  // The received (or handed-over) tensor becomes the first node's own; its buffer goes.
  if (done_ == 0 && has_input) sim_.memory(rank_, end, -stage_.message_bytes, MemKind::kInFlight);
  ready_ = end;
  ++done_;
  if (forward && cover_ && n.stream == Stream::kComm) {
    const int64_t upto =
        update_beside_all_to_all(ends, static_cast<size_t>(k), stage_.num_params,
                                 [&](size_t i) { return stage_.nodes[i].stream == Stream::kComm; });
    sim_.update(rank_, stage_.index, upto, SimState::node_span(index_, half_, n, Phase::kForward));
  }
}

// Note [Tokens in the plan]: on the CPU the training device's memory holds the micro-batches'
// tokens too. The runtime (PipelineTrainer::prepare_forward) loads a micro-batch's ids and
// targets [N] i32 as a stage's forward begins, when the stage is the first or the last (every
// stage with document masks, which it forms from the ids), keeps the ids on the first stage and
// the targets on the last in the micro-batch's state, frees the others at once, and frees the
// kept ones when the step's forward-backward ends (the embed and loss nodes save copies of their
// own). The plan holds them as in flight from the forward's first node until the rank's last
// event. On the GPU they are host memory, beside the device's.
void HalfRun::hold_tokens(double t) {
  if (stage_.tokens_loaded_bytes == 0) return;
  sim_.memory(rank_, t, stage_.tokens_loaded_bytes, MemKind::kInFlight);
  sim_.memory(rank_, t, stage_.tokens_held_bytes - stage_.tokens_loaded_bytes, MemKind::kInFlight);
  sim_.ranks[rank_].tokens_held += stage_.tokens_held_bytes;
}

void HalfRun::finish(double not_before) {
  const size_t c = sim_.cell(half_.stage, half_.microbatch);
  RankState& st = sim_.ranks[rank_];
  if (half_.kind == ActionKind::kForward) {
    const double out = std::max(ready_, not_before);
    sim_.fwd_out[c] = out;
    if (stage_.index + 1 < sim_.schedule.num_stages) {
      sim_.memory(rank_, out, stage_.message_bytes, MemKind::kInFlight);
    }
    st.live.push_back({out, +1});
    return;
  }
  // A full backward publishes its input gradient when the whole action (weight halves too) is
  // done: the list's SEND follows the B, as in PyTorch's and Megatron's executors.
  const double out = std::max(half_.kind == ActionKind::kBackward ? last_ : ready_, not_before);
  sim_.bwd_out[c] = out;
  // Note [Document masks in the plan]: dropped as the trainers drop them, after the action.
  sim_.memory(rank_, half_.kind == ActionKind::kBackward ? last_ : ready_,
              -stage_.document_mask_bytes, MemKind::kInFlight);
  if (stage_.index > 0) sim_.memory(rank_, out, stage_.message_bytes, MemKind::kInFlight);
  if (half_.kind == ActionKind::kBackward) st.live.push_back({last_, -1});
}

}  // namespace tandem::schedule
