// Node workspace in the simulator (Note [Node workspace] in core/footprint.h). Oracles: the same
// schedule simulated with every node's workspace zeroed (activation and in-flight peaks must not
// move, the peak may rise by at most the workspace peak), the loss's bf16 logits block worked
// out by hand, every phase's temporaries held at least once, the allocator peaks measured on 2
// H200s for one shape, and on one H200 for merged expert weight gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "model/tiny.h"
#include "planner/planner.h"
#include "planner/simulator.h"

namespace tandem::schedule {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The measured shape: 8 layers, hidden 1024, 16 heads, 8 KV groups, 8 experts top-2, ffn 2816,
// vocab 32000, seq 2048, micro-batch 2, PP 2, 8 micro-batches, roofline costs.
PlanRequest measured_request(const char* schedule, bool gpu) {
  PlanRequest req;
  req.schedule_name = schedule;
  req.shape = {2, 1, 8};
  req.inputs.model = {.vocab_size = 32000,
                      .hidden_size = 1024,
                      .num_layers = 8,
                      .num_attention_heads = 16,
                      .num_query_groups = 8,
                      .ffn_hidden_size = 2816,
                      .num_experts = 8,
                      .moe_router_topk = 2,
                      .seq_length = 2048};
  req.inputs.micro_batch_size = 2;
  req.inputs.gpu = gpu;
  req.inputs.activation_elem_bytes = gpu ? 2 : 4;
  return req;
}

struct WithAndWithout {
  PipelineModel model;
  SimResult with, without;
};

WithAndWithout simulate_both(const PlanRequest& req) {
  const Schedule s = plan_schedule(req);
  WithAndWithout out;
  out.model = build_pipeline_model(s, req.inputs);
  out.with = simulate(s, out.model);
  PipelineModel zeroed = out.model;
  for (Stage& st : zeroed.stages) {
    for (StageNode& n : st.nodes) n.workspace = {};
  }
  out.without = simulate(s, zeroed);
  return out;
}

TEST(Workspace, CpuPlansCountTheCpuNodesTemporaries) {
  // The CPU's loss node keeps its f32 logits as saved bytes, so its forward has no temporaries;
  // its backward holds d_nf and d_x [N,H] f32 at once. The rest add to the peak and leave the
  // activation and in-flight peaks where they were (tests/runtime/test_cpu_memory.cc holds
  // the whole peak to the allocator's).
  const int64_t n = 2 * 2048, h = 1024;
  for (const char* name : {"1f1b", "zb-h1", "combined-1f1b"}) {
    SCOPED_TRACE(name);
    const WithAndWithout b = simulate_both(measured_request(name, false));
    const StageNode& loss = b.model.stages.back().nodes.back();
    ASSERT_EQ(loss.kind, NodeKind::kLoss);
    EXPECT_EQ(loss.workspace.forward, 0);
    EXPECT_EQ(loss.workspace.backward_input, 2 * n * h * 4);
    for (size_t r = 0; r < b.with.ranks.size(); ++r) {
      const RankResult& w = b.with.ranks[r];
      const RankResult& wo = b.without.ranks[r];
      EXPECT_EQ(w.activation_peak_bytes, wo.activation_peak_bytes);
      EXPECT_EQ(w.in_flight_peak_bytes, wo.in_flight_peak_bytes);
      EXPECT_GT(w.peak_bytes, wo.peak_bytes);
      EXPECT_LE(w.peak_bytes, wo.peak_bytes + w.workspace_peak_bytes);
      EXPECT_EQ(w.memory.back().workspace_bytes, 0);
    }
  }
}

TEST(Workspace, GpuPeakAddsTemporariesAndLeavesActivationsExact) {
  for (const char* name : {"1f1b", "zb-h1", "combined-1f1b"}) {
    SCOPED_TRACE(name);
    const WithAndWithout b = simulate_both(measured_request(name, true));
    for (size_t r = 0; r < b.with.ranks.size(); ++r) {
      const RankResult& w = b.with.ranks[r];
      const RankResult& wo = b.without.ranks[r];
      EXPECT_EQ(w.activation_peak_bytes, wo.activation_peak_bytes);
      EXPECT_EQ(w.in_flight_peak_bytes, wo.in_flight_peak_bytes);
      EXPECT_EQ(wo.workspace_peak_bytes, 0);
      EXPECT_GT(w.peak_bytes, wo.peak_bytes);
      EXPECT_LE(w.peak_bytes, wo.peak_bytes + w.workspace_peak_bytes);
      EXPECT_EQ(w.memory.back().workspace_bytes, 0);  // every phase gave its temporaries back
      // Every phase runs, so the workspace peak is at least each one's (the experts are never
      // their stage's first backward node, so nothing is counted in flight instead).
      for (int32_t st : w.stages) {
        for (const StageNode& n : b.model.stages[st].nodes) {
          if (n.kind == NodeKind::kExperts || n.kind == NodeKind::kLoss) {
            EXPECT_GE(w.workspace_peak_bytes, n.workspace.forward);
            EXPECT_GE(w.workspace_peak_bytes, n.workspace.backward_input);
            EXPECT_GE(w.workspace_peak_bytes, n.workspace.backward_weight);
          }
        }
      }
    }
  }
}

TEST(Workspace, LastRankOf1f1bPeaksInTheLossForward) {
  // 1f1b's last rank holds one micro-batch, all of it at the end of the loss forward (its peak
  // without workspace), when the loss's bf16 logits block is live too: 4096 rows of V = 32000 go
  // in one block (1.25 GiB budget: 20971 rows, at most 8192).
  const WithAndWithout b = simulate_both(measured_request("1f1b", true));
  const int64_t block = int64_t{4096} * 32000 * 2;
  EXPECT_GE(b.with.ranks[1].peak_bytes - b.without.ranks[1].peak_bytes, block);
  EXPECT_GE(b.with.ranks[1].workspace_peak_bytes, block);
}

TEST(Workspace, MeasuredPeaksWithinTwoPercent) {
  // Allocator peaks of the GPU trainer, 1f1b PP 2, measured on 2 H200s: 7.34 and 6.59 GiB (with
  // f32 logits blocks of 2048 rows; the bf16 block of 4096 rows has the same 250 MiB).
  const Plan plan = make_plan(measured_request("1f1b", true));
  const double measured[2] = {7.34, 6.59};
  for (int r = 0; r < 2; ++r) {
    const double planned = static_cast<double>(plan.sim.ranks[r].peak_bytes) / kGiB;
    EXPECT_LT(std::abs(planned - measured[r]) / measured[r], 0.02)
        << "rank " << r << " planned " << planned << " GiB";
  }
}

TEST(Workspace, MergedExpertGradientPeaksAsMeasured) {
  // The allocator's peaks of test_cuda_memory's reference trainer (3 micro-batches, 1f1b; its
  // models in model/tiny.h) on one H200, with the experts' weight gradients merged by 1, 2 and 3
  // (Note [Merged expert weight gradients] in model/nodes.h). Merged, the peak is the group's
  // last pass: the I's gate_up gone, what it passed on (d_out, d_topk_w, d_expert_in) still
  // held beside the gathered rows.
  struct Case {
    bool deepseek_v3;
    int64_t micro_batch;
    std::array<int64_t, 3> peak;  // merge 1, 2, 3
  };
  const Case cases[] = {{false, 1, {19322976, 20174976, 20961440}},
                        {false, 2, {20331360, 22035328, 23608224}},
                        {true, 1, {17450232, 17589512, 17773864}},
                        {true, 2, {19022328, 19300872, 19669544}}};
  for (const Case& c : cases) {
    for (int32_t merge = 1; merge <= 3; ++merge) {
      SCOPED_TRACE(std::string(c.deepseek_v3 ? "DeepSeek-V3" : "MoE") + ", micro-batch " +
                   std::to_string(c.micro_batch) + ", merge " + std::to_string(merge));
      PlanRequest req;
      req.schedule_name = "1f1b";
      req.shape = {1, 1, 3};
      req.inputs.model =
          c.deepseek_v3 ? testing::memory_deepseek_v3_config() : testing::memory_config(true);
      req.inputs.micro_batch_size = c.micro_batch;
      req.inputs.gpu = true;
      req.inputs.activation_elem_bytes = 2;
      req.inputs.moe_wgrad_merge = merge;
      EXPECT_EQ(make_plan(req).sim.ranks[0].peak_bytes, c.peak[static_cast<size_t>(merge - 1)]);
    }
  }
}

}  // namespace
}  // namespace tandem::schedule
