// Cost model and roofline simulation. Oracles: FLOPs and bytes worked out by hand for a tiny
// config; timelines of both streams worked out by hand (in the comments) from a node-times
// table, for 1f1b and combined-1f1b at PP = 1 and for a pipeline message at PP = 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "planner/planner.h"

namespace tandem::schedule {
namespace {

constexpr double kEps = 1e-9;

// H 8, heads 2 (D 4), kv 1 (K 4, Q 8), E 4, k 2, F 16, V 32, T 4; micro-batch 2 -> N 8, R 16.
ModelConfig tiny() {
  ModelConfig c;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.ffn_hidden_size = 16;
  c.vocab_size = 32;
  c.seq_length = 4;
  c.num_layers = 1;
  c.untie_embeddings_and_output_weights = true;  // the counts below have an LM head of its own
  return c;
}

FootprintShape tiny_shape(int64_t ep) {
  FootprintShape s;
  s.tokens = 8;
  s.expert_rows = 16;
  s.local_experts = 4 / ep;
  s.elem_bytes = 2;
  return s;
}

TEST(CostModel, NodeFlopsByHand) {
  const ModelConfig c = tiny();
  const FootprintShape s = tiny_shape(4);
  // attention: qkv 2*8*8*16 + out 2*8*8*8 + causal core 2*8*4*8 + router 2*8*8*4.
  EXPECT_DOUBLE_EQ(node_forward_work(NodeKind::kAttention, c, s, 4, 2).flops,
                   2048 + 1024 + 512 + 512);
  EXPECT_DOUBLE_EQ(node_forward_work(NodeKind::kExperts, c, s, 4, 2).flops, 6 * 16 * 8 * 16);
  EXPECT_DOUBLE_EQ(node_forward_work(NodeKind::kLoss, c, s, 4, 2).flops, 2 * 8 * 8 * 32);
  EXPECT_DOUBLE_EQ(node_forward_work(NodeKind::kEmbed, c, s, 4, 2).flops, 0);
  ModelConfig dense = c;
  dense.num_experts = 0;
  EXPECT_DOUBLE_EQ(node_forward_work(NodeKind::kMlp, dense, s, 1, 2).flops, 6 * 8 * 8 * 16);
  // attention bytes: weights (8*16 + 8*8 + 2*8 + 8*4) * 2 + activations 8*(6*8 + 4*8 + 4*4) * 2.
  EXPECT_DOUBLE_EQ(node_forward_work(NodeKind::kAttention, c, s, 4, 2).memory_bytes, 480 + 1536);
}

TEST(CostModel, CommunicationBytes) {
  const ModelConfig c = tiny();
  // tokens * k * hidden * elem * (EP-1)/EP = 8 * 2 * 8 * 2 * 3/4.
  EXPECT_DOUBLE_EQ(alltoall_bytes(c, tiny_shape(4), 4), 192);
  EXPECT_DOUBLE_EQ(alltoall_bytes(c, tiny_shape(1), 1), 0);
  EXPECT_DOUBLE_EQ(node_forward_work(NodeKind::kDispatch, c, tiny_shape(4), 4, 2).comm_bytes, 192);
  EXPECT_EQ(p2p_bytes(c, tiny_shape(4)), 8 * 8 * 2);
}

TEST(CostModel, RooflineTimes) {
  CostModel cost;
  cost.device = {1000, 1e9, 96, 1, 2};  // 1000 flop/s, 1 GB/s, 96 B/s links, 1 s latency
  const ModelConfig c = tiny();
  const NodePhaseTimes att = node_times(cost, NodeKind::kAttention, c, tiny_shape(4), 4);
  EXPECT_DOUBLE_EQ(att.forward_s, 4.096);  // compute bound
  EXPECT_DOUBLE_EQ(att.backward_input_s, 4.096);
  EXPECT_DOUBLE_EQ(att.backward_weight_s, 4.096);
  const NodePhaseTimes emb = node_times(cost, NodeKind::kEmbed, c, tiny_shape(4), 4);
  EXPECT_DOUBLE_EQ(emb.forward_s, (8 * 8 * 4 + 8 * 4) / 1e9);  // memory bound
  EXPECT_DOUBLE_EQ(emb.backward_input_s, 0);                   // token ids have no gradient
  const NodePhaseTimes disp = node_times(cost, NodeKind::kDispatch, c, tiny_shape(4), 4);
  EXPECT_DOUBLE_EQ(disp.forward_s, 1 + 192.0 / 96);
  EXPECT_DOUBLE_EQ(disp.backward_input_s, 3);
  EXPECT_DOUBLE_EQ(disp.backward_weight_s, 0);
  EXPECT_DOUBLE_EQ(node_times(cost, NodeKind::kCombine, c, tiny_shape(1), 1).forward_s, 0);
  EXPECT_DOUBLE_EQ(p2p_time(cost, 96), 2);
  cost.kind = CostModelKind::kUniform;
  EXPECT_DOUBLE_EQ(p2p_time(cost, 96), 0);
}

constexpr const char* kTable = R"({
  "nodes": {
    "embed": {"forward": 0},
    "attention": {"forward": 2},
    "dispatch": {"forward": 1},
    "experts": {"forward": 3, "backward_input": 3, "backward_weight": 3},
    "combine": {"forward": 1},
    "loss": {"forward": 0}
  },
  "p2p": 0.5
})";

