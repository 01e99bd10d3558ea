// Internal to the simulator (simulator*.cc): the state of a run and the node-by-node runner of
// one forward or backward half. Not part of the library's interface.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <tuple>
#include <vector>

#include "planner/simulator.h"
#include "schedule/send_release.h"

namespace tandem::schedule {

// kWorkspace: a node phase's op temporaries (Note [Node workspace] in core/footprint.h).
enum class MemKind : uint8_t { kActivation, kInFlight, kWorkspace };

struct MemEvent {
  double time;
  int64_t delta;
  MemKind kind;
  NodeKind node;  // kActivation: whose saved bytes
};

struct Interval {
  double start = -1;
  double end = -1;  // < 0: not simulated yet
};

struct RankState {
  std::array<double, 3> free{0, 0, 0};  // when each stream (compute, comm, reduce) is next free
  // Note [Offload in the plan]: when the copy engines (to the host, from it) are next free, and
  // the host bytes of offloaded activations over time.
  std::array<double, 2> copy_free{0, 0};
  std::vector<std::pair<double, int64_t>> host;
  std::vector<Span> spans;
  std::vector<MemEvent> mem;
  std::vector<std::pair<double, int>> live;  // (time, +1 / -1) per (stage, micro-batch)
  int64_t tokens_held = 0;  // Note [Tokens in the plan] (simulator_state.cc): until the step ends
  // Note [Send buffers released when known delivered] (schedule/send_release.cc): the bytes of
  // the sends no RECV of the rank releases, held until the step ends.
  int64_t sends_held = 0;
  size_t pc = 0;
};

struct SimState {
  SimState(const Schedule& s, const PipelineModel& m);

  const Schedule& schedule;
  const PipelineModel& model;
  std::vector<RankState> ranks;
  // Per (stage, micro-batch), indexed by cell(): when the forward output / input gradient is
  // ready, when the RECVs ended, and the SENDs' intervals; -1 until simulated.
  std::vector<double> fwd_out, bwd_out, recv_f, recv_b;
  std::vector<Interval> send_f, send_b;
  std::vector<int32_t> waiter_f, waiter_b;  // rank blocked on that SEND, or -1
  std::vector<int32_t> work;                // ranks that may advance
  // With PipelineModel::cpu_trainer: where each SEND's buffer goes.
  SendReleases releases;
  // Note [Deferred update in the plan] (simulator.cc): per stage, the weights updated so far
  // (all of them when nothing is deferred), and per node the end of the weights it and the
  // nodes before it read.
  std::vector<int64_t> updated;
  std::vector<std::vector<int64_t>> weight_ends;
  std::vector<double> recv_after;  // per cell: a RECV_F starts after the update issued at it
  // Note [Gradient reduction in the plan] (simulator.cc): per stage and unit, the weight
  // gradients still to come this step (Stage::grad_units' weighted nodes x micro-batches).
  std::vector<std::vector<int64_t>> unit_pending;

  // Note [Offload in the plan]: per (stage, micro-batch, layer of the stage) sent out, when its
  // copy to the host ends and (once brought back) when its copy back ends.
  struct Offloaded {
    double out_done = 0, in_done = -1;
  };
  std::map<std::tuple<int32_t, int32_t, int32_t>, Offloaded> offloaded;
  int64_t move_offloaded(int32_t rank, const Stage& stage, int32_t mb, int32_t layer, double t,
                         int sign);
  void send_out(int32_t rank, const Stage& stage, int32_t mb, int32_t layer, double t);
  void bring_back(int32_t rank, const Stage& stage, int32_t mb, int32_t layer, double t);
  // Brings the layer back at t if not yet; returns when its copy back ends (-1: nothing of the
  // layer is out).
  double wait_back(int32_t rank, const Stage& stage, int32_t mb, int32_t layer, double t);

