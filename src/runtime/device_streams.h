// The GPU's streams for the executor (streams.h): the compute stream and a second one for a
// pair's second half, the expert all-to-all's two at high priority, the pipeline's two (Note
// [Pipeline streams on the GPU] in groups.cc), the gradient all-reduce's at low priority; events
// per data edge; and the step's measured timeline from CUDA events (Note [Measured on the GPU]).
// A build without CUDA cannot make them.
//
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
#pragma once

#include <memory>

#include "runtime/streams.h"

namespace tandem::runtime {

// The GPU's Streams; cuda::initialize must have run. Throws tandem::Error in a build without
// CUDA.
std::unique_ptr<Streams> make_device_streams();

}  // namespace tandem::runtime
