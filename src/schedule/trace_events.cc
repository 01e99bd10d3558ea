// The trace writer (trace_events.h).
#include "schedule/trace_events.h"

#include <fstream>
#include <iterator>

#include "core/error.h"

namespace tandem::schedule {

void TraceEvents::add(const nlohmann::json& event) {
  if (!text_.empty()) text_ += ",\n";
  text_ += event.dump();
}

void TraceEvents::process(int pid, const std::string& name) {
  add({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
}

int trace_track(std::string_view stream) {
  for (size_t tid = 0; tid < std::size(kTraceTracks); ++tid) {
    if (stream == kTraceTracks[tid]) return static_cast<int>(tid);
  }
  return 0;
}

void TraceEvents::thread(int pid, int tid, const std::string& name) {
  add({{"name", "thread_name"},
       {"ph", "M"},
       {"pid", pid},
       {"tid", tid},
       {"args", {{"name", name}}}});
}

void TraceEvents::span(int pid, int tid, const std::string& name, double ts_us, double dur_us,
                       std::string_view category, const nlohmann::json& args) {
  nlohmann::json e = {{"name", name}, {"ph", "X"},   {"pid", pid},
                      {"tid", tid},   {"ts", ts_us}, {"dur", dur_us}};
  if (!category.empty()) e["cat"] = category;
  if (!args.is_null()) e["args"] = args;
  add(e);
}

void TraceEvents::memory(int pid, double ts_us, const nlohmann::json& values) {
  add({{"name", "memory"}, {"ph", "C"}, {"pid", pid}, {"ts", ts_us}, {"args", values}});
}

std::string trace_document(const std::vector<std::string>& parts, const nlohmann::json& other) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    out += (first ? "" : ",\n") + p;
    first = false;
  }
  out += "\n]";
  if (!other.is_null()) out += ",\n\"otherData\":" + other.dump();
  return out + "}\n";
}

void write_trace_document(const std::string& path, const std::string& document,
                          std::string_view what) {
  std::ofstream f(path);
  TANDEM_CHECK(f.good(), what, " ", path, ": cannot write the trace file");
  f << document;
  TANDEM_CHECK(f.good(), what, " ", path, ": writing the trace file failed");
}

}  // namespace tandem::schedule