TEST(CostModel, NodeTimesFile) {
  const NodeTimesTable t = parse_node_times(kTable, "table.json");
  const auto& att = t.nodes[static_cast<int>(NodeKind::kAttention)];
  ASSERT_TRUE(att.has_value());
  EXPECT_EQ(att->backward_input_s, 2);  // defaults to the forward
  EXPECT_EQ(att->backward_weight_s, 2);
  EXPECT_EQ(t.nodes[static_cast<int>(NodeKind::kDispatch)]->backward_weight_s, 0);
  EXPECT_FALSE(t.nodes[static_cast<int>(NodeKind::kMlp)].has_value());
  EXPECT_EQ(*t.p2p_s, 0.5);
  auto error_of = [](const char* text) {
    try {
      parse_node_times(text, "t.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("{").find("t.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{}").find("expected {\"nodes\""), std::string::npos);
  EXPECT_NE(error_of(R"({"nodes": {"mlp2": {"forward": 1}}})").find("unknown node \"mlp2\""),
            std::string::npos);
  EXPECT_NE(
      error_of(R"({"nodes": {"mlp": {"forward": -1}}})").find("nodes.mlp.forward: expected a time"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"nodes": {"mlp": {"fwd": 1}}})").find("at least \"forward\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"nodes": {"mlp": {"forward": 1, "bwd": 1}}})").find("unknown key \"bwd\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"nodes": {"combine": {"forward": 1, "backward_weight": 1}}})")
                .find("combine has no weights"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"nodes": {}, "extra": 1})").find("unknown key \"extra\""),
            std::string::npos);
  EXPECT_FALSE(t.recompute_experts);
  EXPECT_TRUE(
      parse_node_times(R"({"nodes": {}, "recompute_experts": true})", "t").recompute_experts);
  EXPECT_NE(error_of(R"({"nodes": {}, "recompute_experts": 1})")
                .find("recompute_experts: expected true or false, got 1"),
            std::string::npos);
  EXPECT_FALSE(t.moe_wgrad_merge.has_value());
  EXPECT_EQ(parse_node_times(R"({"nodes": {}, "moe_wgrad_merge": 8})", "t").moe_wgrad_merge, 8);
  EXPECT_NE(error_of(R"({"nodes": {}, "moe_wgrad_merge": 0})")
                .find("moe_wgrad_merge: expected an integer >= 1, got 0"),
            std::string::npos);
}

// A plan of `schedule` on p ranks (a layer each) and m micro-batches, costed by kTable.
PlanRequest table_request(const char* schedule, int32_t p, int32_t m) {
  PlanRequest req;
  req.schedule_name = schedule;
  req.shape = {p, 1, m};
  req.inputs.model = tiny();
  req.inputs.model.num_layers = p;
  req.inputs.micro_batch_size = 2;
  req.inputs.expert_parallel_size = 4;
  // The GPU trainer's timeline: a full B's weight gradients off the chain, beside the next
  // nodes (the CPU trainer runs each right after its input gradient).
  req.inputs.gpu = true;
  req.inputs.activation_elem_bytes = 2;
  req.inputs.cost.kind = CostModelKind::kNodeTimes;
  req.inputs.cost.table = parse_node_times(kTable, "table");
  return req;
}

Plan table_plan(const char* schedule, int32_t p, int32_t m) {
  return make_plan(table_request(schedule, p, m));
}

// The experts node of a one-stage plan.
StageNode experts_node(const Plan& plan) {
  for (const StageNode& n : plan.model.stages[0].nodes) {
    if (n.kind == NodeKind::kExperts) return n;
  }
  ADD_FAILURE() << "the plan has no experts node";
  return {};
}

// Note [Recompute in the plan]: planned with --recompute-experts from times measured without
// it, the experts' input-gradient half gains 2/3 of their forward (3 -> 5 per layer and
// micro-batch here); from times measured with it, nothing is added.
// The exposed all-to-all of a measured GPU trace (Note [Exposed all-to-all] in
// runtime/device_streams.h) is computed with these two.
TEST(Simulator, IntervalUnionAndUncoveredTime) {
  using Intervals = std::vector<std::pair<double, double>>;
  EXPECT_EQ(merge_intervals({{3, 4}, {0, 2}, {1, 2.5}, {2.5, 2.75}, {5, 5.5}}),
            (Intervals{{0, 2.75}, {3, 4}, {5, 5.5}}));
  EXPECT_TRUE(merge_intervals({}).empty());
  // All-to-all in [0, 4) and [6, 8); compute in [1, 2), [3, 7): uncovered [0, 1), [2, 3), [7, 8).
  EXPECT_DOUBLE_EQ(
      uncovered_time(merge_intervals({{6, 8}, {0, 4}}), merge_intervals({{3, 7}, {1, 2}})), 3.0);
  EXPECT_DOUBLE_EQ(uncovered_time({{0, 4}}, {}), 4.0);
  EXPECT_DOUBLE_EQ(uncovered_time({{1, 2}}, {{0, 5}}), 0.0);
}

