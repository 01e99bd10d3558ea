// Planner against pipeline theory, with uniform costs (F = 1, B = 2, I = W = 1, comm = 0).
// Oracles (research/peers_and_perf.md 6.1, 6.2; DualPipe README table):
//  - gpipe and 1f1b: bubble (p-1)/(m+p-1), step 3(m+p-1); 1f1b stage i holds min(p-i, m)
//    micro-batches of activations, gpipe holds m;
//  - interleaved-1f1b (v stages per rank, m a multiple of p): bubble (p-1)/(v m + p-1), step
//    3(v m + p - 1); rank r holds min(2(p-r-1) + (v-1)p + 1, v m) stage-micro-batches, so rank 0
//    holds p v + p - 1 = p v (1 + (p-1)/(p v)) (Korthikanti et al.);
//  - zb-h1: bubble (p-1)(F+B-2W) = p-1 per rank, i.e. (p-1)/(3m+p-1), memory as 1f1b's peak (p);
//  - dualpipev with PP = 2p stages on p ranks: bubble (PP/2-1)(F&B + B - 3W) = 2(p-1) per rank
//    (F&B = F + B under uniform costs), parameters 2x a stage, activations PP+1 (1f1b: PP);
//  - a hand-computed 1f1b timeline for p = 2, m = 2, and one combined action of
//    combined-1f1b, which starts as one unit once both of its inputs are there;
//  - measured routing (Note [Measured routing]): each micro-batch's experts hold
//    node_saved_bytes for the rows they received, the balanced table changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/footprint.h"
#include "planner/planner.h"

