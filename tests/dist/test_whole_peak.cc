// Each rank's whole peak over a training step equal to the plan's for its pipeline rank, to the
// byte (docs/memory.md "Planned and measured"): the allocator's peak of the step (the weights'
// state, the activations, the pipeline messages, the micro-batches' tokens and document masks,
// the ops' temporaries) on pipelines across ranks (1F1B, interleaved, zb-h1, GPipe) and on expert
// ranks under 1F1B. Oracle: schedule::make_plan for the same
// schedule and layout, which never sees the allocator. The second step is compared (the first
// also makes the Adam moments). On a mismatch the tensors live at the measured peak are printed
// by name, beside the plan's parts at its peak.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/live_at_peak.h"
#include "common/random_tokens.h"
#include "core/allocator.h"
#include "layouts.h"
#include "planner/planner.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {
namespace {

using testing::g_world;

struct Layout {
  const char* schedule;
  int pp = 1;
  int ep = 1;
  int v = 1;
  // Megatron-LM's three document options on token 5 (Note [Document masks in the plan] in
  // planner/simulator_state.cc).
  bool documents = false;
};

std::string describe(const Layout& l) {
  return std::string(l.schedule) + " pp" + std::to_string(l.pp) + " ep" + std::to_string(l.ep) +
         " v" + std::to_string(l.v) + (l.documents ? " documents" : "");
}

// dist_tiny's MoE model (eight layers: every stage of PP 4 with two virtual stages gets one),
// wide and long enough that a pipeline message (8 KiB) passes MPI's shared-memory eager limit (a
// send completes only once its receive is posted), routing forced balanced and padded to a
// capacity so that every rank's expert rows are known before the step.
ModelConfig whole_peak_model() {
  ModelConfig m = testing::dist_tiny(true);
  m.hidden_size = 32;
  m.seq_length = 64;
  m.moe_expert_capacity_factor = 1;
  m.moe_pad_expert_input_to_capacity = true;
  return m;
}

// Runs two steps of `l` on the whole world (the ranks beyond pp x ep data-parallel) and compares
// this rank's second step's peak with the plan's for its pipeline rank.
void expect_whole_peak_as_planned(const Layout& l) {
  SCOPED_TRACE(describe(l));
  const ModelConfig m = whole_peak_model();
  const int dp = g_world->size() / l.pp;
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 2 * l.pp * dp;
  t.moe_router_force_balance = true;
  if (l.documents) {
    t.reset_attention_mask = t.document_positions = t.eod_mask_loss = true;
    t.eod_token_id = 5;
  }
  schedule::PlanRequest req;
  req.schedule_name = l.schedule;
  req.shape = {l.pp, l.v, static_cast<int32_t>(2 * l.pp)};
  req.inputs.expert_parallel_size = l.ep;
  req.inputs.model = m;
  req.inputs.micro_batch_size = 1;
  req.inputs.data_parallel_size = dp;
  req.inputs.document_masks = l.documents ? 3 : 0;
  req.inputs.eod_mask_loss = l.documents;
  const schedule::Plan plan = schedule::make_plan(req);
  Groups groups = testing::world_groups(l.pp, l.ep);
  const testing::RandomTokens data(m.vocab_size);
  PipelineTrainer trainer(m, t, plan.schedule, groups, data, DType::kF32);
  const testing::TracedStep traced = testing::traced_second_step(trainer);
  const StepResult& r = traced.result;
  const schedule::RankResult& want =
      plan.sim.ranks[static_cast<size_t>(groups.layout.pp_rank(g_world->rank()))];
  EXPECT_EQ(r.memory.total_peak, want.peak_bytes)
      << "rank " << g_world->rank() << ": planned at its peak: activations "
      << want.activation_at_peak_bytes << ", in flight " << want.in_flight_at_peak_bytes
      << ", workspace " << want.workspace_at_peak_bytes << "\n"
      << testing::live_at_peak(traced.events, traced.base);
}

// Every pipeline size of two or four that divides the world (the rest data-parallel): 1F1B
// (with document masks too), interleaved 1F1B with two virtual stages a rank, zb-h1 and GPipe.
TEST(WholePeak, PipelineRanksPeakAsPlanned) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a pipeline across ranks";
  for (const int pp : {2, 4}) {
    if (g_world->size() % pp != 0) continue;
    expect_whole_peak_as_planned({.schedule = "1f1b", .pp = pp});
    expect_whole_peak_as_planned({.schedule = "1f1b", .pp = pp, .documents = true});
    expect_whole_peak_as_planned({.schedule = "interleaved-1f1b", .pp = pp, .v = 2});
    expect_whole_peak_as_planned({.schedule = "zb-h1", .pp = pp});
    expect_whole_peak_as_planned({.schedule = "gpipe", .pp = pp});
  }
}

// Two expert ranks under 1F1B (a full B: each node's weight gradient right after its input
// gradient, before the dispatch's all-to-all), one pipeline rank and, on four ranks or more,
// two.
TEST(WholePeak, ExpertRanksUnderOneFOneBPeakAsPlanned) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "needs two expert ranks";
  expect_whole_peak_as_planned({.schedule = "1f1b", .ep = 2});
  expect_whole_peak_as_planned({.schedule = "1f1b", .ep = 2, .documents = true});
  if (g_world->size() % 4 == 0)
    expect_whole_peak_as_planned({.schedule = "1f1b", .pp = 2, .ep = 2});
}

}  // namespace
}  // namespace tandem::runtime
