// The GPU trainer's memory against the planner's (docs/schedules.md "Memory accounting"):
// one process, a dense and a MoE model at several micro-batch sizes, the activation peak and the
// whole peak (static + activations + in flight + the nodes' op temporaries; the allocator counts
// the bytes asked for) equal to the plan's to the byte. Oracle:
// schedule::make_plan for 1f1b on one stage (what one process runs), which never sees the
// allocator; both use core/footprint.h. GEMM tuning is off (--gemm-tune=false): a step that
// first meets a new bucket of some expert's rows tunes it and holds the candidates' outputs for
// a moment, one-time buffers the plan leaves out by design (Note [Tuned algorithms] in
// src/ops/cuda/gemm.cc; docs/planning.md), and which step that is depends on the routing. The
// second step is compared.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "comm/self_communicator.h"
#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "core/device.h"
#include "core/tuning.h"
#include "model/tiny.h"
#include "planner/planner.h"
#include "runtime/pipeline_trainer.h"

namespace tandem {
namespace {

// Note [Performance settings] in core/tuning.h: before the first product is tuned.
void without_gemm_tuning() {
  Tuning t = tuning();
  t.gemm_tune = false;
  set_tuning(t);
}

struct Peaks {
  int64_t activation = 0, total = 0;
};

ModelConfig model_qwen3() { return testing::memory_qwen3_config(); }
ModelConfig model_qwen2() { return testing::memory_qwen2_config(); }

Peaks measured(const ModelConfig& m, const TrainConfig& t) {
  const testing::RandomTokens tokens(m.vocab_size);
  runtime::ReferenceTrainer trainer(m, t, tokens);
  trainer.step();
  const runtime::StepResult r = trainer.step();
  return {r.activation_peak, r.memory.total_peak};
}

Peaks planned(const ModelConfig& m, const TrainConfig& t) {
  schedule::PlanRequest req;
  req.schedule_name = "1f1b";
  req.shape = {1, 1, static_cast<int32_t>(t.num_microbatches())};
  req.inputs.model = m;
  req.inputs.micro_batch_size = t.micro_batch_size;
  req.inputs.gpu = true;
  req.inputs.activation_elem_bytes = 2;
  req.inputs.moe_wgrad_merge = t.moe_wgrad_merge;
  // Note [Document masks in the plan] (planner/simulator_state.cc).
  req.inputs.document_masks = t.document_mask_count();
  req.inputs.eod_mask_loss = t.eod_mask_loss;
  const schedule::Plan plan = schedule::make_plan(req);
  return {plan.sim.ranks[0].activation_peak_bytes, plan.sim.ranks[0].peak_bytes};
}

TEST(CudaMemory, PeaksAreThePlannedOnesToTheByte) {
  without_gemm_tuning();
  const std::pair<const char*, ModelConfig> models[] = {
      {"dense", testing::memory_config(false)},
      {"MoE", testing::memory_config(true)},
      {"Qwen3-MoE", model_qwen3()},
      {"Qwen2-MoE", model_qwen2()},
      {"DeepSeek-V3", testing::memory_deepseek_v3_config()}};
  for (const auto& [name, m] : models) {
    for (const int64_t mbs : {1, 2, 4}) {
      SCOPED_TRACE(std::string(name) + ", micro-batch " + std::to_string(mbs));
      TrainConfig t;
      t.device = Device::kCUDA;
      t.micro_batch_size = mbs;
      t.global_batch_size = 3 * mbs;
      const Peaks got = measured(m, t), want = planned(m, t);
      std::printf(
          "%s micro-batch %lld: activations %lld / %lld, peak %lld / %lld (measured / "
          "planned)\n",
          name, static_cast<long long>(mbs), static_cast<long long>(got.activation),
          static_cast<long long>(want.activation), static_cast<long long>(got.total),
          static_cast<long long>(want.total));
      EXPECT_EQ(got.activation, want.activation);
      EXPECT_EQ(got.total, want.total);
    }
  }
}

// Note [Document masks in the plan]: Megatron-LM's three document masks (12 bytes a token in
// one device buffer per micro-batch, from its forward to its backward) are in the planned peak,
// to the byte, and are what the plan adds.
TEST(CudaMemory, DocumentMasksAsPlannedToTheByte) {
  without_gemm_tuning();
  for (const bool moe : {false, true}) {
    const ModelConfig m = testing::memory_config(moe);
    for (const int64_t mbs : {1, 2}) {
      SCOPED_TRACE(std::string(moe ? "MoE" : "dense") + ", micro-batch " + std::to_string(mbs));
      TrainConfig t;
      t.device = Device::kCUDA;
      t.micro_batch_size = mbs;
      t.global_batch_size = 3 * mbs;
      const Peaks plain = planned(m, t);
      t.reset_attention_mask = t.document_positions = t.eod_mask_loss = true;
      t.eod_token_id = 5;
      const Peaks got = measured(m, t), want = planned(m, t);
      std::printf(
          "%s micro-batch %lld with document masks: peak %lld / %lld (measured / planned)\n",
          moe ? "MoE" : "dense", static_cast<long long>(mbs), static_cast<long long>(got.total),
          static_cast<long long>(want.total));
      EXPECT_EQ(got.activation, want.activation);
      EXPECT_EQ(got.total, want.total);
      EXPECT_EQ(want.total, plain.total + 12 * mbs * m.seq_length);
    }
  }
}

// Note [Merged expert weight gradients] on the GPU: the experts' weight gradients of 2 or 3 of
// the 3 micro-batches in one product per expert (2: a group of two, then one of one): the
// waiting micro-batches' tensors (activations) and the gathered buffers (the pass's workspace)
// are the plan's to the byte, and the second step's loss is the unmerged run's but for the
// gradients' summation order (its weights took one update from them).
TEST(CudaMemory, MergedExpertGradientsAsPlannedToTheByte) {
  without_gemm_tuning();
  const std::pair<const char*, ModelConfig> models[] = {
      {"MoE", testing::memory_config(true)}, {"DeepSeek-V3", testing::memory_deepseek_v3_config()}};
  for (const auto& [name, m] : models) {
    for (const int64_t mbs : {1, 2}) {
      TrainConfig plain;
      plain.device = Device::kCUDA;
      plain.micro_batch_size = mbs;
      plain.global_batch_size = 3 * mbs;
      const testing::RandomTokens tokens(m.vocab_size);
      double want_loss = 0;
      {  // gone before the merged run: its weights would count in that run's peak
        runtime::ReferenceTrainer base(m, plain, tokens);
        base.step();
        want_loss = base.step().loss;
      }
      const Peaks unmerged = measured(m, plain);
      for (const int64_t merge : {2, 3}) {
        SCOPED_TRACE(std::string(name) + ", micro-batch " + std::to_string(mbs) + ", merge " +
                     std::to_string(merge));
        TrainConfig t = plain;
        t.moe_wgrad_merge = merge;
        runtime::ReferenceTrainer trainer(m, t, tokens);
        trainer.step();
        const runtime::StepResult r = trainer.step();
        const Peaks got{r.activation_peak, r.memory.total_peak}, want = planned(m, t);
        std::printf(
            "%s micro-batch %lld merge %lld: activations %lld / %lld, peak %lld / %lld "
            "(measured / planned), loss %.6f / %.6f (merged / not)\n",
            name, static_cast<long long>(mbs), static_cast<long long>(merge),
            static_cast<long long>(got.activation), static_cast<long long>(want.activation),
            static_cast<long long>(got.total), static_cast<long long>(want.total), r.loss,
            want_loss);
        EXPECT_EQ(got.activation, want.activation);
        EXPECT_EQ(got.total, want.total);
        EXPECT_GT(got.activation, unmerged.activation);
        EXPECT_NEAR(r.loss, want_loss, 1e-3 * want_loss);
      }
    }
  }
}

// Two steps of one process's GPU trainer (1f1b, 4 micro-batches of 2) with `offload` and
// `recompute` (TrainConfig's), planned into `plan`: the losses, the last step's gradients.
struct TwoSteps {
  std::vector<double> losses;
  std::vector<float> grads;
  runtime::StepResult last;
};
TwoSteps run_two_steps(const ModelConfig& m, const std::string& offload,
                       const std::string& recompute, schedule::Plan& plan) {
  const testing::RandomTokens tokens(m.vocab_size);
  TrainConfig t;
  t.device = Device::kCUDA;
  t.micro_batch_size = 2;
  t.global_batch_size = 8;
  t.offload_activations = offload;
  t.recompute = recompute;
  schedule::PlanRequest req;
  req.schedule_name = "1f1b";
  req.shape = {1, 1, 4};
  req.inputs.model = m;
  req.inputs.micro_batch_size = t.micro_batch_size;
  req.inputs.gpu = true;
  req.inputs.activation_elem_bytes = 2;
  req.inputs.offload_kinds = parse_offload_kinds(offload, m);
  req.inputs.recompute = parse_recompute(recompute);
  plan = schedule::make_plan(req);
  runtime::Groups groups = runtime::Groups::make(comm::self_world(), 1, 1, 1, Device::kCUDA);
  runtime::PipelineTrainer trainer(m, t, plan.schedule, groups, tokens, DType::kF32);
  TwoSteps r;
  for (int s = 0; s < 2; ++s) {
    r.last = trainer.step();
    r.losses.push_back(r.last.loss);
  }
  const Tensor grads = trainer.stages()[0].params->flat_grads().to(Device::kCPU);
  r.grads.assign(grads.data<float>(), grads.data<float>() + grads.numel());
  return r;
}

// Note [Activation offload] on the GPU: one process's trainer (1f1b, 4 micro-batches) offloading
// every kind the Qwen2-MoE-like model has (attention, experts, its gated shared expert, combine):
// the activation peak, the whole peak and the host's peak equal the plan's to the byte, the
// activation peak is lower than without offload, and the losses and gradients of two steps are
// bitwise those without offload.
TEST(CudaMemory, OffloadedActivationsAsPlannedAndTheSameSteps) {
  without_gemm_tuning();
  const ModelConfig m = model_qwen2();
  schedule::Plan plain_plan, plan;
  const TwoSteps plain = run_two_steps(m, "", "", plain_plan);
  const TwoSteps off = run_two_steps(m, "attention,experts,shared-expert,combine", "", plan);
  const schedule::RankResult& want = plan.sim.ranks[0];
  std::printf(
      "offload: activations %lld / %lld (without offload %lld), peak %lld / %lld, host "
      "%lld / %lld (measured / planned)\n",
      static_cast<long long>(off.last.activation_peak),
      static_cast<long long>(want.activation_peak_bytes),
      static_cast<long long>(plain.last.activation_peak),
      static_cast<long long>(off.last.memory.total_peak), static_cast<long long>(want.peak_bytes),
      static_cast<long long>(off.last.offload_host_peak),
      static_cast<long long>(want.offload_host_peak_bytes));
  EXPECT_EQ(off.last.activation_peak, want.activation_peak_bytes);
  EXPECT_EQ(off.last.memory.total_peak, want.peak_bytes);
  EXPECT_EQ(off.last.offload_host_peak, want.offload_host_peak_bytes);
  EXPECT_EQ(plain.last.activation_peak, plain_plan.sim.ranks[0].activation_peak_bytes);
  EXPECT_LT(off.last.activation_peak, plain.last.activation_peak);
  EXPECT_EQ(off.losses, plain.losses);
  EXPECT_EQ(off.grads, plain.grads);
}

// Note [Recomputed modules] (model/ffn_nodes.cc) on the GPU: the Qwen2-MoE-like model with a
// dense first layer, its mlp and gated shared expert formed again in the backward: the
// activation peak and the whole peak as planned to the byte, lower than the run that keeps them,
// and the losses and gradients of two steps bitwise that run's (the products and SwiGLU run
// again on the same inputs with the same kernels).
TEST(CudaMemory, RecomputedModulesAsPlannedAndTheSameSteps) {
  without_gemm_tuning();
  ModelConfig m = model_qwen2();
  m.moe_layer_freq = "[0,1]";
  schedule::Plan plain_plan, plan;
  const TwoSteps plain = run_two_steps(m, "", "", plain_plan);
  const TwoSteps again = run_two_steps(m, "", "mlp,shared_experts", plan);
  const schedule::RankResult& want = plan.sim.ranks[0];
  std::printf(
      "recompute mlp,shared_experts: activations %lld / %lld (kept %lld), peak %lld / %lld "
      "(measured / planned)\n",
      static_cast<long long>(again.last.activation_peak),
      static_cast<long long>(want.activation_peak_bytes),
      static_cast<long long>(plain.last.activation_peak),
      static_cast<long long>(again.last.memory.total_peak),
      static_cast<long long>(want.peak_bytes));
  EXPECT_EQ(again.last.activation_peak, want.activation_peak_bytes);
  EXPECT_EQ(again.last.memory.total_peak, want.peak_bytes);
  EXPECT_EQ(plain.last.activation_peak, plain_plan.sim.ranks[0].activation_peak_bytes);
  EXPECT_LT(again.last.activation_peak, plain.last.activation_peak);
  EXPECT_EQ(again.losses, plain.losses);
  EXPECT_EQ(again.grads, plain.grads);
}

}  // namespace
}  // namespace tandem