  size_t cell(int32_t stage, int32_t mb) const {
    return static_cast<size_t>(stage) * schedule.num_microbatches + mb;
  }
  // When work put on a stream after `ready` would start.
  double start_time(int32_t rank, Stream stream, double ready) const {
    return std::max(ranks[rank].free[static_cast<int>(stream)], ready);
  }
  // Puts `duration` of work on a stream after `ready`; records a span if it takes time.
  double issue(int32_t rank, Stream stream, double ready, double duration, Span proto);
  void memory(int32_t rank, double time, int64_t delta, MemKind kind,
              NodeKind node = NodeKind::kEmbed);
  static Span node_span(int32_t index, const Action& a, const StageNode& n, Phase phase);
  // The deferred update of `stage`'s weights up to `upto`, on the compute stream as soon as it
  // is free; the span as `proto` says (its kind becomes kUpdate).
  void update(int32_t rank, int32_t stage, int64_t upto, Span proto);
  static Span message_span(int32_t index, const Action& a);
  // Node `node` of `stage` wrote a weight gradient of one micro-batch, ending at `t`, in action
  // `index`: with the overlap on, the unit it completes is all-reduced from then on.
  void weight_done(int32_t rank, int32_t index, const Action& a, int32_t node, double t);
  // Without the overlap: every rank's units all-reduced after its forward-backward.
  void reduce_at_end();
  // Note [Merged expert weight gradients in the plan] (simulator_state.cc): per (stage, node),
  // the micro-batches whose experts' weight gradient waits, the activation bytes they hold and
  // their part of the gathered buffers, and the node's weight-gradient passes this step.
  struct MergeGroup {
    int64_t waiting = 0, passes = 0, held = 0, gathered = 0;
  };
  std::map<std::pair<int32_t, int32_t>, MergeGroup> merges;
  // Node k's weight-gradient pass of micro-batch mb: the micro-batches whose products it runs
  // (1 without merging; 0 when it sets its own aside), its workspace while it runs, and the
  // change in activation bytes when it ends.
  struct WeightPass {
    int64_t products_of = 1, workspace = 0, activation = 0;
  };
  WeightPass weight_pass(int32_t stage, int32_t k, const StageNode& n, int32_t mb);

  bool advance(int32_t rank);  // false when blocked on a RECV
  void run_single(int32_t rank, int32_t index, const Action& a);
  void run_combined(int32_t rank, int32_t index, const Action& a);
  void run_weight(int32_t rank, int32_t index, const Action& a);
  void run_send(int32_t rank, int32_t index, const Action& a);
  bool run_recv(int32_t rank, int32_t index, const Action& a);
};

// One half (F, B or I) of an action, run node by node: the chain of data edges through the
// stage's nodes, the saved bytes and the pipeline buffers it holds or frees.
class HalfRun {
 public:
  HalfRun(SimState& sim, int32_t rank, int32_t index, const Action& half);
  const Stage& stage() const { return stage_; }
  double ready() const { return ready_; }
  // Holds the half's first node back until `t` (a combined action that starts as one unit).
  void start_not_before(double t);
  void node(int32_t k);  // runs node k of the stage (forward, or input + weight backward)
  // Runs node k once `after` (not after the half's previous node), leaving the half's chain
  // where it was: a node beside the chain (Note [Shared expert in a pair] in simulator.cc).
  void node_beside(int32_t k, double after);
  // Publishes the output (and allocates its buffer) when the half's data is ready, or at
  // `not_before` if later (uniform costs treat a combined action as one atomic unit).
  void finish(double not_before = 0);
  double last_end() const { return last_; }
  // A forward that runs alone with expert parallelism: beside each all-to-all it updates part
  // of what the next nodes read (Note [Deferred update in the plan] in simulator.cc).
  void set_update_beside_all_to_all() { cover_ = true; }

 private:
  // Note [Tokens in the plan] (simulator_state.cc): the micro-batch's tokens at its forward's
  // start `t`.
  void hold_tokens(double t);

  SimState& sim_;
  int32_t rank_;
  int32_t index_;
  Action half_;
  const Stage& stage_;
  double ready_ = 0;  // when the tensor the next node reads is ready
  double last_ = 0;   // when the last span of this half ends
  int32_t done_ = 0;  // nodes run so far
  bool cover_ = false;
};

// Metrics of a finished run (simulator_metrics.cc).
SimResult summarize(SimState& sim);

}  // namespace tandem::schedule