// Note [Recomputed modules] (model/ffn_nodes.cc) in the plan, as Note [Recompute in the plan]:
// from times measured without it, --recompute mlp adds 2/3 of the mlp's forward to its
// input-gradient half (3 -> 5), shared_experts all of a gated shared expert's forward (its down
// and gate products run again too: 1.5 -> 3); from times measured with a module ("recompute" in
// the file), nothing for that module.
TEST(Simulator, RecomputedModulesCostTheirForwardsUnlessMeasuredSo) {
  auto input_halves = [](const std::string& recompute, const std::string& measured) {
    PlanRequest req = table_request("1f1b", 1, 2);
    ModelConfig& m = req.inputs.model;
    m.num_layers = 2;
    m.moe_layer_freq = "[0,1]";
    m.moe_shared_expert_intermediate_size = 8;
    m.moe_shared_expert_gate = true;
    req.inputs.cost.table.nodes[static_cast<int>(NodeKind::kMlp)] = NodePhaseTimes{3, 3, 3};
    req.inputs.cost.table.nodes[static_cast<int>(NodeKind::kSharedExpert)] =
        NodePhaseTimes{1.5, 1.5, 1.5};
    req.inputs.cost.table.recompute = measured;
    req.inputs.recompute = parse_recompute(recompute);
    std::pair<double, double> halves{-1, -1};  // the mlp's, the shared expert's
    const Plan plan = make_plan(req);
    for (const StageNode& n : plan.model.stages[0].nodes) {
      if (n.kind == NodeKind::kMlp) halves.first = n.times.backward_input_s;
      if (n.kind == NodeKind::kSharedExpert) halves.second = n.times.backward_input_s;
    }
    return halves;
  };
  const auto expect_halves = [&](const std::string& recompute, const std::string& measured,
                                 double mlp, double shared) {
    const std::pair<double, double> got = input_halves(recompute, measured);
    EXPECT_NEAR(got.first, mlp, kEps) << recompute << " measured with " << measured;
    EXPECT_NEAR(got.second, shared, kEps) << recompute << " measured with " << measured;
  };
  expect_halves("", "", 3, 1.5);
  expect_halves("mlp", "", 5, 1.5);
  expect_halves("mlp,shared_experts", "", 5, 3);
  expect_halves("mlp,shared_experts", "shared_experts", 5, 1.5);
  expect_halves("shared_experts", "mlp,shared_experts", 3, 1.5);
}

// A node-times file holds the experts' weight-gradient time under the merge it was measured
// with (Note [Merged expert weight gradients in the plan]): a plan with another merge is
// refused, naming both; the same merge plans.
TEST(Simulator, NodeTimesOfAnotherWeightGradientMergeAreRefused) {
  PlanRequest req = table_request("1f1b", 1, 4);
  req.inputs.cost.table.moe_wgrad_merge = 4;
  try {
    make_plan(req);
    ADD_FAILURE() << "a plan with merge 1 from times measured with 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("measured with --moe-wgrad-merge 4 but the plan has "
                                         "--moe-wgrad-merge 1"),
              std::string::npos)
        << e.what();
  }
  req.inputs.moe_wgrad_merge = 4;
  EXPECT_GT(make_plan(req).sim.ranks[0].activation_peak_bytes, 0);
}

// Note [Merged expert weight gradients in the plan]: the table's experts' weight-gradient time
// is a micro-batch's; merged by 3 over 4 micro-batches, the passes that set their micro-batch
// aside take none, the third the group's three, the fourth (a group of one) its own; the step's
// total is unchanged.
TEST(Simulator, MergedExpertWeightGradientPassesTakeTheirGroupsTime) {
  PlanRequest req = table_request("1f1b", 1, 4);
  req.inputs.cost.table.moe_wgrad_merge = 3;
  req.inputs.moe_wgrad_merge = 3;
  const Plan plan = make_plan(req);
  const double each = experts_node(plan).times.backward_weight_s;
  std::vector<double> passes;
  for (const Span& s : plan.sim.ranks[0].spans) {
    if (s.kind == SpanKind::kNode && s.node == NodeKind::kExperts &&
        s.phase == Phase::kBackwardWeight) {
      passes.push_back(s.end - s.start);
    }
  }
  ASSERT_EQ(passes.size(), 2u);  // the passes of no time leave no span
  EXPECT_NEAR(passes[0], 3 * each, kEps);
  EXPECT_NEAR(passes[1], each, kEps);
}

