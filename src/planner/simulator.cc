// The simulator's driver: runs every rank's list, node by node, on two in-order streams.
//
// Note [Simulation model]
//  - Each rank issues its actions in list order to two streams, compute and comm, that run
//    in order (like CUDA streams); the host never blocks. A node starts when its stream is free
//    and the node it reads from has ended (one dependency per data edge, across streams).
//    Dispatch and combine run on comm with EP > 1; with one expert rank they are a local
//    permutation and weighted sum on compute, as the runtime issues them.
//  - F runs the stage's nodes in order, B/I in reverse (a node's I, then its W when the
//    backward is full); W runs the weight halves. FB interleaves a forward layer with a backward
//    layer per docs/design.md's combined 1F1B order (kPairMoe / kPairDense below), so all-to-all
//    of one half overlaps matrix work of the other; FF interleaves two forwards' layers the same
//    way (kForwardsMoe). Under uniform costs the pair is one unit:
//    both halves start once both inputs are there (as the executor, which receives both before
//    it runs the pair, so its memory changes in the runtime's order) and publish together.
//  - SEND runs on the sender's comm stream once its tensor exists: latency + bytes / link.
//    RECV occupies the receiver's comm stream from when both the stream is free and the send
//    has started, until the send has ended. A send never waits for its receive to be posted.
//  - Note [Deferred update in the plan]: with PipelineModel::defer_optimizer (--defer-optimizer,
//    Note [The update beside the first forward] in runtime/deferred_update.cc) each stage's
//    weights are updated in its first forward: before each compute node, the weights it is the
//    first to read (StageNode::params) at update_s_per_param each, on the compute stream as soon
//    as it is free (an "update" span); and in a forward that runs alone with EP > 1, right after
//    each all-to-all, the next compute node's weights and half of the one after's, as the
//    runtime issues them. A stage that receives its input (RECV_F) updates all its weights at
//    the receive, while it waits, and the receive starts after that update. The planner models
//    no update at the step's end (it times forward and backward only), so the deferred plan's
//    step holds the update and the other does not.
//  - Note [Gradient reduction in the plan]: with PipelineModel::data_parallel_size ranks per
//    stage each stage's gradients are all-reduced in units (Stage::grad_units: the embedding,
//    each layer, the head; the experts' part over DP / EP ranks, the rest over DP, f32, a ring's
//    time at the link's or the measured bus bandwidth) on a third stream per rank, reduce, that
//    runs in order as the GPU runtime's (Note [Gradients reduced beside the backward] in
//    runtime/grad_reduce.cc): with overlap_grad_reduce a unit's all-reduce is issued when its
//    step's last weight gradient ends (the counts of the runtime: weighted nodes x
//    micro-batches), otherwise all units after the rank's forward-backward. It reads nothing the
//    other streams write later and holds no memory beyond the gradients (static), so it never
//    delays them: RankResult::end_s and SimResult::step_time_s stay the forward-backward's (the
//    runtime's forward_backward_s), and grad_reduce_end_s / step_with_reduce_s add the
//    reduction. Not modelled: the all-reduce's kernels slowing the compute beside them, and the
//    links it shares with the all-to-all and pipeline messages.
//  - Note [The step's end in the plan]: after its forward-backward and its all-reduce each rank
//    computes the gradient norm (a read of every f32 gradient at the memory bandwidth) and,
//    unless deferred, updates its weights (at update_s_per_param each); full_step_s adds both,
//    the plan's figure for a run's step_seconds. Not modelled: the host's waits at the step's
//    end (losses and norm read back, the norm's all-reduce); a node-times file's measured
//    step end includes them.
//  - Memory (docs/schedules.md "Memory accounting"): a node's saved bytes are held from
//    the end of its forward to the end of its backward, or of its W when the backward is split
//    (nodes without weights: to the end of their I). A stage's output is held from the end of
//    its forward (or input-gradient) until its SEND ends or the next stage on the same rank has
//    consumed it; a received tensor from the start of its RECV until the first node that
//    consumes it has ended. A node's op temporaries (GPU plans, Note [Node workspace] in
//    core/footprint.h) are held on its stream from the start to the end of each phase.
#include "planner/simulator.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "planner/simulator_state.h"

