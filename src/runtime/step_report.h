// What every rank measured in a step, gathered for the program's outputs (the progress line,
// --trace, --node-times-out, --routing-out). Each function is a collective over the world: every
// rank calls it. The program formats and writes what these return; the runtime does the
// gathering.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/node_times.h"
#include "schedule/routing_file.h"

namespace tandem::runtime {

// One rank's figures of a step.
struct RankFigures {
  double comm_s = 0;              // the all-to-alls' busy seconds
  double exposed_comm_s = 0;      // of those, while the compute stream was idle
  double exposed_waiting_s = -1;  // of those, waiting for the slowest expert rank; -1: unknown
  int64_t mem_in_use = 0;         // bytes at the step's end
  int64_t mem_peak = 0;           // the step's peak bytes
  int64_t activation_peak = 0;
  int64_t offload_host_peak = 0;  // host bytes of offloaded activations at their peak
};

struct StepReport {
  std::vector<RankFigures> ranks;  // by world rank, on every rank
  // How unevenly the step's routed rows fell on this rank's expert-parallel group (EP > 1; each
  // group gathers its own).
  std::optional<schedule::RowsSpread> expert_rows;
};

StepReport gather_step_report(PipelineTrainer& trainer, const StepResult& r);

// Every rank's trace events of the last step (rank_trace_events, from the allocator's trace,
// whose tracing this stops), by world rank, on rank 0 (empty elsewhere). `with_me` false: this
// rank's events are left out (--profile-ranks).
std::vector<std::string> gather_trace_events(PipelineTrainer& trainer, Allocator& alloc,
                                             bool with_me);

// The last step's node times on rank 0: each node kind's mean over the ranks that timed it (each
// rank times its own layers), the means of the deferred update's rate, the gradient all-reduce's
// bus bandwidth and the GPU's idle seconds before a node phase, and the least of the ranks' step
// end rates (Note [The step's end in the plan] in planner/simulator.cc: the rank that waited
// least for the others). Elsewhere: the rank's own.
schedule::NodeTimesTable gather_node_times(PipelineTrainer& trainer);

// Every rank's pipeline routing table of the last step, by world rank, on rank 0 (empty
// elsewhere).
std::vector<schedule::RoutingCounts> gather_routing(PipelineTrainer& trainer);

}  // namespace tandem::runtime
