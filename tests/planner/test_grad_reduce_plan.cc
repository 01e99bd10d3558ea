// The gradient all-reduce in the plan (Note [Gradient reduction in the plan] in
// src/planner/simulator.cc). Oracles: the units against the stage's weights counted from the
// model (stage_params, the experts' 3 H F each); the ring's time worked out by hand; each
// reduction's start recomputed from the plan's own weight-gradient spans (the end of the unit's
// last one over every micro-batch, or the stream's previous reduction); the forward-backward
// spans of the same plan with one rank a stage, which the reduction must not move.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "core/error.h"
#include "planner/planner.h"
#include "planner/simulator.h"

namespace tandem::schedule {
namespace {

constexpr double kEps = 1e-12;

// 4 layers of 4 experts (top 2), small enough to plan every schedule quickly.
PlanRequest request(const char* schedule, int32_t pp, int32_t v, int64_t ep, int64_t dp,
                    bool overlap) {
  PlanRequest req;
  req.schedule_name = schedule;
  req.shape = {pp, v, 4};
  req.inputs.model = {.vocab_size = 512,
                      .hidden_size = 64,
                      .num_layers = 4,
                      .num_attention_heads = 4,
                      .num_query_groups = 2,
                      .ffn_hidden_size = 128,
                      .num_experts = 4,
                      .moe_router_topk = 2,
                      .seq_length = 32,
                      .untie_embeddings_and_output_weights = true};
  req.inputs.micro_batch_size = 2;
  req.inputs.expert_parallel_size = ep;
  req.inputs.data_parallel_size = dp;
  req.inputs.overlap_grad_reduce = overlap;
  return req;
}

// A unit's key: stage, layer, and 0 a layer, 1 the embedding, 2 the head.
using UnitKey = std::tuple<int32_t, int32_t, int>;
UnitKey unit_key(const Span& s) {
  if (s.node == NodeKind::kEmbed) return {s.stage, -1, 1};
  if (s.node == NodeKind::kLoss) return {s.stage, -1, 2};
  return {s.stage, s.layer, 0};
}

std::vector<Span> of_kind(const RankResult& r, bool reduce) {
  std::vector<Span> out;
  for (const Span& s : r.spans) {
    if ((s.kind == SpanKind::kReduce) == reduce) out.push_back(s);
  }
  return out;
}

TEST(GradReducePlan, UnitsHoldTheStagesWeights) {
  const ModelConfig cfg = request("1f1b", 2, 1, 2, 4, true).inputs.model;
  const int64_t experts = cfg.num_experts / 2 * 3 * cfg.hidden_size * cfg.ffn_hidden_size;
  // DP 4, EP 2: experts over 2 ranks too. DP 2, EP 2: the experts' part is not reduced.
  for (const int64_t dp : {4, 2}) {
    const Plan plan = make_plan(request("1f1b", 2, 1, 2, dp, true));
    EXPECT_EQ(plan.model.data_parallel_size, dp);
    for (const Stage& st : plan.model.stages) {
      ASSERT_EQ(st.node_unit.size(), st.nodes.size());
      // Embedding (stage 0), one unit a layer, head (last stage).
      ASSERT_EQ(st.grad_units.size(), 3u);
      int64_t bytes = 0;
      for (size_t k = 0; k < st.grad_units.size(); ++k) {
        const GradUnit& u = st.grad_units[k];
        bytes += u.bytes;
        int32_t weighted = 0;
        for (size_t n = 0; n < st.nodes.size(); ++n) {
          if (st.node_unit[n] != static_cast<int32_t>(k)) continue;
          EXPECT_EQ(st.nodes[n].layer >= 0 && st.nodes[n].kind != NodeKind::kLoss
                        ? st.nodes[n].layer
                        : -1,
                    u.layer);
          weighted += node_has_weights(st.nodes[n].kind) ? 1 : 0;
        }
        EXPECT_EQ(u.weighted_nodes, weighted);
        EXPECT_EQ(u.weighted_nodes, u.layer >= 0 ? 2 : 1);  // attention and experts; or one
      }
      const int64_t layers_experts = st.num_layers * experts;
      EXPECT_EQ(bytes, 4 * (dp == 4 ? st.num_params : st.num_params - layers_experts))
          << "stage " << st.index << " DP " << dp;
    }
  }
}

TEST(GradReducePlan, RingTime) {
  CostModel c;
  c.device.link_bytes_per_s = 1e9;
  c.device.link_latency_s = 1e-6;
  EXPECT_EQ(all_reduce_time(c, 1000, 1), 0);
  EXPECT_NEAR(all_reduce_time(c, 1000, 2), 2e-6 + 1e-6, kEps);  // 2 steps, the bytes once
  EXPECT_NEAR(all_reduce_time(c, 1000, 4), 6e-6 + 1.5e-6, kEps);
  c.kind = CostModelKind::kNodeTimes;  // no measured rate: the link's
  EXPECT_NEAR(all_reduce_time(c, 1000, 2), 3e-6, kEps);
  c.table.grad_reduce_bus_bytes_per_s = 0.5e9;
  EXPECT_NEAR(all_reduce_time(c, 1000, 2), 4e-6, kEps);
  c.kind = CostModelKind::kUniform;
  EXPECT_EQ(all_reduce_time(c, 1000, 2), 0);
  // The table's key, and a clear error for a bad value.
  EXPECT_EQ(parse_node_times(R"({"nodes": {}, "grad_reduce_bus_bytes_per_s": 2e11})", "t")
                .grad_reduce_bus_bytes_per_s,
            2e11);
  try {
    parse_node_times(R"({"nodes": {}, "grad_reduce_bus_bytes_per_s": 0})", "t.json");
    ADD_FAILURE() << "a bandwidth of 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: grad_reduce_bus_bytes_per_s: expected"),
              std::string::npos)
        << e.what();
  }
}