namespace tandem::schedule {
namespace {

struct PairStep {
  enum class Half : uint8_t { kF, kB } half;
  int32_t pos;  // node position within the layer
};
// docs/design.md "Combined 1F1B", per layer pair (MoE positions: attention 0, dispatch 1,
// experts 2, combine 3). Compute stream: attn.f, experts.b(+w), experts.f, attn.b; comm stream:
// combine.b, dispatch.f, dispatch.b, combine.f.
constexpr std::array<PairStep, 8> kPairMoe = {{{PairStep::Half::kB, 3},
                                               {PairStep::Half::kF, 0},
                                               {PairStep::Half::kF, 1},
                                               {PairStep::Half::kB, 2},
                                               {PairStep::Half::kB, 1},
                                               {PairStep::Half::kF, 2},
                                               {PairStep::Half::kF, 3},
                                               {PairStep::Half::kB, 0}}};
constexpr std::array<PairStep, 4> kPairDense = {{{PairStep::Half::kF, 0},
                                                 {PairStep::Half::kB, 1},
                                                 {PairStep::Half::kF, 1},
                                                 {PairStep::Half::kB, 0}}};
// Note [Shared expert in a pair]: a MoE layer with a shared expert (attention 0, dispatch 1,
// shared expert 2, experts 3, combine 4) pairs as the plain MoE layer, with the shared experts'
// products where an all-to-all is in flight: compute attn.f, experts.b, shared.b, shared.f,
// experts.f, attn.b; comm combine.b, dispatch.f, dispatch.b, combine.f. The shared experts hang
// off their half's chain instead of extending it: shared.f waits for attn.f only, not for
// dispatch.f, and dispatch.b waits for experts.b, not for shared.b (which needs combine.b's
// gradient). The runtime issues a pair so too (runtime/combined.cc).
void run_shared_pair(HalfRun& f, int32_t fl, HalfRun& b, int32_t bl) {
  b.node(bl + 4);  // combine.b
  f.node(fl);      // attention.f
  const double after_attention = f.ready();
  f.node(fl + 1);                          // dispatch.f
  b.node(bl + 3);                          // experts.b
  b.node_beside(bl + 2, b.ready());        // shared.b, beside dispatch.f
  f.node_beside(fl + 2, after_attention);  // shared.f, beside dispatch.b
  b.node(bl + 1);                          // dispatch.b
  f.node(fl + 3);                          // experts.f
  f.node(fl + 4);                          // combine.f
  b.node(bl);                              // attention.b
}

// Runs layer i of h's stage: its nodes in forward order, or backward in reverse.
void run_layer(HalfRun& h, int32_t i, bool forward) {
  const Stage& s = h.stage();
  const int32_t size = s.layer_size(i);
  for (int32_t p = 0; p < size; ++p) h.node(s.layer_node[i] + (forward ? p : size - 1 - p));
}

void run_pairs(HalfRun& f, HalfRun& b) {
  const Stage& fs = f.stage();
  const Stage& bs = b.stage();
  const int32_t n = std::min(fs.num_layers, bs.num_layers);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t bi = bs.num_layers - 1 - i;
    auto steps = [&](const auto& table) {
      for (const PairStep& st : table) {
        if (st.half == PairStep::Half::kF)
          f.node(fs.layer_node[i] + st.pos);
        else
          b.node(bs.layer_node[bi] + st.pos);
      }
    };
    const int32_t fsize = fs.layer_size(i), bsize = bs.layer_size(bi);
    if (fsize != bsize) {  // a MoE layer beside a dense one: one after the other
      run_layer(f, i, true);
      run_layer(b, bi, false);
    } else if (fsize == 5) {
      run_shared_pair(f, fs.layer_node[i], b, bs.layer_node[bi]);
    } else if (fsize == 4) {
      steps(kPairMoe);
    } else {
      steps(kPairDense);
    }
  }
  for (int32_t i = n; i < fs.num_layers; ++i) run_layer(f, i, true);
  if (fs.has_loss()) f.node(static_cast<int32_t>(fs.nodes.size()) - 1);
  for (int32_t i = bs.num_layers - 1 - n; i >= 0; --i) run_layer(b, i, false);
  if (bs.has_embed()) b.node(0);
}

// Note [Paired forwards] in action.h: two forwards layer by layer (MoE positions as above).
// Compute stream: attn.f, attn.g, experts.f, experts.g; comm stream: dispatch.f, dispatch.g,
// combine.f, combine.g. A dense layer runs f's nodes, then g's.
struct ForwardStep {
  bool second;
  int32_t pos;
};
constexpr std::array<ForwardStep, 8> kForwardsMoe = {
    {{false, 0}, {true, 0}, {false, 1}, {false, 2}, {true, 1}, {true, 2}, {false, 3}, {true, 3}}};

void run_forward_pairs(HalfRun& f, HalfRun& g) {
  const Stage& fs = f.stage();
  const Stage& gs = g.stage();
  const int32_t n = std::max(fs.num_layers, gs.num_layers);
  auto layer = [](HalfRun& h, int32_t i, int32_t pos) {
    const Stage& s = h.stage();
    if (i < s.num_layers) h.node(s.layer_node[i] + pos);
  };
  if (fs.has_embed()) f.node(0);
  if (gs.has_embed()) g.node(0);
  for (int32_t i = 0; i < n; ++i) {
    if (i < fs.num_layers && i < gs.num_layers && fs.layer_size(i) == 4 && gs.layer_size(i) == 4) {
      for (const ForwardStep& st : kForwardsMoe) layer(st.second ? g : f, i, st.pos);
      continue;
    }
    if (i < fs.num_layers) run_layer(f, i, true);
    if (i < gs.num_layers) run_layer(g, i, true);
  }
  if (fs.has_loss()) f.node(static_cast<int32_t>(fs.nodes.size()) - 1);
  if (gs.has_loss()) g.node(static_cast<int32_t>(gs.nodes.size()) - 1);
}

}  // namespace

