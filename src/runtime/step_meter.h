// Step measurement: the last step's timeline on this rank, its all-to-all seconds (busy,
// exposed, and exposed waiting for a later expert rank) and, on the GPU, the node times and
// rates the planner's --node-times reads (schedule::NodeTimesTable;
// Note [Node times over steps] in step_meter.cc).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "runtime/streams.h"
#include "runtime/timeline.h"
#include "schedule/node_times.h"

namespace tandem::runtime {

class StepMeter {
 public:
  using HostTime = std::chrono::steady_clock::time_point;

  // The step starts now: the figures of the last one are forgotten.
  void begin_step();
  // The step's measured times (Streams::times).
  void record(const StepTimes& t);
  // Note [Waiting for the slowest expert rank] (alltoall_wait.h): of the exposed all-to-all,
  // the part spent waiting for a later rank of `ep_group`; every rank of the group must call it.
  void record_waiting(const StepTimes& t, comm::Communicator& ep_group);
  // Note [The step's end in the plan] (planner/simulator.cc): the host's step past the
  // forward-backward and the all-reduce, per weight of this rank's stages.
  void record_step_end(const StepTimes& t, double step_seconds, int64_t weights,
                       bool defer_optimizer);

  HostTime step_start() const { return start_; }
  // Steady-clock seconds at which the step started (the timeline's zero).
  double step_start_seconds() const;
  const std::vector<Span>& timeline() const { return spans_; }
  double comm_busy_seconds() const { return busy_s_; }
  double comm_exposed_seconds() const { return exposed_s_; }
  double comm_exposed_waiting_seconds() const { return waiting_s_; }  // < 0: not measured
  // The last step's rates with each node phase's median over the steps
  // (Note [Node times over steps]).
  schedule::NodeTimesTable node_times() const;
  double forward_backward_seconds() const { return fb_s_; }

 private:
  HostTime start_;
  std::vector<Span> spans_;
  double busy_s_ = 0, exposed_s_ = 0, waiting_s_ = -1, fb_s_ = 0;
  schedule::NodeTimesTable node_times_;
  // The node times of the steps after the first, the last kNodeSteps of them
  // (Note [Node times over steps]).
  static constexpr size_t kNodeSteps = 64;
  int64_t steps_ = 0;
  std::vector<std::array<std::optional<schedule::NodePhaseTimes>, kNumNodeKinds>> node_steps_;
};

}  // namespace tandem::runtime