TEST(GradReducePlan, NoneWithOneRankAStage) {
  const Plan plan = make_plan(request("1f1b", 2, 1, 1, 0, true));
  EXPECT_EQ(plan.model.data_parallel_size, 1);
  for (const RankResult& r : plan.sim.ranks) {
    EXPECT_TRUE(of_kind(r, true).empty());
    EXPECT_EQ(r.grad_reduce_s, 0);
    EXPECT_EQ(r.grad_reduce_tail_s, 0);
  }
  EXPECT_EQ(plan.sim.step_with_reduce_s, plan.sim.step_time_s);
  // Note [The embedding group] (runtime/grad_reduce.cc): tied, the two ends still sum the
  // table's gradient.
  PlanRequest tied = request("1f1b", 2, 1, 1, 0, true);
  tied.inputs.model.untie_embeddings_and_output_weights = false;
  for (const RankResult& r : make_plan(tied).sim.ranks) EXPECT_GT(r.grad_reduce_s, 0);
  try {
    make_plan(request("1f1b", 2, 1, 2, 3, true));
    ADD_FAILURE() << "DP 3 with EP 2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--data-parallel-size 3 is invalid"), std::string::npos)
        << e.what();
  }
}

struct Case {
  const char* schedule;
  int32_t pp, v;
  int64_t ep;
};

// The ranks' compute and comm spans of `a` and `b` are the same.
void expect_same_work(const Plan& a, const Plan& b) {
  ASSERT_EQ(a.sim.ranks.size(), b.sim.ranks.size());
  for (size_t r = 0; r < a.sim.ranks.size(); ++r) {
    const std::vector<Span> x = of_kind(a.sim.ranks[r], false), y = of_kind(b.sim.ranks[r], false);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].start, y[i].start);
      EXPECT_EQ(x[i].end, y[i].end);
    }
    EXPECT_EQ(a.sim.ranks[r].end_s, b.sim.ranks[r].end_s);
    EXPECT_EQ(a.sim.ranks[r].peak_bytes, b.sim.ranks[r].peak_bytes);
  }
}

