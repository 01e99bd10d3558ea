// Chrome / Perfetto trace events in the one layout that measured steps (runtime/timeline.cc) and
// planned ones (planner/trace_export.cc) share, so both open side by side
// (Note [Planned and measured on one chart] in planner/trace_export.cc): a process per rank, a
// thread per stream, "X" spans and a "memory" counter track; times in microseconds from the
// step's start.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::schedule {

// The thread ids of the streams, the same in measured and planned traces so that a stream keeps
// its row when both are open: the planner's three (compute, comm, and the gradient reduction's
// stream, planner/pipeline_model.h Stream), then the host and the second half's pair of streams
// (CommOverlap::kSplit), which only measured steps have.
inline constexpr std::string_view kTraceTracks[] = {"compute", "comm",     "reduce",
                                                    "host",    "compute2", "comm2"};
// The track of a stream's name; compute's (0) for a name not in kTraceTracks.
int trace_track(std::string_view stream);

class TraceEvents {
 public:
  void process(int pid, const std::string& name);
  void thread(int pid, int tid, const std::string& name);
  // `category` (the "cat" field) and `args` are left out when empty.
  void span(int pid, int tid, const std::string& name, double ts_us, double dur_us,
            std::string_view category = {}, const nlohmann::json& args = nullptr);
  // A sample of the rank's "memory" counter track: {"activations": bytes, ...}.
  void memory(int pid, double ts_us, const nlohmann::json& values);
  // The events so far, comma-separated: one part of trace_document's list.
  const std::string& text() const { return text_; }

 private:
  void add(const nlohmann::json& event);
  std::string text_;
};

// {"displayTimeUnit":"ms","traceEvents":[...]} joining the non-empty parts, with `other` as
// "otherData" unless it is null.
std::string trace_document(const std::vector<std::string>& parts,
                           const nlohmann::json& other = nullptr);

// Writes `document` to `path`; throws tandem::Error naming `what` (the option or file's role)
// and the path when it cannot.
void write_trace_document(const std::string& path, const std::string& document,
                          std::string_view what);

}  // namespace tandem::schedule
