// The node-times file's writer against its reader (schedule/node_times.h): every field a run
// records reads back as written, and what the writer leaves out reads back as not measured.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "schedule/node_times.h"
#include "schedule/trace_events.h"

namespace tandem::schedule {
namespace {

TEST(NodeTimesFile, WrittenTableReadsBackTheSame) {
  NodeTimesTable t;
  t.nodes[static_cast<int>(NodeKind::kAttention)] = NodePhaseTimes{1.5e-4, 2.5e-4, 1.25e-4};
  t.nodes[static_cast<int>(NodeKind::kDispatch)] = NodePhaseTimes{3e-5, 3.5e-5, 0};
  t.nodes[static_cast<int>(NodeKind::kLoss)] = NodePhaseTimes{7e-4, 6e-4, 5e-4};
  t.p2p_s = 2e-5;
  t.recompute_experts = true;
  t.recompute = "mlp,shared_experts";
  t.moe_wgrad_merge = 4;
  t.update_s_per_weight = 3e-12;
  t.grad_reduce_bus_bytes_per_s = 1.5e11;
  t.step_end_s_per_weight = 4e-12;
  t.defer_optimizer = true;
  t.node_gap_s = 2e-6;
  MeasuredShape at;
  at.model.num_layers = 3;
  at.model.hidden_size = 128;
  at.micro_batch_size = 2;
  at.expert_parallel_size = 2;
  at.activation_elem_bytes = 4;
  t.measured_at = at;
  t.node_overhead_s = 1e-5;

  const NodeTimesTable back = parse_node_times(node_times_json(t).dump(), "t.json");
  for (int k = 0; k < kNumNodeKinds; ++k) {
    ASSERT_EQ(back.nodes[k].has_value(), t.nodes[k].has_value()) << k;
    if (!t.nodes[k]) continue;
    EXPECT_EQ(back.nodes[k]->forward_s, t.nodes[k]->forward_s) << k;
    EXPECT_EQ(back.nodes[k]->backward_input_s, t.nodes[k]->backward_input_s) << k;
    EXPECT_EQ(back.nodes[k]->backward_weight_s, t.nodes[k]->backward_weight_s) << k;
  }
  EXPECT_EQ(back.p2p_s, t.p2p_s);
  EXPECT_TRUE(back.recompute_experts);
  EXPECT_EQ(back.recompute, t.recompute);
  EXPECT_EQ(back.moe_wgrad_merge, t.moe_wgrad_merge);
  EXPECT_EQ(back.update_s_per_weight, t.update_s_per_weight);
  EXPECT_EQ(back.grad_reduce_bus_bytes_per_s, t.grad_reduce_bus_bytes_per_s);
  EXPECT_EQ(back.step_end_s_per_weight, t.step_end_s_per_weight);
  EXPECT_TRUE(back.defer_optimizer);
  EXPECT_EQ(back.node_gap_s, t.node_gap_s);
  ASSERT_TRUE(back.measured_at.has_value());
  EXPECT_EQ(back.measured_at->model.num_layers, 3);
  EXPECT_EQ(back.measured_at->model.hidden_size, 128);
  EXPECT_EQ(back.measured_at->micro_batch_size, 2);
  EXPECT_EQ(back.measured_at->expert_parallel_size, 2);
  EXPECT_EQ(back.measured_at->activation_elem_bytes, 4);
  EXPECT_EQ(back.node_overhead_s, t.node_overhead_s);
}

TEST(NodeTimesFile, UnmeasuredFieldsStayUnmeasured) {
  NodeTimesTable t;
  t.nodes[static_cast<int>(NodeKind::kMlp)] = NodePhaseTimes{1e-4, 1e-4, 1e-4};
  const NodeTimesTable back = parse_node_times(node_times_json(t).dump(), "t.json");
  EXPECT_FALSE(back.nodes[static_cast<int>(NodeKind::kAttention)].has_value());
  EXPECT_TRUE(back.nodes[static_cast<int>(NodeKind::kMlp)].has_value());
  EXPECT_FALSE(back.p2p_s || back.update_s_per_weight || back.grad_reduce_bus_bytes_per_s ||
               back.step_end_s_per_weight || back.node_gap_s || back.measured_at ||
               back.node_overhead_s || back.moe_wgrad_merge);
  EXPECT_TRUE(back.recompute.empty());
}

// "recompute" names the modules the times were measured recomputing (parse_recompute's words);
// another word, or another type, is refused naming it.
TEST(NodeTimesFile, RecomputeNamesModules) {
  EXPECT_EQ(parse_node_times(R"({"nodes": {}, "recompute": "mlp"})", "t").recompute, "mlp");
  for (const char* bad :
       {R"({"nodes": {}, "recompute": "attn"})", R"({"nodes": {}, "recompute": true})"}) {
    try {
      parse_node_times(bad, "t.json");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("recompute"), std::string::npos) << e.what();
    }
  }
}

TEST(NodeTimesFile, UnknownNodeIsNamedWithTheValidOnes) {
  try {
    parse_node_times(R"({"nodes": {"atention": {"forward": 1}}})", "t.json");
    FAIL() << "accepted an unknown node";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("atention"), std::string::npos) << what;
    EXPECT_NE(what.find("attention, dispatch"), std::string::npos) << what;
  }
}

// The trace writer: the document is JSON with each event as given, parts joined in order.
TEST(TraceEvents, DocumentHoldsEveryPartsEvents) {
  TraceEvents a, b;
  a.process(0, "rank 0");
  a.thread(0, 1, "comm");
  a.span(0, 1, "F0 dispatch", 10, 5, "F", {{"layer", 3}});
  b.memory(1, 12.5, {{"activations", 4096}});
  const nlohmann::json doc =
      nlohmann::json::parse(trace_document({a.text(), "", b.text()}, {{"k", 1}}));
  const nlohmann::json& events = doc["traceEvents"];
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0]["args"]["name"], "rank 0");
  EXPECT_EQ(events[1]["tid"], 1);
  EXPECT_EQ(events[2]["ph"], "X");
  EXPECT_EQ(events[2]["cat"], "F");
  EXPECT_EQ(events[2]["ts"], 10.0);
  EXPECT_EQ(events[2]["dur"], 5.0);
  EXPECT_EQ(events[2]["args"]["layer"], 3);
  EXPECT_EQ(events[3]["pid"], 1);
  EXPECT_EQ(events[3]["args"]["activations"], 4096);
  EXPECT_EQ(doc["otherData"]["k"], 1);
  EXPECT_FALSE(nlohmann::json::parse(trace_document({a.text()})).contains("otherData"));
}

}  // namespace
}  // namespace tandem::schedule