TEST(GradReducePlan, EachUnitAfterItsLastWeightGradientOrAllAtTheEnd) {
  for (const Case& c : {Case{"1f1b", 2, 1, 2}, Case{"interleaved-1f1b", 2, 2, 1},
                        Case{"zb-h1", 2, 1, 1}, Case{"combined-1f1b", 1, 1, 2},
                        Case{"combined-1f1b", 2, 1, 2}, Case{"dualpipev", 2, 2, 1}}) {
    SCOPED_TRACE(std::string(c.schedule) + " PP " + std::to_string(c.pp));
    const int64_t dp = 2 * c.ep;  // every unit reduced, the experts over 2 ranks
    const Plan one = make_plan(request(c.schedule, c.pp, c.v, c.ep, c.ep == 1 ? 1 : c.ep, true));
    const Plan beside = make_plan(request(c.schedule, c.pp, c.v, c.ep, dp, true));
    const Plan at_end = make_plan(request(c.schedule, c.pp, c.v, c.ep, dp, false));
    if (c.ep == 1) expect_same_work(one, beside);
    expect_same_work(beside, at_end);
    for (size_t r = 0; r < beside.sim.ranks.size(); ++r) {
      const RankResult& rb = beside.sim.ranks[r];
      const RankResult& re = at_end.sim.ranks[r];
      // Per (stage, unit): its reduction time, and the end of its last weight gradient.
      std::map<UnitKey, double> last_w, reduce_s;
      size_t units = 0;
      for (const int32_t s : rb.stages) {
        const Stage& st = beside.model.stages[static_cast<size_t>(s)];
        units += st.grad_units.size();
        for (size_t k = 0; k < st.grad_units.size(); ++k) {
          const GradUnit& u = st.grad_units[k];
          EXPECT_GT(u.reduce_s, 0);
          const int tag = u.layer >= 0 ? 0 : k == 0 && st.has_embed() ? 1 : 2;
          reduce_s[{s, u.layer, tag}] = u.reduce_s;
        }
      }
      for (const Span& sp : of_kind(rb, false)) {
        if (sp.kind != SpanKind::kNode || sp.phase != Phase::kBackwardWeight) continue;
        double& t = last_w[unit_key(sp)];
        t = std::max(t, sp.end);
      }
      const std::vector<Span> red = of_kind(rb, true);
      ASSERT_EQ(red.size(), units);
      double prev = 0, busy = 0;
      for (const Span& sp : red) {
        const double ready = last_w.at(unit_key(sp));
        EXPECT_NEAR(sp.start, std::max(prev, ready), kEps)
            << "stage " << sp.stage << " layer " << sp.layer;
        EXPECT_NEAR(sp.end - sp.start, reduce_s.at(unit_key(sp)), kEps);
        prev = sp.end;
        busy += sp.end - sp.start;
      }
      EXPECT_NEAR(rb.grad_reduce_s, busy, 1e-9);
      EXPECT_NEAR(rb.grad_reduce_end_s, prev, kEps);
      EXPECT_NEAR(rb.grad_reduce_tail_s, std::max(0.0, prev - rb.end_s), kEps);
      // At the end: one after another from the rank's end of forward and backward.
      const std::vector<Span> end_red = of_kind(re, true);
      ASSERT_EQ(end_red.size(), units);
      EXPECT_NEAR(end_red.front().start, re.end_s, kEps);
      for (size_t i = 1; i < end_red.size(); ++i) {
        EXPECT_NEAR(end_red[i].start, end_red[i - 1].end, kEps);
      }
      EXPECT_NEAR(re.grad_reduce_tail_s, busy, 1e-9);
      EXPECT_LT(rb.grad_reduce_tail_s, re.grad_reduce_tail_s);
    }
    EXPECT_LT(beside.sim.step_with_reduce_s, at_end.sim.step_with_reduce_s);
    EXPECT_EQ(beside.sim.step_time_s, at_end.sim.step_time_s);
  }
}