TEST(Simulator, RecomputedExpertsCostTwoThirdsOfTheirForwardUnlessMeasuredSo) {
  auto experts_input_half = [](bool recompute, bool measured_with) {
    PlanRequest req = table_request("1f1b", 1, 2);
    req.inputs.recompute_experts = recompute;
    req.inputs.cost.table.recompute_experts = measured_with;
    return experts_node(make_plan(req)).times.backward_input_s;
  };
  EXPECT_NEAR(experts_input_half(false, false), 3, kEps);
  {  // Note [Slowest expert rank]: the slowest rank's own pace scales its experts' times
    PlanRequest req = table_request("1f1b", 1, 2);
    req.inputs.expert_pace = {{1.5, 0.0}};
    const NodePhaseTimes t = experts_node(make_plan(req)).times;
    EXPECT_NEAR(t.forward_s, 4.5, kEps);
    EXPECT_NEAR(t.backward_input_s, 4.5, kEps);
    EXPECT_NEAR(t.backward_weight_s, 4.5, kEps);
  }
  {  // a faster rank's experts take less, and the all-to-all after them waits for the slowest
    PlanRequest req = table_request("1f1b", 1, 2);
    req.inputs.expert_pace = {{0.5, 1.0}};
    const Plan plan = make_plan(req);
    EXPECT_NEAR(experts_node(plan).times.forward_s, 1.5, kEps);
    EXPECT_NEAR(experts_node(plan).times.backward_weight_s, 1.5, kEps);
    for (const StageNode& n : plan.model.stages[0].nodes) {
      if (n.kind == NodeKind::kCombine) {  // its forward follows the experts' forward
        EXPECT_NEAR(n.times.forward_s, 1 + 3, kEps);
        EXPECT_NEAR(n.times.backward_input_s, 1, kEps);
      } else if (n.kind == NodeKind::kDispatch) {  // its backward follows the experts' backward
        EXPECT_NEAR(n.times.forward_s, 1, kEps);
        EXPECT_NEAR(n.times.backward_input_s, 1 + 3, kEps);
      }
    }
    // Per micro-batch: attn [0,2] disp [2,3] exp [3,4.5] comb [4.5,8.5] (waiting [4.5,7.5]);
    // comb.b [8.5,9.5] exp I [9.5,11] W [11,12.5] disp.b [11,15] (waiting [11,14]) attn
    // [15,19]. Exposed all-to-all 1 + 4 + 1 + 2.5 = 8.5, of it the transfers' 1 + 1 + 1 + 1 = 4:
    // 4.5 waiting; two micro-batches.
    const RankResult& r = plan.sim.ranks[0];
    EXPECT_NEAR(r.exposed_alltoall_s, 17, kEps);
    EXPECT_NEAR(r.exposed_alltoall_waiting_s, 9, kEps);
  }
  EXPECT_NEAR(experts_input_half(true, false), 5, kEps);
  EXPECT_NEAR(experts_input_half(true, true), 3, kEps);
}

TEST(Simulator, OneFOneBExposesEveryAllToAllThatHasNothingToHideBehind) {
  // Per layer: attention 2, dispatch 1 (comm), experts 3 (+3 weight), combine 1 (comm).
  // F0: attn [0,2] disp [2,3] exp [3,6] comb [6,7].  B0: comb [7,8] exp I [8,11] W [11,14],
  // disp [11,12] (hidden by the experts' W), attn I [14,16] W [16,18].  F1, B1 the same from 18.
  // Exposed per micro-batch: dispatch and combine forward, combine backward = 3; step 36.
  const Plan plan = table_plan("1f1b", 1, 2);
  const RankResult& r = plan.sim.ranks[0];
  EXPECT_NEAR(plan.sim.step_time_s, 36, kEps);
  EXPECT_NEAR(r.compute_busy_s, 30, kEps);
  EXPECT_NEAR(r.comm_busy_s, 8, kEps);
  EXPECT_NEAR(r.exposed_comm_s, 6, kEps);
  EXPECT_NEAR(r.exposed_alltoall_s, 6, kEps);
  EXPECT_NEAR(r.exposed_alltoall_waiting_s, 0, kEps);  // balanced routing: nobody waits
  // With one expert rank, dispatch and combine permute rows in place on the compute stream, in
  // order with the rest (as the runtime issues them): no all-to-all, and nothing hides behind
  // the experts' W, so the step is every node's time, 2 x 19.
  PlanRequest one = table_request("1f1b", 1, 2);
  one.inputs.expert_parallel_size = 1;
  const Plan local = make_plan(one);
  EXPECT_NEAR(local.sim.step_time_s, 38, kEps);
  EXPECT_NEAR(local.sim.ranks[0].compute_busy_s, 38, kEps);
  EXPECT_NEAR(local.sim.ranks[0].comm_busy_s, 0, kEps);
  EXPECT_NEAR(local.sim.ranks[0].exposed_alltoall_s, 0, kEps);
}

