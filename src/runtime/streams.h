// The streams a rank's step runs on, one interface over the CPU's (a worker thread beside this
// one, cpu_streams.h) and the GPU's (CUDA streams, device_streams.h), so that the executor's
// issue order, its messages and its gradient reductions are written once.
//
// Note [One executor on two kinds of streams]: a stream runs its work in the order issued; an
// event recorded on a stream completes once the work issued there before it has run; a wait
// makes a stream hold its next work until an event has completed. The two kinds differ in who
// runs the work, and the executor asks issues_ahead() where that matters:
//  - GPU (issues_ahead): the host only enqueues and the device runs later. Memory freed on the
//    host is reused in stream order (Note [Nodes on the communication stream] in combined.cc),
//    so a weight gradient may follow its successor's event
//    (Note [Weight gradients off the chain]) and the host may queue work beside an all-to-all;
//    times come from CUDA events, known once the device has finished the step.
//  - CPU: the compute stream runs work on this thread as it is issued, the communication stream
//    on a worker thread; a free is immediate, so a node's work stays whole on the chain. Times
//    are host clocks, known as soon as the host is done.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "runtime/alltoall_wait.h"
#include "runtime/timeline.h"
#include "schedule/action.h"
#include "schedule/node_times.h"

struct CUevent_st;

namespace tandem::runtime {

class CpuEvent;

// Which phase of a node a measured time belongs to.
enum class NodePhase : uint8_t { kForward, kBackwardInput, kBackwardWeight };

// The executor's streams by role. A combined pair's second half runs on the second compute and
// communication streams under CommOverlap::kSplit (Note [A stream pair per half] in
// combined.cc); pipeline activations and gradients each have a stream
// (Note [Pipeline streams on the GPU] in groups.cc); gradient all-reduces beside the backward
// have one (Note [Gradients reduced beside the backward] in grad_reduce.cc).
enum class StreamId : uint8_t {
  kCompute,
  kCompute2,
  kComm,
  kComm2,
  kPipelineForward,
  kPipelineBackward,
  kReduce,
  // Note [Activation offload] (activation_offload.h): copies of saved activations to the host
  // and back, each direction on a stream of its own (the GPU's two copy engines); on the CPU
  // they run in order on the compute stream.
  kOffloadOut,
  kOffloadIn
};
inline StreamId compute_stream(int half) { return half ? StreamId::kCompute2 : StreamId::kCompute; }
inline StreamId comm_stream(int half) { return half ? StreamId::kComm2 : StreamId::kComm; }

// An event recorded on a stream; the kind of streams that made it fills its field.
struct StreamEvent {
  std::shared_ptr<CpuEvent> cpu;
  CUevent_st* device = nullptr;
};

// A span of the step's timeline. kind >= 0 (a NodeKind) also counts it in the node times.
struct SpanInfo {
  std::string track;  // "compute", "comm", "compute2", "comm2", "reduce"
  std::string name;   // "F3 attention", "0SEND_F1", "update 0 [0, 4096)", "reduce layer 2"
  int kind = -1;
  NodePhase phase = NodePhase::kForward;
  bool all_to_all = false;  // an expert all-to-all: counted in the all-to-all's busy time
  bool part = false;        // a first part of a node: its time counts in the node's, not its count
  // On a compute track, work that is not a node (kind < 0) but covers the all-to-all like one:
  // the deferred optimizer update (Note [The update beside the first forward] in
  // deferred_update.cc).
  bool busy = false;
  int64_t weights = 0;  // a deferred update's: the weights it updated (StepTimes' rate)
  // A gradient unit's all-reduce: its bus bytes, sum of bytes x 2 (n-1) / n over its groups of
  // n ranks (StepTimes' rate, Note [Gradient reduction in the plan] in planner/simulator.cc).
  double bus_bytes = 0;
};

// A step's measured times (Streams::times): the spans in seconds since the step began, the
// all-to-all's busy and exposed seconds (Note [Exposed all-to-all] in device_streams.h) and,
// from the GPU only, what the planner's --node-times needs.
struct StepTimes {
  std::vector<Span> spans;
  double all_to_all_s = 0, exposed_s = 0;
  // The all-to-all spans in the order the host issued them, and the compute streams' node
  // intervals (Note [Waiting for the slowest expert rank] in alltoall_wait.h).
  std::vector<AllToAllSpan> all_to_all;
  std::vector<std::pair<double, double>> compute;
  double end_s = 0;         // the last span's end: the measured forward-backward time
  double reduce_end_s = 0;  // the last gradient all-reduce's end (0: none on the reduce track)
  schedule::NodeTimesTable node_times;  // means over the step's layers and micro-batches
};

class Streams {
 public:
  using HostTime = std::chrono::steady_clock::time_point;
  virtual ~Streams() = default;

  // Note [One executor on two kinds of streams]: true on the GPU.
  virtual bool issues_ahead() const = 0;

  // The step's measurement starts at `zero` (the timeline's zero); the last step's is forgotten.
  virtual void begin_step(HostTime zero) = 0;
  // Bracket every schedule action of the step (Note [Measured on the CPU] in cpu_streams.h).
  virtual void begin_action(const schedule::Action& a) = 0;
  virtual void end_action(const schedule::Action& a) = 0;

  // Issues `work` on stream s, measured as `span`. The work may run later or on another thread:
  // what it refers to must outlive join_workers().
  virtual void run(StreamId s, SpanInfo span, std::function<void()> work) = 0;
  // An event on s after everything issued there so far.
  virtual StreamEvent mark(StreamId s) = 0;
  // `to` holds its next work until `e`, recorded on `from`, has completed. A compute stream
  // waiting for a communication stream is measured as a span "wait <what>" (the GPU's; the CPU
  // counts the seconds waited).
  virtual void wait(StreamId to, const StreamEvent& e, StreamId from, const std::string& what) = 0;
  void wait_all(StreamId to, StreamId from) { wait(to, mark(from), from, std::string()); }
  // Tells the allocator that `t` is used on stream s too (PyTorch's record_stream), so its
  // block is not reused before s is done with it; nothing to do on the CPU.
  virtual void record_use(const Tensor& t, StreamId s) = 0;
  // A span of the host's own work (issuing a node, waiting inside it): the GPU's "host" track.
  virtual void host_span(std::string name, HostTime begin, HostTime end) = 0;
  // Returns once every host thread has run what was issued to it (the CPU's worker; the GPU's
  // streams go on). Rethrows the first failure, unless `quietly` (on the way out of an error).
  virtual void join_workers(bool quietly = false) = 0;
  // The step's measured times: on the GPU once the device has finished the step, on the CPU
  // once the host has.
  virtual StepTimes times() const = 0;
};

}  // namespace tandem::runtime
