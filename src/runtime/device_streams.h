// The GPU side of the pipeline trainer: its streams besides the compute stream (the pipeline's
// two, Note [Pipeline streams on the GPU] in distributed.cc, and the expert all-to-all's, at
// high priority), events per data edge, and the step's measured timeline from CUDA events
// (Note [Measured on the GPU]). Declared without CUDA's headers; a build without CUDA has only
// the declarations, and the trainer never makes one there.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "runtime/alltoall_wait.h"
#include "runtime/timeline.h"
#include "schedule/cost_model.h"

struct CUstream_st;
struct CUevent_st;

namespace tandem::runtime {

using DeviceStream = CUstream_st*;
using DeviceEvent = CUevent_st*;

// Which phase of a node a measured time belongs to.
enum class NodePhase : uint8_t { kForward, kBackwardInput, kBackwardWeight };

// Note [Measured on the GPU]: on the GPU the host only enqueues, so host clocks say nothing
// about when work ran. Every span of the measured timeline is a pair of timing events recorded
// on the stream that ran the work, read once the step has finished (cudaEventElapsedTime from
// an event recorded on the compute stream when the step began). When a compute-stream node
// must wait for an all-to-all on the communication stream, an event is recorded on the compute
// stream before the wait and one after it: the trace's "wait" spans.
//
// Note [Exposed all-to-all]: the exposed all-to-all time is the planner's (simulator_metrics.cc):
// the time some all-to-all is in flight (a dispatch or combine span on either stream) while the
// compute stream runs no node, the measure of the all-to-all spans' union minus the compute
// nodes' union. The "wait" spans alone would miss the time the compute stream stood idle
// because the host was itself held up inside an all-to-all (waiting for routing counts) and
// had not yet issued the wait. An all-to-all run on the compute stream (no overlap) is exposed
// in full.
class DeviceStreams {
 public:
  DeviceStreams();  // cuda::initialize must have run
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  DeviceStream fwd() const { return fwd_; }    // pipeline activations
  DeviceStream bwd() const { return bwd_; }    // pipeline gradients
  // Expert all-to-all of combined actions; half 1: the second half's under CommOverlap::kSplit.
  DeviceStream comm(int half = 0) const { return half ? comm2_ : comm_; }
  static DeviceStream compute();  // the calling thread's current stream
  // The compute stream of a pair's half: compute() for half 0, a second one for half 1.
  DeviceStream compute_of(int half) const { return half ? compute2_ : compute(); }
  // Gradient all-reduces beside the backward (Note [Gradients reduced beside the backward] in
  // grad_reduce.cc); its spans ("reduce" track) are not part of the forward-backward time.
  DeviceStream reduce() const { return reduce_; }

  // An event recorded now on `s`, valid until the next begin_step.
  DeviceEvent mark(DeviceStream s);
  // `to` waits for `e` (GPU side; the host goes on).
  static void wait(DeviceStream to, DeviceEvent e);
  // `to` waits for everything enqueued on `from` so far.
  void wait_all(DeviceStream to, DeviceStream from);

  // Timing. begin_step records the step's zero on the compute stream and forgets the last
  // step's spans; begin/end bracket one span on `s`.
  void begin_step();
  DeviceEvent begin(DeviceStream s) { return timed_mark(s); }
  // A span of the trace; kind >= 0 (a NodeKind) also counts it in the node times, comm says it
  // is expert all-to-all (dispatch or combine).
  struct SpanInfo {
    std::string track;  // "compute" or "comm"
    std::string name;
    int kind = -1;
    NodePhase phase = NodePhase::kForward;
    bool all_to_all = false;  // counted in the all-to-all's busy time
    bool part = false;  // a first part of a node: its time counts in the node's, not its count
    // On a compute track, work that is not a node (kind < 0) but covers the all-to-all like
    // one: the deferred optimizer update (Note [The update beside the first forward] in
    // deferred_update.cc).
    bool busy = false;
    int64_t weights = 0;  // a deferred update's: the weights it updated (StepTimes' rate)
    // A gradient unit's all-reduce: its bus bytes, sum of bytes x 2 (n-1) / n over its groups
    // of n ranks (StepTimes' rate, Note [Gradient reduction in the plan] in
    // schedule/simulator.cc).
    double bus_bytes = 0;
  };
  void end(DeviceStream s, DeviceEvent begin, SpanInfo info);
  // A span of the host's own work (issuing a node, waiting inside it), on the trace's "host"
  // track: host clock, from begin_step's call (the GPU's zero event runs at about that moment:
  // the GPU is idle when a step begins). Not part of the step's GPU figures.
  using HostTime = std::chrono::steady_clock::time_point;
  void host_span(std::string name, HostTime begin, HostTime end);
  // `to` waits for `e`, which `from` recorded; when `to` is a compute stream and `from` a
  // communication stream, the wait is a span of the trace ("wait ...").
  void wait_measured(DeviceStream to, DeviceEvent e, DeviceStream from, const std::string& name);

  // After the GPU has finished the step (the trainer synchronizes): the spans in seconds since
  // begin_step, the all-to-all's busy and exposed seconds, and per-node mean times.
  struct StepTimes {
    std::vector<Span> spans;
    double all_to_all_s = 0, exposed_s = 0;
    // The all-to-all spans in the order the host issued them, and the compute streams' node
    // intervals (Note [Waiting for the slowest expert rank]).
    std::vector<AllToAllSpan> all_to_all;
    std::vector<std::pair<double, double>> compute;
    double end_s = 0;  // the last span's end: the measured forward-backward time
    double reduce_end_s = 0;  // the last gradient all-reduce's end (0: none on the reduce track)
    schedule::NodeTimesTable node_times;  // means over the step's layers and micro-batches
  };
  StepTimes resolve() const;

 private:
  DeviceEvent timed_mark(DeviceStream s);

  DeviceStream fwd_ = nullptr, bwd_ = nullptr, comm_ = nullptr, comm2_ = nullptr,
               compute2_ = nullptr, reduce_ = nullptr;
  bool is_compute(DeviceStream s) const { return s == compute() || s == compute2_; }
  std::vector<DeviceEvent> plain_, timed_;  // event pools, reused every step
  size_t plain_used_ = 0, timed_used_ = 0;
  DeviceEvent step_zero_ = nullptr;
  struct Pending {
    DeviceEvent begin, end;
    SpanInfo info;
  };
  std::vector<Pending> pending_;
  HostTime host_zero_;
  std::vector<Span> host_spans_;
};

}  // namespace tandem::runtime
