// Node times measured at one shape, planned at another (Note [Node times at another shape] in
// planner/node_scaling.cc). Oracle: a synthetic device whose node times are known at every
// shape, t = o + s * work (o fixed seconds a node, s seconds per roofline second); its times at
// one shape, scaled, must equal its times written directly at the other, node by node and for
// the whole planned step.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "planner/node_scaling.h"
#include "planner/planner.h"

namespace tandem::schedule {
namespace {

constexpr double kOverhead = 4e-5;  // o
constexpr double kSlope = 1.7;      // s

// Shape (b)'s widths, fewer layers: H 1024, 16 heads, 8 groups, E 8 top-2, F 2816, V 32000.
ModelConfig model_b(int64_t layers = 2, int64_t seq = 2048) {
  ModelConfig c;
  c.num_layers = layers;
  c.hidden_size = 1024;
  c.num_attention_heads = 16;
  c.num_query_groups = 8;
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.ffn_hidden_size = 2816;
  c.vocab_size = 32000;
  c.seq_length = seq;
  return c;
}

PlanInputs inputs(const ModelConfig& m, int64_t micro_batch, int64_t ep = 1) {
  PlanInputs in;
  in.model = m;
  in.micro_batch_size = micro_batch;
  in.expert_parallel_size = ep;
  in.activation_elem_bytes = 2;
  in.gpu = true;
  in.cost.kind = CostModelKind::kNodeTimes;
  return in;
}

FootprintShape shape_of(const PlanInputs& in) {
  FootprintShape s = single_rank_shape(in.model, in.micro_batch_size, in.activation_elem_bytes);
  s.local_experts = in.model.num_experts / in.expert_parallel_size;
  s.ep_size = in.expert_parallel_size;
  return s;
}

// The synthetic device's table at `in`'s shape: every compute node's phases o + s * work, the
// embedding's with `embed_overhead` as its fixed part.
NodeTimesTable synthetic_table(const PlanInputs& in, double embed_overhead = kOverhead) {
  const DeviceDesc d;
  const FootprintShape s = shape_of(in);
  NodeTimesTable t;
  for (NodeKind kind : {NodeKind::kEmbed, NodeKind::kAttention, NodeKind::kDispatch,
                        NodeKind::kExperts, NodeKind::kCombine, NodeKind::kLoss}) {
    const NodeWork w = node_forward_work(kind, in.model, s, in.expert_parallel_size, 2);
    const double work =
        std::max(w.flops / d.matrix_flops_per_s, w.memory_bytes / d.memory_bytes_per_s);
    // The all-to-all nodes without expert parallelism: local work on the rows.
    const double fixed = kind == NodeKind::kEmbed ? embed_overhead : kOverhead;
    const double time = node_is_communication(kind) ? 3e-6 * static_cast<double>(s.tokens) / 4096
                                                    : fixed + kSlope * work;
    NodePhaseTimes p{time, kind == NodeKind::kEmbed ? 0.0 : time,
                     node_has_weights(kind) ? time : 0.0};
    t.nodes[static_cast<size_t>(kind)] = p;
  }
  return t;
}

// The table of `at` with the shape it was measured at.
NodeTimesTable measured_table(const PlanInputs& at, double embed_overhead = kOverhead) {
  NodeTimesTable t = synthetic_table(at, embed_overhead);
  MeasuredShape m;
  m.model = at.model;
  m.micro_batch_size = at.micro_batch_size;
  m.expert_parallel_size = at.expert_parallel_size;
  m.activation_elem_bytes = at.activation_elem_bytes;
  m.source = "nodes.json";
  t.measured_at = m;
  return t;
}

TEST(NodeScaling, TheFitFindsTheFixedPart) {
  PlanInputs at = inputs(model_b(), 2);
  at.cost.table = measured_table(at);
  EXPECT_NEAR(node_overhead_s(at.cost, shape_of(at)), kOverhead, 1e-12);
}

// Each node at micro-batch 1, 4 and 8, at another sequence length and top-k, from the times at
// micro-batch 2: the synthetic device's own times there.
TEST(NodeScaling, ScaledTimesEqualTheDirectOnes) {
  PlanInputs at = inputs(model_b(), 2);
  const NodeTimesTable measured = measured_table(at);
  ModelConfig top1 = model_b();
  top1.moe_router_topk = 1;
  for (const PlanInputs& plan : {inputs(model_b(), 1), inputs(model_b(), 4), inputs(model_b(), 8),
                                 inputs(model_b(6, 1024), 2), inputs(top1, 2)}) {
    CostModel cost = plan.cost;
    cost.table = measured;
    const NodeTimesTable direct = synthetic_table(plan);
    for (NodeKind kind : {NodeKind::kEmbed, NodeKind::kAttention, NodeKind::kExperts,
                          NodeKind::kLoss, NodeKind::kDispatch}) {
      const NodePhaseTimes got = node_times(cost, kind, plan.model, shape_of(plan), 1);
      const NodePhaseTimes& want = *direct.nodes[static_cast<size_t>(kind)];
      const std::string what = std::string(node_kind_name(kind)) + " at micro-batch " +
                               std::to_string(plan.micro_batch_size);
      EXPECT_NEAR(got.forward_s, want.forward_s, 1e-9 * want.forward_s + 1e-15) << what;
      EXPECT_NEAR(got.backward_input_s, want.backward_input_s, 1e-9 * want.forward_s + 1e-15)
          << what;
      EXPECT_NEAR(got.backward_weight_s, want.backward_weight_s, 1e-9 * want.forward_s + 1e-15)
          << what;
    }
  }
}

// The whole plan: from the micro-batch-2 file, a plan at micro-batch 4 with 6 layers is the plan
// from the synthetic device's own times there.
TEST(NodeScaling, AScaledPlanIsTheDirectPlan) {
  PlanInputs at = inputs(model_b(8), 2);
  const NodeTimesTable measured = measured_table(at);
  PlanRequest req;
  req.schedule_name = "1f1b";
  req.inputs = inputs(model_b(6), 4);
  req.shape = {1, 1, 4};
  PlanRequest direct = req;
  req.inputs.cost.table = measured;
  direct.inputs.cost.table = synthetic_table(direct.inputs);
  const Plan scaled = make_plan(req), want = make_plan(direct);
  EXPECT_NEAR(scaled.sim.step_time_s, want.sim.step_time_s, 1e-9 * want.sim.step_time_s);
  EXPECT_NEAR(scaled.sim.full_step_s, want.sim.full_step_s, 1e-9 * want.sim.full_step_s);
  // Without the file's shape the times are taken as they are: the plan is off by the work.
  req.inputs.cost.table.measured_at.reset();
  EXPECT_LT(make_plan(req).sim.step_time_s, 0.8 * want.sim.step_time_s);
}

// A node of less fixed time than the line's (the embedding: one kernel, o / 20 here, below the
// line at its small work) still grows with its work: planned at micro-batch 8 from micro-batch
// 2, its phases are the synthetic device's own there, not its measured times taken as all fixed.
TEST(NodeScaling, APhaseBelowTheLineGrowsWithItsWork) {
  constexpr double kEmbedOverhead = kOverhead / 20;
  PlanInputs at = inputs(model_b(), 2);
  PlanInputs plan = inputs(model_b(), 8);
  plan.cost.table = measured_table(at, kEmbedOverhead);
  const NodePhaseTimes measured = *plan.cost.table.nodes[static_cast<size_t>(NodeKind::kEmbed)];
  ASSERT_LT(measured.forward_s, node_overhead_s(plan.cost, shape_of(plan)));  // below the line
  const NodePhaseTimes want =
      *synthetic_table(plan, kEmbedOverhead).nodes[static_cast<size_t>(NodeKind::kEmbed)];
  const NodePhaseTimes got = node_times(plan.cost, NodeKind::kEmbed, plan.model, shape_of(plan), 1);
  EXPECT_NEAR(got.forward_s, want.forward_s, 0.05 * want.forward_s);
  EXPECT_NEAR(got.backward_weight_s, want.backward_weight_s, 0.05 * want.backward_weight_s);
  EXPECT_GT(got.forward_s, 2 * measured.forward_s);
}

// At the measured shape the file's times are used as they are.
TEST(NodeScaling, TheMeasuredShapeKeepsItsTimes) {
  PlanInputs at = inputs(model_b(), 2);
  at.cost.table = measured_table(at);
  at.cost.table.nodes[static_cast<size_t>(NodeKind::kLoss)]->forward_s = 7e-3;  // off the line
  const NodePhaseTimes t = node_times(at.cost, NodeKind::kLoss, at.model, shape_of(at), 1);
  EXPECT_DOUBLE_EQ(t.forward_s, 7e-3);
}

// Measured without expert parallelism (a hand-over), planned with it: the link's time on top.
TEST(NodeScaling, AllToAllGainsTheLinkTimeWhenMeasuredWithoutIt) {
  PlanInputs at = inputs(model_b(), 2);
  const NodeTimesTable measured = measured_table(at);
  PlanInputs plan = inputs(model_b(), 2, 2);
  plan.cost.table = measured;
  const FootprintShape s = shape_of(plan);
  const double link = plan.cost.device.link_latency_s +
                      alltoall_bytes(plan.model, s, 2) / plan.cost.device.link_bytes_per_s;
  const NodePhaseTimes t = node_times(plan.cost, NodeKind::kDispatch, plan.model, s, 2);
  EXPECT_NEAR(t.forward_s, 3e-6 + link, 1e-15);
  EXPECT_NEAR(t.backward_input_s, 3e-6 + link, 1e-15);
}

std::string refusal(const ModelConfig& m, int64_t elem_bytes) {
  PlanInputs at = inputs(model_b(), 2);
  try {
    check_transferable(*measured_table(at).measured_at, m, elem_bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NodeScaling, AnotherWidthIsRefusedNamingIt) {
  ModelConfig wide = model_b();
  wide.hidden_size = 2048;
  EXPECT_NE(refusal(wide, 2).find("--node-times nodes.json was measured with --hidden-size 1024; "
                                  "this plan has --hidden-size 2048"),
            std::string::npos)
      << refusal(wide, 2);
  ModelConfig vocab = model_b();
  vocab.vocab_size = 50304;
  EXPECT_NE(refusal(vocab, 2).find("--vocab-size 32000"), std::string::npos);
  EXPECT_NE(refusal(model_b(), 4).find("measured with 2-byte activations; this plan has 4-byte"),
            std::string::npos);
  // Rows and layers transfer.
  ModelConfig longer = model_b(16, 4096);
  longer.moe_router_topk = 1;
  EXPECT_EQ(refusal(longer, 2), "");
  // Through the plan: the same refusal.
  PlanRequest req;
  req.inputs = inputs(wide, 2);
  req.inputs.cost.table = measured_table(inputs(model_b(), 2));
  req.shape = {1, 1, 2};
  EXPECT_THROW(make_plan(req), Error);
}

TEST(NodeScaling, TheShapeRoundTripsThroughTheFile) {
  ModelConfig m = model_b(6);
  m.moe_layer_freq = "[0,1,1,1,1,1]";
  m.qk_layernorm = true;  // Qwen3-MoE: a family with dense layers among MoE ones
  m.rotary_base = 5e5;
  MeasuredShape at;
  at.model = m;
  at.micro_batch_size = 3;
  at.expert_parallel_size = 2;
  at.activation_elem_bytes = 2;
  const nlohmann::json file = {{"nodes", nlohmann::json::object()},
                               {"measured_at", measured_shape_json(at)}};
  const NodeTimesTable t = parse_node_times(file.dump(), "f.json");
  ASSERT_TRUE(t.measured_at.has_value());
  EXPECT_EQ(t.measured_at->micro_batch_size, 3);
  EXPECT_EQ(t.measured_at->expert_parallel_size, 2);
  EXPECT_EQ(t.measured_at->source, "f.json");
  EXPECT_EQ(measured_shape_json(*t.measured_at), measured_shape_json(at));
  nlohmann::json bad = file;
  bad["measured_at"]["model"]["hidden-size"] = "wide";
  try {
    parse_node_times(bad.dump(), "f.json");
    ADD_FAILURE() << "a string hidden size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f.json: measured_at.model.hidden-size"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem::schedule

namespace tandem::schedule {
namespace {

// A file's node_overhead_s replaces the fit: 0 scales every node in plain proportion to its work.
TEST(NodeScaling, TheFileMaySetTheFixedPart) {
  PlanInputs at = inputs(model_b(), 2);
  const nlohmann::json file = {
      {"nodes", {{"attention", {{"forward", 1e-3}}}, {"loss", {{"forward", 2e-3}}}}},
      {"measured_at", measured_shape_json(*measured_table(at).measured_at)},
      {"node_overhead_s", 0}};
  PlanInputs plan = inputs(model_b(), 4);
  plan.cost.table = parse_node_times(file.dump(), "f.json");
  EXPECT_EQ(node_overhead_s(plan.cost, shape_of(plan)), 0);
  const NodePhaseTimes t = node_times(plan.cost, NodeKind::kLoss, plan.model, shape_of(plan), 1);
  EXPECT_NEAR(t.forward_s, 4e-3, 1e-12);  // twice the tokens, twice the LM head's FLOPs
  nlohmann::json bad = file;
  bad.erase("measured_at");
  EXPECT_THROW(parse_node_times(bad.dump(), "f.json"), Error);
}

}  // namespace
}  // namespace tandem::schedule

namespace tandem::schedule {
namespace {

// Note [Gaps between nodes]: the file's node_gap_s comes before every phase of a node on the
// compute stream, at the measured shape and at another. With one expert rank every node runs
// there: per micro-batch the embedding's forward and weight gradient (it has no input-gradient
// phase), 10 phases a layer (attention 3, dispatch 2, experts 3, combine 2) and the loss's 3,
// so a 1F1B step on one rank grows by gap x 25 x micro-batches.
TEST(NodeScaling, TheGapBetweenNodesComesBeforeEveryComputePhase) {
  constexpr double kGap = 5e-6;
  const PlanInputs at = inputs(model_b(), 2);
  for (int64_t micro_batch : {2, 4}) {
    PlanRequest req;
    req.schedule_name = "1f1b";
    req.inputs = inputs(model_b(), micro_batch);
    req.inputs.cost.table = measured_table(at);
    req.shape = {1, 1, 3};
    PlanRequest gapped = req;
    gapped.inputs.cost.table.node_gap_s = kGap;
    const Plan without = make_plan(req), with = make_plan(gapped);
    EXPECT_NEAR(with.sim.step_time_s - without.sim.step_time_s, kGap * 25 * 3, 1e-12)
        << "micro-batch " << micro_batch;
  }
}

TEST(NodeScaling, TheGapIsReadFromTheFile) {
  const nlohmann::json file = {{"nodes", {{"attention", {{"forward", 1e-3}}}}},
                               {"node_gap_s", 4e-6}};
  EXPECT_EQ(parse_node_times(file.dump(), "f.json").node_gap_s, 4e-6);
  EXPECT_FALSE(parse_node_times(R"({"nodes": {}})", "f.json").node_gap_s.has_value());
  for (const char* bad :
       {R"({"nodes": {}, "node_gap_s": -1e-6})", R"({"nodes": {}, "node_gap_s": "4us"})"}) {
    try {
      parse_node_times(bad, "f.json");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.json: node_gap_s"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tandem::schedule