TEST(Simulator, CombinedOneFOneBHidesTheAllToAllOfOneHalfBehindTheOther) {
  // F0 as above, ends 7. (F1;B0) in docs/design.md's order: comm comb.b [7,8] | disp.f [9,10] ->
  // disp.b [12,13] | comb.f [18,19]; compute attn.f [7,9] | exp.b [9,12] -> exp.w [12,15] ->
  // exp.f [15,18] | attn.b [18,20] w [20,22].  B1: comb [22,23] exp [23,29] disp [26,27]
  // attn [29,33].  Exposed: [2,3] [6,7] [22,23] = 3; step 33.
  const Plan plan = table_plan("combined-1f1b", 1, 2);
  const RankResult& r = plan.sim.ranks[0];
  EXPECT_NEAR(plan.sim.step_time_s, 33, kEps);
  EXPECT_NEAR(r.compute_busy_s, 30, kEps);
  EXPECT_NEAR(r.exposed_comm_s, 3, kEps);
  bool found = false;
  for (const Span& s : r.spans) {
    if (s.kind == SpanKind::kNode && s.node == NodeKind::kExperts && s.phase == Phase::kForward &&
        s.microbatch == 1) {
      EXPECT_NEAR(s.start, 15, kEps);
      EXPECT_NEAR(s.end, 18, kEps);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

// Note [Paired forwards], two layers, two micro-batches. (0F0;0F1) per kForwardsMoe, layer 1:
// compute attn.0 [0,2] attn.1 [2,4] exp.0 [4,7] exp.1 [7,10]; comm disp.0 [2,3] disp.1 [4,5]
// comb.0 [7,8] comb.1 [10,11]. Layer 2: attn.0 [10,12] attn.1 [12,14] exp.0 [14,17] exp.1
// [17,20]; disp.0 [12,13] disp.1 [14,15] comb.0 [17,18] comb.1 [20,21]. Then B0 [21,42] and B1
// [42,63], each a comb.b, an experts' I and W beside disp.b, an attention's I and W per layer.
// Exposed: comb.1 [20,21] and each backward's first comb.b, [21,22] and [42,43]: 3; step 63.
// Unpaired, 0F0 alone exposes its 4 all-to-alls (step 65, exposed 5). The activation peak holds
// one more micro-batch: with 4, (0F2;0B0) holds three where (0F1;0B0) holds two.
TEST(Simulator, PairedFirstForwardsHideTheFirstForwardsAllToAll) {
  PlanRequest req = table_request("combined-1f1b", 1, 2);
  req.inputs.model.num_layers = 2;
  const Plan unpaired = make_plan(req);
  EXPECT_NEAR(unpaired.sim.step_time_s, 65, kEps);
  EXPECT_NEAR(unpaired.sim.ranks[0].exposed_alltoall_s, 5, kEps);
  req.shape.pair_first_forwards = true;
  const Plan plan = make_plan(req);
  EXPECT_EQ(to_string(plan.schedule.ranks[0].front()), "(0F0;0F1)");
  const RankResult& r = plan.sim.ranks[0];
  EXPECT_NEAR(plan.sim.step_time_s, 63, kEps);
  EXPECT_NEAR(r.exposed_comm_s, 3, kEps);
  EXPECT_NEAR(r.exposed_alltoall_s, 3, kEps);
  std::vector<double> experts, dispatch;  // forward starts, in time order
  for (const Span& s : r.spans) {
    if (s.kind != SpanKind::kNode || s.phase != Phase::kForward) continue;
    if (s.node == NodeKind::kExperts) experts.push_back(s.start);
    if (s.node == NodeKind::kDispatch) dispatch.push_back(s.start);
  }
  EXPECT_EQ(experts, (std::vector<double>{4, 7, 14, 17}));
  EXPECT_EQ(dispatch, (std::vector<double>{2, 4, 12, 14}));

  PlanRequest four = table_request("combined-1f1b", 1, 4);
  const int64_t plain = make_plan(four).sim.ranks[0].activation_peak_bytes;
  four.shape.pair_first_forwards = true;
  const int64_t paired = make_plan(four).sim.ranks[0].activation_peak_bytes;
  const int64_t one = table_plan("1f1b", 1, 1).sim.ranks[0].activation_peak_bytes;
  EXPECT_GT(one, 0);
  EXPECT_EQ(paired - plain, one);
}

// Note [Deferred update in the plan]: the weights (embedding 256, attention side 240, experts
// 384, head 264; 1,144 in all) updated at 1/128 s each in the first forward. F0 alone with EP
// 4: compute upd.embed [0,2] attn: upd [2,3.875] attn [3.875,5.875]; comm disp [5.875,6.875]
// and beside it the experts' weights and half the head's (516: [5.875,9.90625]); exp
// [9.90625,12.90625]; comb [12.90625,13.90625] beside the rest of the head (132:
// [12.90625,13.9375]). F0's all-to-alls are hidden; the rest of the step is the undeferred
// one's 7 -> 33 moved by 6.9375: step 39.9375, exposed 1 (B1's comb.b). Uniform costs: the
// update takes no time and the plan is the undeferred one.
TEST(Simulator, DeferredUpdateRunsBesideTheFirstForwardsAllToAll) {
  PlanRequest req = table_request("combined-1f1b", 1, 2);
  req.inputs.defer_optimizer = true;
  req.inputs.cost.device.memory_bytes_per_s = 30.0 * 128;  // 1/128 s a weight (GPU: 30 bytes)
  const Plan plan = make_plan(req);
  EXPECT_EQ(plan.model.stages[0].num_params, 1144);
  const RankResult& r = plan.sim.ranks[0];
  EXPECT_NEAR(plan.sim.step_time_s, 39.9375, kEps);
  EXPECT_NEAR(r.exposed_alltoall_s, 1, kEps);
  std::vector<std::pair<double, double>> updates;
  for (const Span& s : r.spans) {
    if (s.kind == SpanKind::kUpdate) updates.emplace_back(s.start, s.end);
    if (s.kind == SpanKind::kNode && s.microbatch == 0 && s.phase == Phase::kForward &&
        s.node == NodeKind::kExperts) {
      EXPECT_NEAR(s.start, 9.90625, kEps);
      EXPECT_NEAR(s.end, 12.90625, kEps);
    }
  }
  const std::vector<std::pair<double, double>> want = {
      {0, 2}, {2, 3.875}, {5.875, 9.90625}, {12.90625, 13.9375}};
  ASSERT_EQ(updates.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(updates[i].first, want[i].first, kEps) << "update " << i;
    EXPECT_NEAR(updates[i].second, want[i].second, kEps) << "update " << i;
  }
  const nlohmann::json trace = nlohmann::json::parse(trace_json(plan));
  EXPECT_TRUE(std::any_of(trace["traceEvents"].begin(), trace["traceEvents"].end(), [](auto& e) {
    return e.value("name", "") == "update" && e.value("cat", "") == "U";
  }));
  // A measured rate (--node-times-out of a deferred run) replaces the estimate: 1/64 s a weight
  // doubles every update.
  PlanRequest measured = req;
  measured.inputs.cost.table.update_s_per_weight = 1.0 / 64;
  double total = 0;
  const Plan measured_plan = make_plan(measured);
  for (const Span& s : measured_plan.sim.ranks[0].spans) {
    if (s.kind == SpanKind::kUpdate) total += s.end - s.start;
  }
  EXPECT_NEAR(total, 1144.0 / 64, kEps);
  const NodeTimesTable rate = parse_node_times(R"({"nodes": {}, "update_per_weight": 2e-9})", "t");
  EXPECT_EQ(rate.update_s_per_weight, 2e-9);
  try {
    parse_node_times(R"({"nodes": {}, "update_per_weight": -1})", "t.json");
    ADD_FAILURE() << "a negative update_per_weight was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: update_per_weight: expected"), std::string::npos)
        << e.what();
  }
  PlanRequest uniform = req;
  uniform.inputs.cost.kind = CostModelKind::kUniform;
  PlanRequest plain = uniform;
  plain.inputs.defer_optimizer = false;
  const Plan u = make_plan(uniform), p = make_plan(plain);
  EXPECT_EQ(u.sim.step_time_s, p.sim.step_time_s);
  EXPECT_EQ(u.sim.ranks[0].spans.size(), p.sim.ranks[0].spans.size());
}

// Note [Deferred update in the plan], PP 2 as in PipelineMessagesAndTheirBuffers below (step
// 37), weights at 1/128 s: stage 0 (embedding 256, layer 624) updates in F0, the experts beside
// the dispatch: upd [0,2] [2,3.875] attn [3.875,5.875] disp [5.875,6.875] upd [5.875,8.875]
// exp [8.875,11.875] comb [11.875,12.875], SEND [12.875,13.375]. Stage 1 (layer 624, head 264)
// updates everything at its RECV_F, [0,6.9375], inside the bubble; RECV [12.875,13.375]. The
// step grows by stage 0's 5.875 only: 42.875.
TEST(Simulator, DeferredUpdateOfAReceivingStageFillsTheBubble) {
  PlanRequest req = table_request("1f1b", 2, 1);
  req.inputs.defer_optimizer = true;
  req.inputs.cost.device.memory_bytes_per_s = 30.0 * 128;
  const Plan plan = make_plan(req);
  EXPECT_NEAR(plan.sim.step_time_s, 37 + 5.875, kEps);
  std::vector<std::pair<double, double>> updates;
  bool recv = false;
  for (const Span& s : plan.sim.ranks[1].spans) {
    if (s.kind == SpanKind::kUpdate) updates.emplace_back(s.start, s.end);
    if (s.kind == SpanKind::kRecv && s.phase == Phase::kForward) {
      EXPECT_NEAR(s.start, 12.875, kEps);
      EXPECT_NEAR(s.end, 13.375, kEps);
      recv = true;
    }
  }
  EXPECT_TRUE(recv);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_NEAR(updates[0].first, 0, kEps);
  EXPECT_NEAR(updates[0].second, 888.0 / 128, kEps);
}

TEST(Simulator, PipelineMessagesAndTheirBuffers) {
  // PP 2, m 1, one layer per stage, p2p 0.5. Rank 0: F0 ends 7, SEND [7,7.5]. Rank 1: RECV
  // [7,7.5], F0 [7.5,14.5], B0 [14.5,25.5], SEND_B [25.5,26]. Rank 0: RECV_B [25.5,26],
  // B0: comb [26,27] exp [27,33] disp [30,31] attn [33,37]. Step 37.
  // Exposed, rank 0: disp 1 + comb 1 + send 0.5 + recv 0.5 + comb.b 1 = 4 (3 all-to-all);
  // rank 1: recv 0.5 + disp 1 + comb 1 + comb.b 1 + send 0.5 = 4 (3 all-to-all).
  const Plan plan = table_plan("1f1b", 2, 1);
  EXPECT_NEAR(plan.sim.step_time_s, 37, kEps);
  for (const RankResult& r : plan.sim.ranks) {
    EXPECT_NEAR(r.exposed_comm_s, 4, kEps) << r.rank;
    EXPECT_NEAR(r.exposed_alltoall_s, 3, kEps) << r.rank;
    // One message (8 tokens x 8 hidden x 2 bytes) in flight at a time, none at the end.
    EXPECT_EQ(r.in_flight_peak_bytes, 128) << r.rank;
    EXPECT_EQ(r.memory.back().in_flight_bytes, 0) << r.rank;
    EXPECT_EQ(r.memory.back().activation_bytes, 0) << r.rank;
  }
  EXPECT_NEAR(plan.sim.ranks[1].end_s, 26, kEps);
  // The CPU trainer's plan: the micro-batch's tokens beside the messages
  // (Note [Tokens in the plan] in planner/simulator_state.cc): the first stage keeps its ids [8]
  // i32, the last its targets after loading both. Rank 0's SEND_F goes once its RECV_B proves it
  // delivered, so both messages at once there (Note [Send buffers released when known delivered] in
  // schedule/send_release.cc); rank 1's SEND_B, after its forward's tokens, at the step's end.
  PlanRequest cpu = table_request("1f1b", 2, 1);
  cpu.inputs.gpu = false;
  for (const RankResult& r : make_plan(cpu).sim.ranks) {
    EXPECT_EQ(r.in_flight_peak_bytes, r.rank == 0 ? 2 * 128 + 32 : 128 + 64) << r.rank;
    EXPECT_EQ(r.memory.back().in_flight_bytes, 0) << r.rank;
  }
}

TEST(Simulator, SplitBackwardHoldsWeightedNodesUntilTheirW) {
  // zb-h1 with one rank: 0F0 0I0 0W0. After I, each node with weights still holds what its
  // weight gradient needs (node_weight_saved_bytes); the weightless nodes hold nothing.
  PlanRequest req;
  req.schedule_name = "zb-h1";
  req.shape = {1, 1, 1};
  req.inputs.model = tiny();
  req.inputs.micro_batch_size = 2;
  req.inputs.cost.kind = CostModelKind::kUniform;
  const Plan plan = make_plan(req);
  const Stage& st = plan.model.stages[0];
  int64_t kept = 0, combine = 0;
  for (const StageNode& n : st.nodes) {
    kept += n.weight_saved_bytes;
    combine += n.kind == NodeKind::kCombine ? n.saved_bytes : 0;
  }
  ASSERT_GT(combine, 0);
  ASSERT_GT(kept, 0);
  ASSERT_LT(kept, st.activation_bytes - combine);
  int64_t at_i_end = -1;
  for (const MemorySample& m : plan.sim.ranks[0].memory) {
    if (m.time <= 2.0 + kEps) at_i_end = m.activation_bytes;  // F [0,1], I [1,2], W [2,3]
  }
  EXPECT_EQ(at_i_end, kept);
  EXPECT_EQ(plan.sim.ranks[0].memory.back().activation_bytes, 0);
  EXPECT_NEAR(plan.sim.step_time_s, 3, kEps);
}

TEST(Simulator, StaticMemoryCountsParamsGradsAndAdamAndSplitsExpertsByEp) {
  const ModelConfig c = tiny();
  // layer: norms 16 + q 64 + k,v 2*32 + o 64 + router 32 + experts E/EP * 3 * 8 * 16.
  const int64_t attn = 16 + 64 + 64 + 64 + 32;
  EXPECT_EQ(stage_params(c, 0, 1, false, false, 1), attn + 4 * 384);
  EXPECT_EQ(stage_params(c, 0, 1, false, false, 4), attn + 384);
  EXPECT_EQ(stage_params(c, 0, 1, true, true, 4), attn + 384 + 32 * 8 + 8 + 8 * 32);
  const Plan plan = table_plan("1f1b", 1, 1);
  const RankMemory& m = plan.sim.ranks[0].static_memory;
  const int64_t params = stage_params(c, 0, 1, true, true, 4);
  EXPECT_EQ(m.param_bytes, 4 * params);
  EXPECT_EQ(m.grad_bytes, 4 * params);
  EXPECT_EQ(m.optimizer_bytes, 8 * params);
  const RankResult& r = plan.sim.ranks[0];
  EXPECT_EQ(r.peak_bytes, m.static_bytes() + r.activation_at_peak_bytes +
                              r.in_flight_at_peak_bytes + r.workspace_at_peak_bytes);
}

// Note [Distributed optimizer in the plan]: by hand, the tiny model on one stage with EP 4 and 8
// data-parallel ranks (2 expert-data-parallel ones): embedding 256 / 8, the layer's dense 240 / 8
// and its experts 384 / 2, the head 264 / 8 rounded up; one data-parallel rank keeps them all.
TEST(Simulator, DistributedOptimizerDividesTheMomentsByTheirGroups) {
  PlanRequest req = table_request("1f1b", 1, 1);
  req.inputs.data_parallel_size = 8;
  req.inputs.distributed_optimizer = true;
  const RankMemory m = make_plan(req).sim.ranks[0].static_memory;
  EXPECT_EQ(m.optimizer_bytes, 8 * (32 + 30 + 192 + 33));
  const int64_t params = stage_params(tiny(), 0, 1, true, true, 4);
  EXPECT_EQ(m.param_bytes, 4 * params);  // the weights and gradients stay whole
  EXPECT_EQ(m.grad_bytes, 4 * params);
  req.inputs.data_parallel_size = 4;  // one expert-data-parallel rank: the experts are whole
  EXPECT_EQ(make_plan(req).sim.ranks[0].static_memory.optimizer_bytes, 8 * (64 + 60 + 384 + 66));
}

// Note [Tensor-parallel all-reduces in the plan]: at TP 2 the attention and mlp nodes of a dense
// model take one ring all-reduce of N x H activations more in their forward and in their
// input-gradient half (2 (TP - 1) latencies and 2 (TP - 1) / TP of the bytes over the link),
// every other phase as at TP 1; times measured at TP 2 hold them already, and times measured at
// TP 2 do not plan TP 4.
TEST(Simulator, TensorParallelAllReducesTimeTheAttentionAndMlpNodes) {
  const auto nodes_at = [](int64_t tp, const std::optional<NodeTimesTable>& table) {
    PlanRequest req;
    req.schedule_name = "1f1b";
    req.shape = {1, 1, 2};
    req.inputs.model = tiny();
    req.inputs.model.num_experts = 0;
    req.inputs.model.num_layers = 1;
    req.inputs.micro_batch_size = 2;
    req.inputs.tensor_parallel_size = tp;
    req.inputs.cost.device = {1000, 1e9, 96, 1, 2};  // 96 B/s links, 1 s latency
    if (table) {
      req.inputs.cost.kind = CostModelKind::kNodeTimes;
      req.inputs.cost.table = *table;
    }
    return make_plan(req).model.stages[0].nodes;
  };
  const std::vector<StageNode> one = nodes_at(1, std::nullopt), two = nodes_at(2, std::nullopt);
  ASSERT_EQ(one.size(), two.size());
  // N H f32 elements (micro-batch 2 of 4 tokens, H 8); a ring over 2 ranks: 2 latencies and
  // the bytes' half twice.
  const double bytes = 8 * 8 * 4;
  const double ar = 2 * 1.0 + bytes / 96;
  int timed = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    const bool reduced = one[i].kind == NodeKind::kAttention || one[i].kind == NodeKind::kMlp;
    timed += reduced;
    EXPECT_DOUBLE_EQ(two[i].times.forward_s - one[i].times.forward_s, reduced ? ar : 0.0)
        << node_kind_name(one[i].kind);
    EXPECT_DOUBLE_EQ(two[i].times.backward_input_s - one[i].times.backward_input_s,
                     reduced ? ar : 0.0)
        << node_kind_name(one[i].kind);
    EXPECT_DOUBLE_EQ(two[i].times.backward_weight_s, one[i].times.backward_weight_s);
  }
  EXPECT_EQ(timed, 2);
  NodeTimesTable table = parse_node_times(
      R"({"nodes": {"embed": {"forward": 0}, "attention": {"forward": 2}, "mlp": {"forward": 3},
                    "loss": {"forward": 0}}})",
      "t");
  const auto attention = [](const std::vector<StageNode>& nodes) {
    for (const StageNode& n : nodes) {
      if (n.kind == NodeKind::kAttention) return n.times.forward_s;
    }
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(attention(nodes_at(2, table)), 2 + ar);  // measured at TP 1
  table.measured_at = MeasuredShape{};
  table.measured_at->model = tiny();
  table.measured_at->model.num_experts = 0;
  table.measured_at->model.num_layers = 1;
  table.measured_at->micro_batch_size = 2;
  table.measured_at->activation_elem_bytes = 4;
  table.measured_at->tensor_parallel_size = 2;
  EXPECT_DOUBLE_EQ(attention(nodes_at(2, table)), 2);  // the all-reduce is in the time
  try {
    nodes_at(4, table);
    ADD_FAILURE() << "times measured at TP 2 planned TP 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("measured at --tensor-model-parallel-size 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(Simulator, PlanInputErrorsNameTheOption) {
  auto error_of = [](auto mutate) {
    PlanRequest req;
    req.schedule_name = "1f1b";
    req.shape = {4, 1, 4};
    mutate(req);
    try {
      make_plan(req);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of([](PlanRequest& r) {
              r.inputs.model.num_layers = 3;
            }).find("--num-layers 3 is fewer than the schedule's 4 stages"),
            std::string::npos);
  EXPECT_NE(error_of([](PlanRequest& r) {
              r.inputs.model.num_layers = 6;
            }).find("--num-layers 6 does not divide into 4 pipeline stages"),
            std::string::npos);
  EXPECT_NE(error_of([](PlanRequest& r) {
              r.inputs.model.num_experts = 8;
              r.inputs.expert_parallel_size = 3;
            }).find("--expert-model-parallel-size 3 does not divide --num-experts 8"),
            std::string::npos);
  EXPECT_NE(error_of([](PlanRequest& r) {
              r.inputs.activation_elem_bytes = 3;
            }).find("--activation-bytes 3 is invalid"),
            std::string::npos);
  EXPECT_NE(error_of([](PlanRequest& r) {
              r.inputs.cost.kind = CostModelKind::kNodeTimes;
              r.inputs.cost.table =
                  parse_node_times(R"({"nodes": {"attention": {"forward": 1}}})", "t");
            }).find("no entry for \"embed\""),
            std::string::npos);
  EXPECT_NE(error_of([](PlanRequest& r) { r.schedule_name = "zb-v"; }).find("'zb-v' is unknown"),
            std::string::npos);
  EXPECT_EQ(error_of([](PlanRequest&) {}), "");
}

}  // namespace
}  // namespace tandem::schedule
