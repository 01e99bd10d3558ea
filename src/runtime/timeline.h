// Measured timelines: spans of work per stream and the activation memory over time, written as
// Chrome / Perfetto trace JSON in the planner's layout (a process per rank, thread 0 = compute,
// thread 1 = comm, a "memory" counter track), so planned and measured steps open side by side.
#pragma once

#include <string>
#include <vector>

#include "core/allocator.h"

namespace tandem::runtime {

// One measured span, in seconds since the step started.
struct Span {
  std::string stream;  // "compute" or "comm"; "host" (GPU runs: the host issuing)
  std::string name;    // e.g. "0F3", "F3 attention", "B2 combine", "0SEND_F1"
  double start, end;
};

// The trace events of one rank (JSON objects separated by commas, no brackets): its spans, and
// a counter of the activation bytes in use built from the allocator's trace (`mem`, recorded
// from a point where no activation was live), with times relative to `step_start` (steady-clock
// seconds).
std::string rank_trace_events(int rank, const std::vector<Span>& spans,
                              const std::vector<MemEvent>& mem, double step_start);

// Writes {"traceEvents": [...]} joining every rank's events. Throws tandem::Error naming the
// path when it cannot be written.
void write_trace_file(const std::string& path, const std::vector<std::string>& rank_events);

}  // namespace tandem::runtime
