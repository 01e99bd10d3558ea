// Chrome / Perfetto trace of a plan: process = rank, thread 0 = compute stream, thread 1 = comm
// stream, thread 2 = the gradient all-reduce's stream, "X" events per node span, message and
// reduction, a "memory" counter track per rank.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "schedule/planner.h"

namespace tandem::schedule {
namespace {

std::string span_name(const Span& s) {
  if (s.kind == SpanKind::kSend) return s.phase == Phase::kForward ? "SEND_F" : "SEND_B";
  if (s.kind == SpanKind::kRecv) return s.phase == Phase::kForward ? "RECV_F" : "RECV_B";
  if (s.kind == SpanKind::kUpdate) return "update";  // Note [Deferred update in the plan]
  if (s.kind == SpanKind::kReduce) {  // Note [Gradient reduction in the plan]
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

void append_metadata(std::string& out, int32_t rank, const std::vector<int32_t>& stages) {
  std::string st;
  for (int32_t s : stages) st += (st.empty() ? "" : ",") + std::to_string(s);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d "
                "(stages %s)\"}},\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                "\"args\":{\"name\":\"compute\"}},\n{\"name\":\"thread_name\",\"ph\":\"M\","
                "\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"comm\"}},\n{\"name\":\"thread_name\","
                "\"ph\":\"M\",\"pid\":%d,\"tid\":2,\"args\":{\"name\":\"reduce\"}},\n",
                rank, rank, st.c_str(), rank, rank, rank);
  out += buf;
}

}  // namespace

std::string trace_json(const Plan& plan) {
  // Trace time is in microseconds; a uniform cost unit is drawn as one millisecond.
  const double scale = plan.inputs.cost.kind == CostModelKind::kUniform ? 1e3 : 1e6;
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  char buf[512];
  for (const RankResult& r : plan.sim.ranks) {
    append_metadata(out, r.rank, r.stages);
    const auto& list = plan.schedule.ranks[r.rank];
    for (const Span& s : r.spans) {
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.4f,\"dur\":%.4f,"
                    "\"pid\":%d,\"tid\":%d,\"args\":{\"action\":\"%s\",\"stage\":%d,"
                    "\"microbatch\":%d,\"layer\":%d}},\n",
                    span_name(s).c_str(), span_category(s), s.start * scale,
                    (s.end - s.start) * scale, r.rank, static_cast<int>(s.stream),
                    to_string(list[s.action]).c_str(), s.stage, s.microbatch, s.layer);
      out += buf;
    }
    const int64_t base = r.static_memory.static_bytes();
    for (const MemorySample& m : r.memory) {
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"memory\",\"ph\":\"C\",\"ts\":%.4f,\"pid\":%d,\"args\":{"
                    "\"static\":%lld,\"activations\":%lld,\"in_flight\":%lld,"
                    "\"workspace\":%lld}},\n",
                    m.time * scale, r.rank, static_cast<long long>(base),
                    static_cast<long long>(m.activation_bytes),
                    static_cast<long long>(m.in_flight_bytes),
                    static_cast<long long>(m.workspace_bytes));
      out += buf;
    }
  }
  if (out.size() >= 2 && out[out.size() - 2] == ',') out.erase(out.size() - 2, 1);
  out += "],\n\"otherData\":" + plan_summary_json(plan).dump() + "}\n";
  return out;
}

void write_trace(const Plan& plan, const std::string& path) {
  std::ofstream f(path);
  TANDEM_CHECK(f.good(), "cannot write the trace file '", path, "'");
  f << trace_json(plan);
  TANDEM_CHECK(f.good(), "writing the trace file '", path, "' failed");
}

}  // namespace tandem::schedule