namespace tandem::schedule {
namespace {

constexpr double kEps = 1e-9;

PlanRequest uniform_request(std::string_view name, int32_t p, int32_t v, int32_t m,
                            int64_t layers_per_stage = 1) {
  PlanRequest req;
  req.schedule_name = std::string(name);
  req.shape = {p, v, m};
  ModelConfig& c = req.inputs.model;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 48;
  c.num_experts = 4;
  c.vocab_size = 64;
  c.seq_length = 8;
  c.num_layers = p * v * layers_per_stage;
  req.inputs.micro_batch_size = 2;
  req.inputs.cost.kind = CostModelKind::kUniform;
  return req;
}

Plan uniform_plan(std::string_view name, int32_t p, int32_t v, int32_t m) {
  return make_plan(uniform_request(name, p, v, m));
}

TEST(Theory, GpipeAndOneFOneBBubble) {
  for (const char* name : {"gpipe", "1f1b"}) {
    for (int32_t p : {1, 2, 4, 8}) {
      for (int32_t m : {1, 3, 8, 16}) {
        const Plan plan = uniform_plan(name, p, 1, m);
        const double theory = (p - 1.0) / (m + p - 1.0);
        EXPECT_NEAR(plan.sim.step_time_s, 3.0 * (m + p - 1), kEps)
            << name << " p" << p << " m" << m;
        EXPECT_NEAR(plan.sim.bubble_fraction, theory, kEps) << name << " p" << p << " m" << m;
        for (const RankResult& r : plan.sim.ranks) EXPECT_NEAR(r.bubble_fraction, theory, kEps);
      }
    }
  }
}

TEST(Theory, InterleavedBubble) {
  for (int32_t p : {2, 4}) {
    for (int32_t v : {2, 3, 4}) {
      for (int32_t m : {p, 2 * p, 4 * p}) {
        const Plan plan = uniform_plan("interleaved-1f1b", p, v, m);
        EXPECT_NEAR(plan.sim.step_time_s, 3.0 * (v * m + p - 1), kEps) << p << " " << v << " " << m;
        EXPECT_NEAR(plan.sim.bubble_fraction, (p - 1.0) / (v * m + p - 1.0), kEps);
      }
    }
  }
}

TEST(Theory, OneFOneBStageIHoldsPMinusIMicroBatchesAndGpipeHoldsM) {
  for (int32_t p : {2, 4, 6}) {
    for (int32_t m : {2, 4, 9}) {
      const Plan f1b = uniform_plan("1f1b", p, 1, m);
      const Plan gp = uniform_plan("gpipe", p, 1, m);
      for (int32_t i = 0; i < p; ++i) {
        const int64_t stage_bytes = f1b.model.stages[i].activation_bytes;
        const int32_t held = std::min(p - i, m);
        EXPECT_EQ(f1b.sim.ranks[i].peak_live_microbatches, held)
            << "p" << p << " m" << m << " i" << i;
        EXPECT_EQ(f1b.sim.ranks[i].activation_peak_bytes, held * stage_bytes);
        EXPECT_EQ(gp.sim.ranks[i].peak_live_microbatches, m);
        EXPECT_EQ(gp.sim.ranks[i].activation_peak_bytes, m * stage_bytes);
      }
    }
  }
}

TEST(Theory, InterleavedMemoryIsOnePlusPMinusOneOverPVTimesOneFOneB) {
  for (int32_t p : {2, 4}) {
    for (int32_t v : {2, 3}) {
      for (int32_t m : {p, 4 * p}) {
        const Plan plan = uniform_plan("interleaved-1f1b", p, v, m);
        for (int32_t r = 0; r < p; ++r) {
          const int32_t expected = std::min(2 * (p - r - 1) + (v - 1) * p + 1, v * m);
          EXPECT_EQ(plan.sim.ranks[r].peak_live_microbatches, expected) << p << v << m << r;
        }
        if (m >= 2 * p) {
          EXPECT_EQ(plan.sim.ranks[0].peak_live_microbatches, p * v + p - 1);
        }
      }
    }
  }
}

TEST(Theory, ZeroBubbleH1HasAThirdOfTheBubbleAtOneFOneBMemory) {
  for (int32_t p : {2, 4, 8}) {
    for (int32_t m : {p, 2 * p, 3 * p + 1}) {
      const Plan zb = uniform_plan("zb-h1", p, 1, m);
      const Plan f1b = uniform_plan("1f1b", p, 1, m);
      EXPECT_NEAR(zb.sim.step_time_s, 3.0 * m + (p - 1), kEps) << p << " " << m;
      EXPECT_NEAR(zb.sim.bubble_fraction, (p - 1.0) / (3.0 * m + p - 1), kEps);
      int32_t zb_peak = 0;
      for (const RankResult& r : zb.sim.ranks) {
        EXPECT_NEAR(zb.sim.step_time_s - r.compute_busy_s, p - 1.0, kEps);  // (p-1)(F+B-2W)
        zb_peak = std::max(zb_peak, r.peak_live_microbatches);
      }
      EXPECT_EQ(zb_peak, f1b.sim.ranks[0].peak_live_microbatches);
    }
  }
}

TEST(Theory, DualPipeVAgainstTheDualPipeReadmeTable) {
  for (int32_t p : {2, 3, 4, 8}) {
    for (int32_t m : {2 * p, 3 * p + 1, 20}) {
      const Plan dv = uniform_plan("dualpipev", p, 2, m);
      const int32_t pp = 2 * p;  // stages
      // Bubble: (PP/2 - 1)(F&B + B - 3W) with F&B = 3, B = 2, W = 1.
      for (const RankResult& r : dv.sim.ranks) {
        EXPECT_NEAR(dv.sim.step_time_s - r.compute_busy_s, (pp / 2 - 1) * (3.0 + 2.0 - 3.0), kEps)
            << "p" << p << " m" << m << " rank " << r.rank;
      }
      // Activation: PP + 1 stage-micro-batches on the busiest rank, PP on 1f1b's first rank.
      int32_t peak = 0;
      for (const RankResult& r : dv.sim.ranks) peak = std::max(peak, r.peak_live_microbatches);
      EXPECT_EQ(peak, pp + 1) << "p" << p << " m" << m;
      if (m >= pp) {
        EXPECT_EQ(uniform_plan("1f1b", pp, 1, m).sim.ranks[0].peak_live_microbatches, pp);
      }
      // Parameters: 2x one stage (ranks other than 0, which also hold the embedding and head).
      const ModelConfig& cfg = dv.inputs.model;
      for (int32_t r = 1; r < p; ++r) {
        EXPECT_EQ(dv.sim.ranks[r].static_memory.param_bytes,
                  2 * 4 * stage_params(cfg, 0, 1, false, false, 1));
      }
    }
  }
}

TEST(Theory, CombinedOneFOneB) {
  // PP = 1: F0, (F1;B0), ..., B(m-1): no bubble, every micro-batch's work once.
  const Plan one = uniform_plan("combined-1f1b", 1, 1, 6);
  EXPECT_NEAR(one.sim.step_time_s, 18.0, kEps);
  EXPECT_NEAR(one.sim.bubble_fraction, 0.0, kEps);
  // Whole micro-batches: the pair's backward finishes as its forward does (one held at a time);
  // node by node the forward's first layers are saved before the backward's last are freed.
  EXPECT_EQ(one.sim.ranks[0].peak_live_microbatches, 1);
  const int64_t mb_bytes = one.model.stages[0].activation_bytes;
  EXPECT_GT(one.sim.ranks[0].activation_peak_bytes, mb_bytes);
  EXPECT_LT(one.sim.ranks[0].activation_peak_bytes, 2 * mb_bytes);
  // Plain PP: 1f1b's bubble with 2(p-r)-1 micro-batches on rank r (warm-up 2(p-r-1)+1, so the
  // paired halves never wait on each other); virtual stages: interleaved's bubble.
  for (int32_t p : {2, 4}) {
    for (int32_t m : {2 * p, 4 * p}) {
      const Plan c = uniform_plan("combined-1f1b", p, 1, m);
      EXPECT_NEAR(c.sim.bubble_fraction, (p - 1.0) / (m + p - 1.0), kEps) << p << " " << m;
      for (int32_t r = 0; r < p; ++r) {
        EXPECT_EQ(c.sim.ranks[r].peak_live_microbatches, std::min(2 * (p - r) - 1, m));
      }
      const Plan cv = uniform_plan("combined-1f1b", p, 2, m);
      EXPECT_NEAR(cv.sim.bubble_fraction, (p - 1.0) / (2 * m + p - 1.0), kEps) << p << " " << m;
    }
  }
}

// Action-level extents on the compute stream: text -> [start, end].
std::map<std::string, std::pair<double, double>> extents(const Plan& plan, int32_t rank) {
  std::map<std::string, std::pair<double, double>> out;
  for (const Span& s : plan.sim.ranks[rank].spans) {
    if (s.stream != Stream::kCompute) continue;
    const std::string key = to_string(plan.schedule.ranks[rank][s.action]);
    auto [it, fresh] = out.try_emplace(key, s.start, s.end);
    if (!fresh)
      it->second = {std::min(it->second.first, s.start), std::max(it->second.second, s.end)};
  }
  return out;
}

TEST(Theory, HandComputedOneFOneBTimeline) {
  // p = 2, m = 2. Rank 1 (last): F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7].
  // Rank 0: F0 [0,1] F1 [1,2], waits for B0's gradient (4), B0 [4,6], B1 needs rank 1's B1 (7).
  const Plan plan = uniform_plan("1f1b", 2, 1, 2);
  using E = std::map<std::string, std::pair<double, double>>;
  const E r0 = {{"0F0", {0, 1}}, {"0F1", {1, 2}}, {"0B0", {4, 6}}, {"0B1", {7, 9}}};
  const E r1 = {{"1F0", {1, 2}}, {"1B0", {2, 4}}, {"1F1", {4, 5}}, {"1B1", {5, 7}}};
  const auto got0 = extents(plan, 0), got1 = extents(plan, 1);
  for (const auto& [key, want] : r0) {
    EXPECT_NEAR(got0.at(key).first, want.first, kEps) << key;
    EXPECT_NEAR(got0.at(key).second, want.second, kEps) << key;
  }
  for (const auto& [key, want] : r1) {
    EXPECT_NEAR(got1.at(key).first, want.first, kEps) << key;
    EXPECT_NEAR(got1.at(key).second, want.second, kEps) << key;
  }
  EXPECT_NEAR(plan.sim.step_time_s, 9.0, kEps);
}

TEST(Theory, ActivationBytesAreFootprintNodeSavedBytes) {
  // Oracle: core/footprint.h itself, summed over the nodes each stage holds.
  // The activations alone: without the nodes' op temporaries
  // (Note [Node workspace] in core/footprint.h) and the tokens
  // (Note [Tokens in the plan] in planner/simulator_state.cc) the whole peak is where every
  // forward is done.
  Plan plan = make_plan(uniform_request("gpipe", 2, 1, 3, 2));
  for (Stage& st : plan.model.stages) {
    st.tokens_loaded_bytes = st.tokens_held_bytes = 0;
    for (StageNode& n : st.nodes) n.workspace = {};
  }
  plan.sim = simulate(plan.schedule, plan.model);
  const ModelConfig& cfg = plan.inputs.model;
  FootprintShape s;
  s.tokens = 2 * cfg.seq_length;
  s.expert_rows = s.tokens * cfg.moe_router_topk;
  s.local_experts = cfg.num_experts;
  s.elem_bytes = 4;
  const int64_t layer = node_saved_bytes(NodeKind::kAttention, cfg, s) +
                        node_saved_bytes(NodeKind::kDispatch, cfg, s) +
                        node_saved_bytes(NodeKind::kExperts, cfg, s) +
                        node_saved_bytes(NodeKind::kCombine, cfg, s);
  const int64_t stage0 = node_saved_bytes(NodeKind::kEmbed, cfg, s) + 2 * layer;
  const int64_t stage1 = 2 * layer + node_saved_bytes(NodeKind::kLoss, cfg, s);
  EXPECT_EQ(plan.sim.ranks[0].activation_peak_bytes, 3 * stage0);
  EXPECT_EQ(plan.sim.ranks[1].activation_peak_bytes, 3 * stage1);
  // At the peak (all forwards done) every micro-batch's nodes are held, per node kind.
  const auto& by_node = plan.sim.ranks[1].activation_at_peak_by_node;
  EXPECT_EQ(by_node[static_cast<int>(NodeKind::kAttention)],
            3 * 2 * node_saved_bytes(NodeKind::kAttention, cfg, s));
  EXPECT_EQ(by_node[static_cast<int>(NodeKind::kLoss)],
            3 * node_saved_bytes(NodeKind::kLoss, cfg, s));
  EXPECT_EQ(by_node[static_cast<int>(NodeKind::kEmbed)], 0);
  for (const RankResult& r : plan.sim.ranks) EXPECT_EQ(r.memory.back().activation_bytes, 0);
}

TEST(Theory, CombinedActionStartsOnceBothInputsAreThere) {
  // p = 2, m = 4. Rank 0: F0 [0,1] F1 [1,2] F2 [2,3]; rank 1: F0 [1,2], (F1;B0) [2,5], so rank 0's
  // (F3;B0) has B0's gradient at 5 and runs [5,8] as one unit: its forward half does not start
  // at 3 (the runtime receives both inputs before it runs the pair).
  const Plan plan = uniform_plan("combined-1f1b", 2, 1, 4);
  const auto got0 = extents(plan, 0), got1 = extents(plan, 1);
  EXPECT_NEAR(got1.at("(1F1;1B0)").first, 2, kEps);
  EXPECT_NEAR(got1.at("(1F1;1B0)").second, 5, kEps);
  EXPECT_NEAR(got0.at("0F2").second, 3, kEps);
  EXPECT_NEAR(got0.at("(0F3;0B0)").first, 5, kEps);
  EXPECT_NEAR(got0.at("(0F3;0B0)").second, 8, kEps);
}

FootprintShape ep2_shape(const ModelConfig& cfg, int64_t rows) {
  FootprintShape s;
  s.tokens = 2 * cfg.seq_length;
  s.expert_rows = rows;
  s.local_experts = cfg.num_experts / 2;
  s.ep_size = 2;
  s.elem_bytes = 4;
  return s;
}

TEST(Theory, MeasuredRoutingSetsEachMicroBatchsExpertBytes) {
  // gpipe, 2 ranks x 2 layers, 3 micro-batches, EP 2: at the peak every micro-batch is held, so
  // each rank's peak is the balanced one plus, per (micro-batch, layer) of its stage, the experts'
  // bytes for the measured rows minus those for N k rows (oracle: core/footprint.h).
  PlanRequest req = uniform_request("gpipe", 2, 1, 3, 2);
  req.inputs.expert_parallel_size = 2;
  const ModelConfig& cfg = req.inputs.model;
  const int64_t nk = 2 * cfg.seq_length * cfg.moe_router_topk;
  const Plan balanced = make_plan(req);
  RoutingCounts even(3, 4);
  std::fill(even.expert_rows.begin(), even.expert_rows.end(), nk);
  req.inputs.routing = even;
  const Plan same = make_plan(req);
  for (int32_t r = 0; r < 2; ++r) {
    ASSERT_EQ(same.sim.ranks[r].memory.size(), balanced.sim.ranks[r].memory.size());
    for (size_t i = 0; i < same.sim.ranks[r].memory.size(); ++i) {
      EXPECT_EQ(same.sim.ranks[r].memory[i].activation_bytes,
                balanced.sim.ranks[r].memory[i].activation_bytes);
    }
  }
  RoutingCounts measured(3, 4);
  int64_t extra[2] = {0, 0};
  const int64_t at_nk = node_saved_bytes(NodeKind::kExperts, cfg, ep2_shape(cfg, nk));
  for (int32_t mb = 0; mb < 3; ++mb) {
    for (int32_t l = 0; l < 4; ++l) {
      measured.at(mb, l) = (5 * mb + 7 * l) % (2 * nk + 1);  // 0 .. 2 N k: all to one rank
      const FootprintShape shape = ep2_shape(cfg, measured.at(mb, l));
      extra[l / 2] += node_saved_bytes(NodeKind::kExperts, cfg, shape) - at_nk;
    }
  }
  req.inputs.routing = measured;
  const Plan plan = make_plan(req);
  for (int32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(plan.sim.ranks[r].activation_peak_bytes,
              balanced.sim.ranks[r].activation_peak_bytes + extra[r])
        << r;
    EXPECT_EQ(plan.sim.ranks[r].memory.back().activation_bytes, 0);
  }
  EXPECT_NE(extra[0], 0);
  EXPECT_NE(extra[1], 0);
}

TEST(Theory, MeasuredRoutingMustCoverThePlan) {
  PlanRequest req = uniform_request("1f1b", 2, 1, 3);
  req.inputs.expert_parallel_size = 2;
  const int64_t nk = 2 * req.inputs.model.seq_length * req.inputs.model.moe_router_topk;
  auto plan_with = [&](RoutingCounts counts) {
    PlanRequest r = req;
    r.inputs.routing = std::move(counts);
    return make_plan(r);
  };
  RoutingCounts full(3, 2);
  std::fill(full.expert_rows.begin(), full.expert_rows.end(), nk);
  EXPECT_NO_THROW(plan_with(full));
  EXPECT_THROW(plan_with(RoutingCounts(2, 2)), Error);  // the plan has 3 micro-batches
  RoutingCounts missing = full;
  missing.at(1, 1) = -1;
  EXPECT_THROW(plan_with(missing), Error);
  RoutingCounts too_many = full;
  too_many.at(0, 0) = 2 * nk + 1;  // more than every rank's routed rows
  EXPECT_THROW(plan_with(too_many), Error);
  req.inputs.model.num_experts = 0;
  req.inputs.expert_parallel_size = 1;
  EXPECT_THROW(plan_with(full), Error);  // a dense model has no experts
}

}  // namespace
}  // namespace tandem::schedule
