// Planner outputs. Oracles: the JSON summary's documented keys and their agreement with the
// simulation; the trace parsed back as JSON (a track per rank and stream, a memory counter);
// the SVG's structure; a user's compute-only schedule file planned like the generated one.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "planner/planner.h"

namespace tandem::schedule {
namespace {

PlanRequest request(const char* name, int32_t p, int32_t v, int32_t m) {
  PlanRequest req;
  req.schedule_name = name;
  req.shape = {p, v, m};
  req.inputs.model.num_layers = p * v;
  req.inputs.model.num_experts = 8;
  req.inputs.expert_parallel_size = 2;
  return req;
}

TEST(Export, SummaryJson) {
  const Plan plan = make_plan(request("interleaved-1f1b", 2, 2, 4));
  const nlohmann::json j = plan_summary_json(plan);
  EXPECT_EQ(j["schedule"], "interleaved-1f1b");
  EXPECT_EQ(j["pipeline_size"], 2);
  EXPECT_EQ(j["virtual_stages"], 2);
  EXPECT_EQ(j["num_microbatches"], 4);
  EXPECT_EQ(j["cost_model"], "roofline");
  EXPECT_DOUBLE_EQ(j["bubble_fraction"].get<double>(), plan.sim.bubble_fraction);
  EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), plan.sim.step_time_s);
  // EP 2 on 2 ranks a stage: the dense gradients all-reduced over both
  // (Note [Gradient reduction in the plan]), beside the backward by default.
  EXPECT_EQ(j["data_parallel_size"], 2);
  EXPECT_EQ(j["overlap_grad_reduce"], true);
  EXPECT_DOUBLE_EQ(j["step_with_reduce_s"].get<double>(), plan.sim.step_with_reduce_s);
  EXPECT_GE(plan.sim.step_with_reduce_s, plan.sim.step_time_s);
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto& jr = j["ranks"][r];
    EXPECT_EQ(jr["rank"], r);
    EXPECT_EQ(jr["peak_bytes"], plan.sim.ranks[r].peak_bytes);
    EXPECT_EQ(jr["activation_peak_bytes"], plan.sim.ranks[r].activation_peak_bytes);
    // A CPU plan counts the CPU nodes' temporaries (Note [Node workspace]).
    EXPECT_EQ(jr["workspace_peak_bytes"], plan.sim.ranks[r].workspace_peak_bytes);
    EXPECT_GT(jr["workspace_peak_bytes"], 0);
    EXPECT_DOUBLE_EQ(jr["exposed_comm_s"].get<double>(), plan.sim.ranks[r].exposed_comm_s);
    EXPECT_DOUBLE_EQ(jr["grad_reduce_s"].get<double>(), plan.sim.ranks[r].grad_reduce_s);
    EXPECT_GT(jr["grad_reduce_s"].get<double>(), 0);
    EXPECT_DOUBLE_EQ(jr["grad_reduce_tail_s"].get<double>(), plan.sim.ranks[r].grad_reduce_tail_s);
    EXPECT_EQ(jr["stages"], (std::vector<int>{r, r + 2}));
    EXPECT_GT(jr["activation_peak_bytes"].get<int64_t>(), 0);
    EXPECT_GT(jr["exposed_comm_s"].get<double>(), 0);  // EP 2: all-to-all with nothing to hide it
    int64_t by_node = 0;
    for (const auto& [node, bytes] : jr["activation_bytes_at_peak_by_node"].items()) {
      by_node += bytes.get<int64_t>();
    }
    EXPECT_GT(by_node, 0);
    EXPECT_LE(by_node, plan.sim.ranks[r].activation_peak_bytes);
  }
}

TEST(Export, ChromeTrace) {
  const Plan plan = make_plan(request("1f1b", 2, 1, 3));
  const nlohmann::json t = nlohmann::json::parse(trace_json(plan));
  std::set<std::pair<int, int>> tracks;
  int counters = 0, complete = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      tracks.insert({e["pid"].get<int>(), e["tid"].get<int>()});
      EXPECT_GE(e["dur"].get<double>(), 0);
      ++complete;
    } else if (e["ph"] == "C") {
      EXPECT_EQ(e["name"], "memory");
      EXPECT_TRUE(e["args"].contains("activations"));
      EXPECT_TRUE(e["args"].contains("workspace"));
      ++counters;
    }
  }
  // Compute, comm and (EP 2 on 2 ranks a stage: the dense gradients' all-reduce) reduce.
  EXPECT_EQ(tracks,
            (std::set<std::pair<int, int>>{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}}));
  size_t spans = 0;
  for (const RankResult& r : plan.sim.ranks) spans += r.spans.size();
  EXPECT_EQ(complete, static_cast<int>(spans));
  EXPECT_GT(counters, 0);
  EXPECT_EQ(t["otherData"]["schedule"], "1f1b");
}