// Note [The step's end in the plan]: after the forward-backward and the all-reduce, the norm reads
// every f32 gradient (4 bytes a weight) and the update (30 bytes on the GPU, or the measured
// rate) writes them; a deferred update is in the forward already; uniform costs have no end.
TEST(GradReducePlan, TheStepsEnd) {
  for (const bool deferred : {false, true}) {
    PlanRequest req = request("1f1b", 2, 1, 2, 4, true);
    req.inputs.gpu = true;
    req.inputs.defer_optimizer = deferred;
    req.inputs.cost.device.memory_bytes_per_s = 1e12;
    const Plan plan = make_plan(req);
    const double per_weight = (4.0 + (deferred ? 0.0 : 30.0)) / 1e12;
    double full = 0;
    for (const RankResult& r : plan.sim.ranks) {
      int64_t params = 0;
      for (const int32_t s : r.stages) {
        params += plan.model.stages[static_cast<size_t>(s)].num_params;
      }
      EXPECT_NEAR(r.step_end_work_s, static_cast<double>(params) * per_weight, kEps);
      EXPECT_NEAR(r.full_step_end_s, std::max(r.end_s, r.grad_reduce_end_s) + r.step_end_work_s,
                  kEps);
      full = std::max(full, r.full_step_end_s);
    }
    EXPECT_EQ(plan.sim.full_step_s, full);
    EXPECT_GT(plan.sim.full_step_s, plan.sim.step_with_reduce_s);
    // A measured rate replaces the update's estimate.
    req.inputs.cost.kind = CostModelKind::kNodeTimes;
    req.inputs.cost.table = parse_node_times(
        R"({"nodes": {"embed": {"forward": 1e-5}, "attention": {"forward": 1e-4},
            "dispatch": {"forward": 1e-5}, "experts": {"forward": 1e-4},
            "combine": {"forward": 1e-5}, "loss": {"forward": 1e-4}},
            "update_per_weight": 1e-10})",
        "t");
    const Plan measured = make_plan(req);
    const int64_t params0 = measured.model.stages[0].num_params;
    EXPECT_NEAR(measured.sim.ranks[0].step_end_work_s,
                static_cast<double>(params0) * (4.0 / 1e12 + (deferred ? 0.0 : 1e-10)), kEps);
    // A measured step's end (--node-times-out) replaces both, for a run that made the same
    // choice about deferring; for the other choice the estimate stays.
    req.inputs.cost.table.step_end_s_per_weight = 3e-10;
    for (const bool table_deferred : {false, true}) {
      req.inputs.cost.table.defer_optimizer = table_deferred;
      const Plan p = make_plan(req);
      const double rate =
          table_deferred == deferred ? 3e-10 : 4.0 / 1e12 + (deferred ? 0.0 : 1e-10);
      EXPECT_NEAR(p.sim.ranks[0].step_end_work_s, static_cast<double>(params0) * rate, kEps);
    }
  }
  const NodeTimesTable t = parse_node_times(
      R"({"nodes": {}, "step_end_per_weight": 5e-12, "defer_optimizer": true})", "t");
  EXPECT_EQ(t.step_end_s_per_weight, 5e-12);
  EXPECT_TRUE(t.defer_optimizer);
  for (const char* bad :
       {R"({"nodes": {}, "step_end_per_weight": "x"})", R"({"nodes": {}, "defer_optimizer": 1})"}) {
    try {
      parse_node_times(bad, "t.json");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("t.json: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
    }
  }
  PlanRequest uniform = request("1f1b", 2, 1, 2, 4, true);
  uniform.inputs.cost.kind = CostModelKind::kUniform;
  const Plan u = make_plan(uniform);
  EXPECT_EQ(u.sim.full_step_s, u.sim.step_with_reduce_s);
}

}  // namespace
}  // namespace tandem::schedule