void SimState::run_combined(int32_t r, int32_t index, const Action& a) {
  HalfRun f(*this, r, index, a.first_half());
  HalfRun b(*this, r, index, a.second_half());
  const bool atomic = model.cost_kind == CostModelKind::kUniform;
  if (atomic) {  // one unit, Note [Simulation model]: it starts once both inputs are there
    const double start = std::max(f.ready(), b.ready());
    f.start_not_before(start);
    b.start_not_before(start);
  }
  if (a.kind == ActionKind::kForwardForward) {
    run_forward_pairs(f, b);
  } else {
    if (b.stage().has_loss()) b.node(static_cast<int32_t>(b.stage().nodes.size()) - 1);
    if (f.stage().has_embed()) f.node(0);
    run_pairs(f, b);
  }
  // Real costs: each half publishes as soon as its own nodes are done (the forward's output
  // leaves while the backward still runs). Uniform costs: the pair is one unit, as in theory.
  const double atomic_end = atomic ? std::max(f.last_end(), b.last_end()) : 0;
  f.finish(atomic_end);
  b.finish(atomic_end);
}

void SimState::run_single(int32_t r, int32_t index, const Action& a) {
  HalfRun h(*this, r, index, a);
  if (a.kind == ActionKind::kForward && model.expert_parallel_size > 1) {
    h.set_update_beside_all_to_all();  // Note [Deferred update in the plan]
  }
  const auto n = static_cast<int32_t>(h.stage().nodes.size());
  if (a.kind == ActionKind::kForward) {
    for (int32_t k = 0; k < n; ++k) h.node(k);
  } else {
    for (int32_t k = n - 1; k >= 0; --k) h.node(k);
  }
  h.finish();
}

void SimState::run_weight(int32_t r, int32_t index, const Action& a) {
  const Stage& stage = model.stages[a.stage];
  const double ready = bwd_out[cell(a.stage, a.microbatch)];
  double last = ready;
  for (auto k = static_cast<int32_t>(stage.nodes.size()) - 1; k >= 0; --k) {
    const StageNode& n = stage.nodes[k];
    if (!node_has_weights(n.kind)) continue;
    const double start = start_time(r, Stream::kCompute, ready);
    const WeightPass wm = weight_pass(a.stage, k, n, a.microbatch);
    last = issue(r, Stream::kCompute, ready,
                 n.times.backward_weight_s * static_cast<double>(wm.products_of),
                 node_span(index, a, n, Phase::kBackwardWeight));
    // What the node's I kept for this W (HalfRun::node) becomes the W's own figure.
    memory(r, start, -n.workspace.backward_weight, MemKind::kWorkspace);
    memory(r, start, wm.workspace, MemKind::kWorkspace);
    memory(r, last, -wm.workspace, MemKind::kWorkspace);
    memory(r, last, wm.activation, MemKind::kActivation, n.kind);
    weight_done(r, index, a, k, last);
  }
  ranks[r].live.push_back({last, -1});
}

