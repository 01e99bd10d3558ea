// The simulator: runs a validated schedule on a compute and a communication stream per rank,
// node by node, with a dependency per data edge, and gives each rank's timeline, busy and bubble
// fractions, exposed communication and memory curve. Note [Simulation model] in simulator.cc.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "planner/pipeline_model.h"
#include "schedule/action.h"
#include "schedule/intervals.h"

namespace tandem::schedule {

// kUpdate: a piece of a deferred optimizer update (Note [Deferred update in the plan] in
// simulator.cc), on the compute stream before the node `node` names. kReduce: one gradient
// unit's all-reduce on the reduce stream (Note [Gradient reduction in the plan]); `layer` names
// the unit, or with -1 `node` does (kEmbed: the embedding, kLoss: the head).
enum class SpanKind : uint8_t { kNode, kSend, kRecv, kUpdate, kReduce };
enum class Phase : uint8_t { kForward, kBackwardInput, kBackwardWeight };

// One interval of work on one stream of one rank.
struct Span {
  double start = 0;
  double end = 0;
  int32_t action = 0;  // index in the rank's list
  int32_t layer = -1;  // global layer; -1 for embed, loss and pipeline messages
  int32_t stage = 0;
  int32_t microbatch = 0;
  SpanKind kind = SpanKind::kNode;
  Stream stream = Stream::kCompute;
  Phase phase = Phase::kForward;
  NodeKind node = NodeKind::kEmbed;  // kind == kNode only
  double wait = 0;  // of [start, end), the first seconds waiting for the slowest expert rank
};

// Memory after a change: saved activations, in-flight pipeline buffers (received inputs and
// gradients not yet consumed, outputs not yet sent or handed to the next stage on the rank) and
// the running nodes' op temporaries (workspace; 0 unless the plan is for the GPU).
struct MemorySample {
  double time = 0;
  int64_t activation_bytes = 0;
  int64_t in_flight_bytes = 0;
  int64_t workspace_bytes = 0;
};

struct RankResult {
  int32_t rank = 0;
  std::vector<int32_t> stages;
  std::vector<Span> spans;           // compute, comm and reduce spans, each stream in time order
  std::vector<MemorySample> memory;  // starts at time 0 with nothing held
  RankMemory static_memory;          // parameters, gradients, optimizer state
  double end_s = 0;                  // when the rank's forward-backward ends (its last compute or
                                     // comm span; the gradient all-reduce aside)
  double compute_busy_s = 0;
  double comm_busy_s = 0;
  double busy_fraction = 0;       // compute busy / step time
  double bubble_fraction = 0;     // 1 - busy_fraction
  double exposed_comm_s = 0;      // communication while the compute stream is idle
  double exposed_alltoall_s = 0;  // the same, for dispatch and combine only
  // Of exposed_alltoall_s, the time only the all-to-alls' waits for the slowest expert rank were
  // in flight (the runtime's split, Note [Waiting for the slowest expert rank]).
  double exposed_alltoall_waiting_s = 0;
  // Note [Gradient reduction in the plan]: the rank's gradient all-reduce time, when its last
  // one ends (0: none), and how far that is past end_s (the step's tail the reduction adds).
  double grad_reduce_s = 0;
  double grad_reduce_end_s = 0;
  double grad_reduce_tail_s = 0;
  // Note [The step's end in the plan]: the gradient norm and the optimizer's update after both,
  // and when the rank's step ends with them.
  double step_end_work_s = 0;
  double full_step_end_s = 0;
  int64_t activation_peak_bytes = 0;
  int64_t in_flight_peak_bytes = 0;
  int64_t workspace_peak_bytes = 0;  // op temporaries (Note [Node workspace]), at their peak
  int64_t peak_bytes = 0;            // static + activations + in flight + workspace, at its peak
  // The three parts of peak_bytes beside the static memory, at peak_time_s (each may be below
  // its own peak, reached at another time): what the peak is made of.
  int64_t activation_at_peak_bytes = 0;
  int64_t in_flight_at_peak_bytes = 0;
  int64_t workspace_at_peak_bytes = 0;
  // Host bytes holding offloaded activations, at their peak (Note [Offload in the plan]).
  int64_t offload_host_peak_bytes = 0;
  double peak_time_s = 0;
  std::array<int64_t, kNumNodeKinds> activation_at_peak_by_node{};  // at peak_time_s
  int32_t peak_live_microbatches = 0;  // (stage, micro-batch) pairs between forward end and
                                       // backward end (W end when split), at most
};

struct SimResult {
  std::vector<RankResult> ranks;
  double step_time_s = 0;  // the last rank's end of forward and backward (RankResult::end_s)
  // The same with each rank's gradient all-reduce: the step but the norm and the optimizer's
  // update at its end (Note [Gradient reduction in the plan]).
  double step_with_reduce_s = 0;
  // ... and with the norm and the update at its end: the whole step
  // (Note [The step's end in the plan]).
  double full_step_s = 0;
  double bubble_fraction = 0;  // 1 - total compute busy / (ranks x step time)
};

// Simulates a schedule that validate_schedule accepted (it asserts on one that deadlocks).
SimResult simulate(const Schedule& schedule, const PipelineModel& model);

}  // namespace tandem::schedule