TEST(Export, SvgAndFiles) {
  const Plan plan = make_plan(request("dualpipev", 2, 2, 4));
  const std::string svg = plan_svg(plan);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("<rect x="), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("rank 1 compute"), std::string::npos);
  EXPECT_NE(svg.find("(0F3;3B1)"), std::string::npos);  // a combined action's tooltip
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  // The time axis in the plan's unit from 0, and each memory band's scale from 0 to the peak.
  const bool uniform = plan.inputs.cost.kind == CostModelKind::kUniform;
  EXPECT_NE(svg.find(uniform ? ">units</text>" : ">ms</text>"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"middle\">0</text>"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"end\">0</text>"), std::string::npos);
  EXPECT_NE(svg.find(" MiB</text>"), std::string::npos);
  const std::string dir = ::testing::TempDir();
  write_svg(plan, dir + "/plan.svg");
  write_trace(plan, dir + "/plan.json");
  std::ifstream in(dir + "/plan.json");
  const nlohmann::json back = nlohmann::json::parse(in);
  EXPECT_EQ(back["otherData"]["schedule"], "dualpipev");
  EXPECT_THROW(write_svg(plan, "/nonexistent-dir/x.svg"), Error);
  // EP 2 on 2 ranks a stage: the dense gradients' all-reduce gets a row of its own.
  EXPECT_NE(svg.find(">reduce</text>"), std::string::npos);
  EXPECT_NE(svg.find("<title>reduce after "), std::string::npos);
  PlanRequest one = request("dualpipev", 2, 2, 4);
  one.inputs.expert_parallel_size = 1;
  const std::string alone = plan_svg(make_plan(one));
  EXPECT_EQ(alone.find(">reduce</text>"), std::string::npos);
}

// Note [Planned and measured on one chart]: a measured trace (as `tandem train --trace` writes
// it) merged into the plan's, each measured rank sorted under its planned one; each rank's
// measured forward-backward is the end of its last compute or comm span; bad files are named.
TEST(Export, PlannedAndMeasuredOnOneChart) {
  const Plan plan = make_plan(request("1f1b", 2, 1, 3));
  const std::string measured = R"JSON({"displayTimeUnit":"ms","traceEvents":[
    {"name":"process_name","ph":"M","pid":0,"args":{"name":"rank 0 (measured)"}},
    {"name":"thread_name","ph":"M","pid":0,"tid":0,"args":{"name":"compute"}},
    {"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"comm"}},
    {"name":"thread_name","ph":"M","pid":0,"tid":2,"args":{"name":"host"}},
    {"name":"thread_name","ph":"M","pid":1,"tid":0,"args":{"name":"compute"}},
    {"name":"attention.fwd","ph":"X","pid":0,"tid":0,"ts":0,"dur":1000},
    {"name":"dispatch.fwd","ph":"X","pid":0,"tid":1,"ts":1000,"dur":2500},
    {"name":"issue","ph":"X","pid":0,"tid":2,"ts":0,"dur":9000},
    {"name":"loss.fwd","ph":"X","pid":1,"tid":0,"ts":500,"dur":1500},
    {"name":"memory","ph":"C","pid":1,"ts":10,"args":{"activations":5}}]})JSON";
  const nlohmann::json events = measured_trace_events(measured, "m.json");
  const nlohmann::json t = nlohmann::json::parse(merged_trace_json(plan, events));
  size_t planned_events = nlohmann::json::parse(trace_json(plan))["traceEvents"].size();
  std::map<int, int> sort;
  int measured_events = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["name"] == "process_sort_index") {
      sort[e["pid"].get<int>()] = e["args"]["sort_index"].get<int>();
    } else if (e["pid"].get<int>() >= 1000) {
      ++measured_events;
    }
    if (e["name"] == "process_name" && e["pid"] == 0) {
      EXPECT_EQ(e["args"]["name"], "rank 0 (planned, stages 0)");
    }
  }
  EXPECT_EQ(measured_events, 10);
  EXPECT_EQ(t["traceEvents"].size(), planned_events + 10 + 4);
  EXPECT_EQ(sort, (std::map<int, int>{{0, 0}, {1000, 1}, {1, 2}, {1001, 3}}));
  const std::map<int, double> ends = measured_forward_backward(events, "m.json");
  EXPECT_DOUBLE_EQ(ends.at(0), 3.5e-3);  // the comm span's end; the host track does not count
  EXPECT_DOUBLE_EQ(ends.at(1), 2e-3);
  const std::string lines = planned_against_measured(plan, ends);
  EXPECT_NE(lines.find("rank 0: forward-backward planned "), std::string::npos) << lines;
  EXPECT_NE(lines.find("measured 3.500 ms"), std::string::npos) << lines;
  EXPECT_NE(lines.find("measured 2.000 ms"), std::string::npos) << lines;
  for (const char* bad : {"{", R"({"events": []})"}) {
    try {
      measured_trace_events(bad, "m.json");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("m.json: not a trace"), std::string::npos) << e.what();
    }
  }
}