void SimState::run_send(int32_t r, int32_t index, const Action& a) {
  const size_t c = cell(a.stage, a.microbatch);
  const bool fwd = a.kind == ActionKind::kSendF;
  const Stage& stage = model.stages[a.stage];
  Span proto = message_span(index, a);
  const double ready = fwd ? fwd_out[c] : bwd_out[c];
  const double start = std::max(ranks[r].free[1], ready);
  const double end = issue(r, Stream::kComm, ready, stage.message_s, proto);
  if (model.cpu_trainer) {
    ranks[r].sends_held += stage.message_bytes;  // until a RECV releases it
  } else {
    memory(r, end, -stage.message_bytes, MemKind::kInFlight);
  }
  (fwd ? send_f : send_b)[c] = {start, end};
  int32_t& waiter = (fwd ? waiter_f : waiter_b)[c];
  if (waiter >= 0) work.push_back(waiter);
  waiter = -1;
}

bool SimState::run_recv(int32_t r, int32_t index, const Action& a) {
  const bool fwd = a.kind == ActionKind::kRecvF;
  const int64_t all = model.stages[a.stage].num_params;
  if (fwd && updated[static_cast<size_t>(a.stage)] < all) {
    // Note [Deferred update in the plan]: the receiving stage updates its weights while it
    // waits; the receive is enqueued after the update (the runtime orders it after the compute
    // stream's work).
    update(r, a.stage, all, message_span(index, a));
    recv_after[cell(a.stage, a.microbatch)] = ranks[r].free[0];
  }
  const size_t from = cell(fwd ? a.stage - 1 : a.stage + 1, a.microbatch);
  const Interval sent = (fwd ? send_f : send_b)[from];
  if (sent.end < 0) {
    (fwd ? waiter_f : waiter_b)[from] = r;
    return false;
  }
  RankState& st = ranks[r];
  const double start = std::max({st.free[1], sent.start, recv_after[cell(a.stage, a.microbatch)]});
  const double end = std::max(start, sent.end);
  if (end > start) {
    Span s = message_span(index, a);
    s.start = start;
    s.end = end;
    st.spans.push_back(s);
  }
  st.free[1] = end;
  // The CPU trainer runs its list one action after another: the RECV takes its buffer once the
  // compute before it has run, and lets the sends it proves delivered go once it has received.
  const bool cpu = model.cpu_trainer;
  const double taken = cpu ? std::max(start, st.free[0]) : start;
  memory(r, taken, model.stages[a.stage].message_bytes, MemKind::kInFlight);
  (fwd ? recv_f : recv_b)[cell(a.stage, a.microbatch)] = end;
  if (cpu) {  // Note [Send buffers released when known delivered]
    for (const int32_t send : releases[static_cast<size_t>(r)][static_cast<size_t>(index)]) {
      const Action& s = schedule.ranks[static_cast<size_t>(r)][static_cast<size_t>(send)];
      const int64_t bytes = model.stages[static_cast<size_t>(s.stage)].message_bytes;
      memory(r, std::max(end, taken), -bytes, MemKind::kInFlight);
      st.sends_held -= bytes;
    }
  }
  return true;
}

bool SimState::advance(int32_t r) {
  RankState& st = ranks[r];
  const auto& list = schedule.ranks[r];
  for (; st.pc < list.size(); ++st.pc) {
    const Action& a = list[st.pc];
    const auto index = static_cast<int32_t>(st.pc);
    switch (a.kind) {
      case ActionKind::kForward:
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        run_single(r, index, a);
        break;
      case ActionKind::kBackwardWeight:
        run_weight(r, index, a);
        break;
      case ActionKind::kForwardBackward:
      case ActionKind::kForwardForward:
        run_combined(r, index, a);
        break;
      case ActionKind::kSendF:
      case ActionKind::kSendB:
        run_send(r, index, a);
        break;
      case ActionKind::kRecvF:
      case ActionKind::kRecvB:
        if (!run_recv(r, index, a)) return false;
        break;
    }
  }
  return true;
}

SimResult simulate(const Schedule& schedule, const PipelineModel& model) {
  TANDEM_ASSERT(static_cast<int32_t>(model.stages.size()) == schedule.num_stages,
                "simulate: the pipeline model has ", model.stages.size(), " stages, the schedule ",
                schedule.num_stages);
  SimState sim(schedule, model);
  for (int32_t r = schedule.num_ranks - 1; r >= 0; --r) sim.work.push_back(r);
  while (!sim.work.empty()) {
    const int32_t r = sim.work.back();
    sim.work.pop_back();
    sim.advance(r);
  }
  for (int32_t r = 0; r < schedule.num_ranks; ++r) {
    TANDEM_ASSERT(sim.ranks[r].pc == schedule.ranks[r].size(), "simulate: rank ", r,
                  " is blocked; validate_schedule must run first");
  }
  sim.reduce_at_end();  // Note [Gradient reduction in the plan]
  return summarize(sim);
}

}  // namespace tandem::schedule
