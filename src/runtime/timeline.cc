// Chrome trace JSON of measured timelines (timeline.h).
#include "runtime/timeline.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem::runtime {

std::string rank_trace_events(int rank, const std::vector<Span>& spans,
                              const std::vector<MemEvent>& mem, double step_start) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"name", "rank " + std::to_string(rank) + " (measured)"}}}});
  // Tracks: compute and comm always, host, the second half's pair of streams (compute2, comm2:
  // CommOverlap::kSplit) and the gradient reduction's (reduce) when some span is there.
  const char* names[] = {"compute", "comm", "host", "compute2", "comm2", "reduce"};
  constexpr int kTracks = static_cast<int>(std::size(names));
  auto tid_of = [&](const std::string& stream) {
    for (int tid = 1; tid < kTracks; ++tid) {
      if (stream == names[tid]) return tid;
    }
    return 0;
  };
  for (int tid = 0; tid < kTracks; ++tid) {
    const bool used = tid < 2 || std::any_of(spans.begin(), spans.end(), [&](const Span& s) {
                        return tid_of(s.stream) == tid;
                      });
    if (!used) continue;
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", tid},
                      {"args", {{"name", names[tid]}}}});
  }
  for (const Span& s : spans) {
    const int tid = tid_of(s.stream);
    events.push_back({{"name", s.name},
                      {"ph", "X"},
                      {"pid", rank},
                      {"tid", tid},
                      {"ts", s.start * 1e6},
                      {"dur", (s.end - s.start) * 1e6}});
  }
  int64_t activations = 0;
  for (const MemEvent& e : mem) {
    if (e.category != MemCategory::kActivation) continue;
    activations += e.bytes;
    events.push_back({{"name", "memory"},
                      {"ph", "C"},
                      {"pid", rank},
                      {"ts", (e.time - step_start) * 1e6},
                      {"args", {{"activations", activations}}}});
  }
  std::string out;
  for (const auto& e : events) out += (out.empty() ? "" : ",\n") + e.dump();
  return out;
}

void write_trace_file(const std::string& path, const std::vector<std::string>& rank_events) {
  std::ofstream f(path);
  TANDEM_CHECK(f.good(), "--trace ", path, ": cannot write the trace file");
  f << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  for (const std::string& e : rank_events) {
    if (e.empty()) continue;
    f << (first ? "" : ",\n") << e;
    first = false;
  }
  f << "\n]}\n";
  TANDEM_CHECK(f.good(), "--trace ", path, ": writing the trace file failed");
}

}  // namespace tandem::runtime
