// The CPU trainer's whole peak against the planner's (docs/memory.md): one process running
// PipelineTrainer, as `tandem train` does on one rank, its allocator's peak over a step (the
// weights' state, the activations, the tensors in flight, the micro-batches' tokens and the
// nodes' op temporaries: the CPU allocator counts the bytes asked for) equal to the plan's peak
// to the byte, for the demo's model, a dense and a MoE model at several micro-batch sizes and
// counts, Qwen2- and Qwen3-like options, DeepSeek-V3's latent attention, long sequences, zb-h1,
// recomputed experts and modules, merged expert weight gradients, tied embeddings, offload and
// multi-token prediction. Oracle: schedule::make_plan for the same schedule on one stage, which
// never sees the allocator; both use core/footprint.h. The second step is compared (the first also
// makes the Adam moments). On a mismatch the tensors live at the measured peak are printed by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "comm/self_communicator.h"
#include "common/live_at_peak.h"
#include "common/random_tokens.h"
#include "core/allocator.h"
#include "core/footprint.h"
#include "model/tiny.h"
#include "planner/planner.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {
namespace {

struct Case {
  std::string name;
  ModelConfig model;
  int64_t micro_batch = 1;
  int32_t micro_batches = 1;
  const char* schedule = "1f1b";
  bool recompute_experts = false;
  std::string recompute = "";  // TrainConfig::recompute (Note [Recomputed modules])
  int64_t merge = 1;
  std::string offload = "";
  // Megatron-LM's three document options on token 5 (Note [Document masks in the plan] in
  // planner/simulator_state.cc).
  bool documents = false;
};

void expect_peak_as_planned(const Case& c) {
  SCOPED_TRACE(c.name);
  TrainConfig t;
  t.micro_batch_size = c.micro_batch;
  t.global_batch_size = c.micro_batch * c.micro_batches;
  t.recompute_experts = c.recompute_experts;
  t.recompute = c.recompute;
  t.moe_wgrad_merge = c.merge;
  t.offload_activations = c.offload;
  if (c.documents) {
    t.reset_attention_mask = t.document_positions = t.eod_mask_loss = true;
    t.eod_token_id = 5;
  }
  schedule::PlanRequest req;
  req.schedule_name = c.schedule;
  req.shape = {1, 1, c.micro_batches};
  req.inputs.model = c.model;
  req.inputs.micro_batch_size = c.micro_batch;
  req.inputs.activation_elem_bytes = 4;
  req.inputs.recompute_experts = c.recompute_experts;
  req.inputs.recompute = parse_recompute(c.recompute);
  req.inputs.moe_wgrad_merge = c.merge;
  req.inputs.offload_kinds = parse_offload_kinds(c.offload, c.model);
  req.inputs.document_masks = c.documents ? 3 : 0;
  req.inputs.eod_mask_loss = c.documents;
  const schedule::Plan plan = schedule::make_plan(req);
  const testing::RandomTokens tokens(c.model.vocab_size);
  Groups groups = Groups::make(comm::self_world(), 1, 1);
  PipelineTrainer trainer(c.model, t, plan.schedule, groups, tokens, DType::kF32);
  const testing::TracedStep traced = testing::traced_second_step(trainer);
  const StepResult& r = traced.result;
  const schedule::RankResult& want = plan.sim.ranks[0];
  std::printf("%s: peak %lld / %lld, activations %lld / %lld (measured / planned)\n",
              c.name.c_str(), static_cast<long long>(r.memory.total_peak),
              static_cast<long long>(want.peak_bytes), static_cast<long long>(r.activation_peak),
              static_cast<long long>(want.activation_peak_bytes));
  EXPECT_EQ(r.activation_peak, want.activation_peak_bytes);
  EXPECT_EQ(r.memory.total_peak, want.peak_bytes)
      << testing::live_at_peak(traced.events, traced.base);
  EXPECT_GT(want.workspace_peak_bytes, 0);  // the ops' temporaries are planned
}

// The demo's model (Makefile, DEMO_MODEL): 2 layers of hidden 128, 4 heads, 4 experts top-2,
// byte tokens, 100 problems of 10 tokens a micro-batch.
ModelConfig demo_model() {
  ModelConfig m;
  m.vocab_size = 256;
  m.hidden_size = 128;
  m.num_layers = 2;
  m.num_attention_heads = 4;
  m.num_query_groups = 4;
  m.ffn_hidden_size = 256;
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_aux_loss_coeff = 0.01;
  m.seq_length = 10;
  m.untie_embeddings_and_output_weights = true;
  return m;
}

TEST(CpuMemory, DemoPeakIsThePlannedOne) {
  expect_peak_as_planned({.name = "demo", .model = demo_model(), .micro_batch = 100});
}

TEST(CpuMemory, PeaksAreThePlannedOnesToTheByte) {
  const std::pair<const char*, ModelConfig> models[] = {
      {"dense", testing::memory_config(false)},
      {"MoE", testing::memory_config(true)},
      {"Qwen3-MoE", testing::memory_qwen3_config()},
      {"Qwen2-MoE", testing::memory_qwen2_config()},
      {"DeepSeek-V3", testing::memory_deepseek_v3_config()}};
  for (const auto& [name, m] : models) {
    for (const int64_t mbs : {1, 2}) {
      for (const int32_t count : {1, 3}) {
        expect_peak_as_planned({.name = std::string(name) + ", micro-batch " + std::to_string(mbs) +
                                        " x " + std::to_string(count),
                                .model = m,
                                .micro_batch = mbs,
                                .micro_batches = count});
      }
    }
  }
}

// A sequence long beside the width: the attention's [T,T] probabilities outgrow what the node
// saves after them, so its forward's peak is the op's.
TEST(CpuMemory, LongSequencePeakIsThePlannedOne) {
  for (const bool moe : {false, true}) {
    ModelConfig m = testing::memory_config(moe);
    m.hidden_size = 32;
    m.ffn_hidden_size = 64;
    m.seq_length = 512;
    expect_peak_as_planned({.name = moe ? "long MoE" : "long dense",
                            .model = m,
                            .micro_batch = 1,
                            .micro_batches = 2});
  }
}

TEST(CpuMemory, OptionsPeakAsPlanned) {
  const ModelConfig moe = testing::memory_config(true);
  ModelConfig tied = moe;
  tied.untie_embeddings_and_output_weights = false;
  for (const int64_t mbs : {1, 2}) {
    const std::string at = ", micro-batch " + std::to_string(mbs);
    expect_peak_as_planned({.name = "zb-h1" + at,
                            .model = moe,
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .schedule = "zb-h1"});
    expect_peak_as_planned({.name = "recomputed experts" + at,
                            .model = moe,
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .recompute_experts = true});
    expect_peak_as_planned(
        {.name = "merge 2" + at, .model = moe, .micro_batch = mbs, .micro_batches = 3, .merge = 2});
    expect_peak_as_planned(
        {.name = "merge 3" + at, .model = moe, .micro_batch = mbs, .micro_batches = 3, .merge = 3});
    expect_peak_as_planned(
        {.name = "tied" + at, .model = tied, .micro_batch = mbs, .micro_batches = 3});
    expect_peak_as_planned({.name = "offload" + at,
                            .model = testing::memory_qwen2_config(),
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .offload = "attention,experts,shared-expert,combine"});
    expect_peak_as_planned({.name = "document masks" + at,
                            .model = moe,
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .documents = true});
    expect_peak_as_planned({.name = "document masks, zb-h1" + at,
                            .model = moe,
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .schedule = "zb-h1",
                            .documents = true});
  }
}

// Note [Recomputed modules] (model/ffn_nodes.cc): the dense mlp and the shared expert (gated:
// Qwen2's; not: DeepSeek-V3's, whose first layer is dense) keep nothing from forward to backward
// and form their activations again; with recomputed experts, offload and multi-token prediction
// beside. (W-split schedules' activation peaks: tests/dist/test_memory_truth.cc.)
TEST(CpuMemory, RecomputedModulesPeakAsPlanned) {
  ModelConfig deepseek_mtp = testing::memory_deepseek_v3_config();
  deepseek_mtp.mtp_num_layers = 1;
  for (const int64_t mbs : {1, 2}) {
    const std::string at = ", micro-batch " + std::to_string(mbs);
    expect_peak_as_planned({.name = "dense mlp" + at,
                            .model = testing::memory_config(false),
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .recompute = "mlp"});
    expect_peak_as_planned({.name = "Qwen2-MoE shared_experts" + at,
                            .model = testing::memory_qwen2_config(),
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .recompute = "shared_experts"});
    expect_peak_as_planned({.name = "DeepSeek-V3 mlp,shared_experts" + at,
                            .model = testing::memory_deepseek_v3_config(),
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .recompute = "mlp,shared_experts"});
    expect_peak_as_planned({.name = "DeepSeek-V3 all, recomputed experts" + at,
                            .model = testing::memory_deepseek_v3_config(),
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .recompute_experts = true,
                            .recompute = "shared_experts,mlp"});
    expect_peak_as_planned({.name = "DeepSeek-V3 MTP 1, mlp,shared_experts" + at,
                            .model = deepseek_mtp,
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .recompute = "mlp,shared_experts"});
    expect_peak_as_planned({.name = "offload, shared_experts" + at,
                            .model = testing::memory_qwen2_config(),
                            .micro_batch = mbs,
                            .micro_batches = 3,
                            .recompute = "shared_experts",
                            .offload = "attention,experts,shared-expert,combine"});
  }
}

// Multi-token prediction: the modules run inside the loss node (model/mtp.cc), their layers'
// nodes one after another with the input gradients first and the weight gradients in the
// node's weight phase; a dense and a DeepSeek-V3 MoE layer, one and two modules.
TEST(CpuMemory, MtpPeaksAsPlanned) {
  ModelConfig dense = testing::memory_config(false), moe = testing::memory_config(true);
  ModelConfig deepseek = testing::memory_deepseek_v3_config();
  dense.mtp_num_layers = 2;
  moe.mtp_num_layers = 1;
  deepseek.mtp_num_layers = 2;
  for (const int64_t mbs : {1, 2}) {
    const std::string at = ", micro-batch " + std::to_string(mbs);
    expect_peak_as_planned(
        {.name = "dense MTP 2" + at, .model = dense, .micro_batch = mbs, .micro_batches = 3});
    expect_peak_as_planned(
        {.name = "MoE MTP 1" + at, .model = moe, .micro_batch = mbs, .micro_batches = 3});
    expect_peak_as_planned({.name = "DeepSeek-V3 MTP 2" + at,
                            .model = deepseek,
                            .micro_batch = mbs,
                            .micro_batches = 3});
  }
}

}  // namespace
}  // namespace tandem::runtime
