// Chrome / Perfetto trace of a plan: process = rank, thread 0 = compute stream, thread 1 = comm
// stream, thread 2 = the gradient all-reduce's stream, "X" events per node span, message and
// reduction, a "memory" counter track per rank.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "planner/planner.h"
#include "schedule/trace_events.h"

namespace tandem::schedule {
namespace {

std::string span_name(const Span& s) {
  if (s.kind == SpanKind::kSend) return s.phase == Phase::kForward ? "SEND_F" : "SEND_B";
  if (s.kind == SpanKind::kRecv) return s.phase == Phase::kForward ? "RECV_F" : "RECV_B";
  if (s.kind == SpanKind::kUpdate) return "update";  // Note [Deferred update in the plan]
  if (s.kind == SpanKind::kReduce) {                 // Note [Gradient reduction in the plan]
    if (s.layer >= 0) return "reduce layer " + std::to_string(s.layer);
    return s.node == NodeKind::kEmbed ? "reduce embed" : "reduce head";
  }
  std::string out(node_kind_name(s.node));
  out += s.phase == Phase::kForward ? ".fwd" : s.phase == Phase::kBackwardInput ? ".bwd" : ".bwd_w";
  return out;
}

const char* span_category(const Span& s) {
  if (s.kind == SpanKind::kUpdate) return "U";
  if (s.kind == SpanKind::kReduce) return "R";
  if (s.kind != SpanKind::kNode) return "p2p";
  return s.phase == Phase::kForward ? "F" : s.phase == Phase::kBackwardInput ? "B" : "W";
}

}  // namespace

// A planned stream's thread id is its Stream value: the measured trace's tracks of those names.
static_assert(kTraceTracks[static_cast<int>(Stream::kCompute)] == "compute");
static_assert(kTraceTracks[static_cast<int>(Stream::kComm)] == "comm");
static_assert(kTraceTracks[static_cast<int>(Stream::kReduce)] == "reduce");

std::string trace_json(const Plan& plan) {
  // Trace time is in microseconds; a uniform cost unit is drawn as one millisecond.
  const double scale = plan.inputs.cost.kind == CostModelKind::kUniform ? 1e3 : 1e6;
  TraceEvents events;
  for (const RankResult& r : plan.sim.ranks) {
    std::string stages;
    for (int32_t s : r.stages) stages += (stages.empty() ? "" : ",") + std::to_string(s);
    events.process(r.rank, "rank " + std::to_string(r.rank) + " (stages " + stages + ")");
    for (const Stream stream : {Stream::kCompute, Stream::kComm, Stream::kReduce}) {
      events.thread(r.rank, static_cast<int>(stream),
                    std::string(kTraceTracks[static_cast<int>(stream)]));
    }
    const auto& list = plan.schedule.ranks[r.rank];
    for (const Span& s : r.spans) {
      events.span(r.rank, static_cast<int>(s.stream), span_name(s), s.start * scale,
                  (s.end - s.start) * scale, span_category(s),
                  {{"action", to_string(list[s.action])},
                   {"stage", s.stage},
                   {"microbatch", s.microbatch},
                   {"layer", s.layer}});
    }
    const int64_t base = r.static_memory.static_bytes();
    for (const MemorySample& m : r.memory) {
      events.memory(r.rank, m.time * scale,
                    {{"static", base},
                     {"activations", m.activation_bytes},
                     {"in_flight", m.in_flight_bytes},
                     {"workspace", m.workspace_bytes}});
    }
  }
  return trace_document({events.text()}, plan_summary_json(plan));
}

// Note [Planned and measured on one chart]: the planner's promise that prediction and
// measurement are compared on one chart (docs/design.md). A measured trace (runtime/timeline.cc:
// a process per world rank, times in microseconds from the step's start, as the plan's) is merged
// into the plan's: its processes move to pid 1000 + rank, and sort indices put each measured
// rank right under the planned one of the same number, so Perfetto shows planned rank 0,
// measured rank 0, planned rank 1, ... on one time axis. With data parallelism the measured
// trace has more ranks than the plan (one pipeline); they follow in rank order.
namespace {

constexpr int kMeasuredPid = 1000;

}  // namespace

nlohmann::json measured_trace_events(std::string_view text, std::string_view source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat(source, ": not a trace (not valid JSON: ", e.what(), ")"));
  }
  TANDEM_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array(), source,
               ": not a trace: expected {\"traceEvents\": [...]} as `tandem train --trace` "
               "writes it");
  return j["traceEvents"];
}

std::map<int, double> measured_forward_backward(const nlohmann::json& events,
                                                std::string_view source) {
  std::map<std::pair<int, int>, std::string> names;
  for (const auto& e : events) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      names[{e.value("pid", -1), e.value("tid", -1)}] = e["args"].value("name", "");
    }
  }
  std::map<int, double> ends;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X") continue;
    TANDEM_CHECK(e.contains("pid") && e.contains("ts") && e.contains("dur"), source,
                 ": an event lacks pid, ts or dur: ", e.dump());
    const int pid = e["pid"].get<int>();
    const std::string& track = names[{pid, e.value("tid", 0)}];
    if (track.rfind("compute", 0) != 0 && track.rfind("comm", 0) != 0) continue;
    double& end = ends[pid];
    end = std::max(end, (e["ts"].get<double>() + e["dur"].get<double>()) * 1e-6);
  }
  return ends;
}

std::string merged_trace_json(const Plan& plan, const nlohmann::json& measured_events) {
  nlohmann::json merged = nlohmann::json::parse(trace_json(plan));
  nlohmann::json& events = merged["traceEvents"];
  for (nlohmann::json& e : events) {  // "rank 0 (stages 0,3)" -> "rank 0 (planned, stages 0,3)"
    if (e.value("name", "") != "process_name") continue;
    std::string name = e["args"].value("name", "");
    const size_t paren = name.find(" (");
    if (paren != std::string::npos) name.insert(paren + 2, "planned, ");
    e["args"]["name"] = name;
  }
  const int planned = static_cast<int>(plan.sim.ranks.size());
  std::set<int> measured;
  for (nlohmann::json e : measured_events) {
    if (!e.contains("pid")) continue;
    const int pid = kMeasuredPid + e["pid"].get<int>();
    e["pid"] = pid;
    measured.insert(pid);
    events.push_back(std::move(e));
  }
  auto sort_index = [&](int pid, int index) {
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"args", {{"sort_index", index}}}});
  };
  for (int r = 0; r < planned; ++r) sort_index(r, 2 * r);
  for (const int pid : measured) {
    const int r = pid - kMeasuredPid;
    sort_index(pid, r < planned ? 2 * r + 1 : 2 * planned + r);
  }
  return merged.dump() + "\n";
}

std::string planned_against_measured(const Plan& plan, const std::map<int, double>& ends) {
  std::string out;
  char line[200];
  for (const RankResult& r : plan.sim.ranks) {
    const auto it = ends.find(r.rank);
    if (it == ends.end()) continue;
    std::snprintf(line, sizeof line,
                  "rank %d: forward-backward planned %.3f ms, measured %.3f ms (%+.1f%%)\n", r.rank,
                  r.end_s * 1e3, it->second * 1e3,
                  it->second > 0 ? 100 * (r.end_s - it->second) / it->second : 0.0);
    out += line;
  }
  return out;
}

void write_trace(const Plan& plan, const std::string& path) {
  write_trace_document(path, trace_json(plan), "--trace");
}

}  // namespace tandem::schedule