TEST(Export, Table) {
  const std::string table = format_plan_table(make_plan(request("zb-h1", 3, 1, 6)));
  EXPECT_NE(table.find("schedule zb-h1: 3 ranks, 3 stages, 6 micro-batches, EP 2"),
            std::string::npos);
  EXPECT_NE(table.find("exposed comm"), std::string::npos);
  std::istringstream lines(table);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) rows += line.rfind("   ", 0) == 0 ? 1 : 0;
  EXPECT_EQ(rows, 3);
}

// Writes `text` to `name` in the test's temporary directory; returns the path.
std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The same lists, step time and rank 0 peak.
void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.schedule.ranks, b.schedule.ranks);
  EXPECT_DOUBLE_EQ(a.sim.step_time_s, b.sim.step_time_s);
  EXPECT_EQ(a.sim.ranks[0].peak_bytes, b.sim.ranks[0].peak_bytes);
}

TEST(Planner, ScheduleFileWithoutCommunicationIsLoweredAndMatchesTheGenerator) {
  const std::string path = ::testing::TempDir() + "/user_1f1b.txt";
  {
    std::ofstream f(path);
    f << "# 1f1b, compute only\n";
    const Schedule s = generate_compute_schedule(ScheduleKind::k1f1b, {2, 1, 3});
    for (int r = 0; r < 2; ++r) {
      f << "rank " << r << ":";
      for (const Action& a : s.ranks[r]) f << ' ' << to_string(a);
      f << '\n';
    }
  }
  PlanRequest from_file = request("1f1b", 2, 1, 3);
  from_file.schedule_file = path;
  expect_same_plan(make_plan(from_file), make_plan(request("1f1b", 2, 1, 3)));
}

// A hand-written schedule with a pair of forwards plans as the generator's --pair-first-forwards
// does, and its SVG and trace name the pair.
TEST(Planner, ScheduleFileWithPairedForwardsMatchesTheGenerator) {
  PlanRequest from_file = request("combined-1f1b", 1, 1, 4);
  from_file.schedule_file =
      temp_file("paired.txt", "rank 0: (0F0;0F1) (0F2;0B0) (0F3;0B1) 0B2 0B3\n");
  PlanRequest generated = request("combined-1f1b", 1, 1, 4);
  generated.shape.pair_first_forwards = true;
  const Plan a = make_plan(from_file);
  const Plan b = make_plan(generated);
  expect_same_plan(a, b);
  EXPECT_EQ(b.schedule.name, "combined-1f1b (paired first forwards)");
  EXPECT_NE(plan_svg(a).find("(0F0;0F1)"), std::string::npos);
  EXPECT_NE(trace_json(a).find("(0F0;0F1)"), std::string::npos);
}

TEST(Planner, BrokenScheduleFileIsRejectedBeforeSimulation) {
  const std::string path =
      temp_file("broken.txt", "rank 0: 0F0 0SEND_F0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n");
  PlanRequest req = request("1f1b", 2, 1, 1);
  req.schedule_file = path;
  try {
    make_plan(req);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0, action #2 0B0: its output gradient has not been "
                                         "received"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem::schedule
