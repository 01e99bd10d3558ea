// Chrome trace JSON of measured timelines (timeline.h).
#include "runtime/timeline.h"

#include <algorithm>
#include <iterator>

#include "schedule/trace_events.h"

namespace tandem::runtime {

std::string rank_trace_events(int rank, const std::vector<Span>& spans,
                              const std::vector<MemEvent>& mem, double step_start) {
  schedule::TraceEvents events;
  events.process(rank, "rank " + std::to_string(rank) + " (measured)");
  // Tracks (schedule::kTraceTracks): compute and comm always, the others when some span is there.
  constexpr int kTracks = static_cast<int>(std::size(schedule::kTraceTracks));
  for (int tid = 0; tid < kTracks; ++tid) {
    const bool used = tid < 2 || std::any_of(spans.begin(), spans.end(), [&](const Span& s) {
                        return schedule::trace_track(s.stream) == tid;
                      });
    if (used) events.thread(rank, tid, std::string(schedule::kTraceTracks[tid]));
  }
  for (const Span& s : spans) {
    events.span(rank, schedule::trace_track(s.stream), s.name, s.start * 1e6,
                (s.end - s.start) * 1e6);
  }
  int64_t activations = 0;
  for (const MemEvent& e : mem) {
    if (e.category != MemCategory::kActivation) continue;
    activations += e.bytes;
    events.memory(rank, (e.time - step_start) * 1e6, {{"activations", activations}});
  }
  return events.text();
}

void write_trace_file(const std::string& path, const std::vector<std::string>& rank_events) {
  schedule::write_trace_document(path, schedule::trace_document(rank_events), "--trace");
}

}  // namespace tandem::runtime
