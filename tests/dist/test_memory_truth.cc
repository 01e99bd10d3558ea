// Each rank's measured activation peak equals the planner's prediction for the same schedule,
// exactly, in bytes: every schedule and virtual-stage count the generators allow, every pipeline
// size with data-parallel size 1 or 2 on 1, 2, 4 and 8 ranks (MoE with one expert rank), and
// pipeline size 1 or 2 with two expert ranks and the rest data-parallel. With expert ranks, or
// rows dropped past an expert's capacity without padding, the plan takes the routing the step
// measured (Note [Measured routing] in schedule/routing_file.h); padded to the capacity, the
// plan is exact without it (Note [Expert capacity] in core/footprint.h).
// Oracle: schedule::make_plan (the planner), which never sees the runtime's allocations; both use
// core/footprint.h. Also: each stream runs a combined step's pairs in the planned order, and
// each node reads first the weights the plan says it does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>

#include "common/random_tokens.h"
#include "core/footprint.h"
#include "core/rng.h"
#include "dist_env.h"
#include "model/tiny.h"
#include "planner/planner.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {
namespace {

using testing::g_world;

using testing::RandomTokens;

struct Checked {
  int schedules = 0;        // schedules compared on this layout
  int64_t uneven_rows = 0;  // (micro-batch, layer) entries of this rank's pipeline with R != N k
  int balanced_misses = 0;  // schedules whose balanced plan (N k rows) missed the measured peak
};

// With expert ranks: the pipeline's measured routing (and checks that the expert-parallel group
// received what it sent, EP S rows per (micro-batch, layer) — at most that when rows were dropped
// past a capacity — and that this rank's entries are the ones it recorded).
schedule::RoutingCounts measured_routing(PipelineTrainer& trainer, Groups& groups,
                                         const ModelConfig& m, Checked& checked) {
  schedule::RoutingCounts counts = trainer.pipeline_routing_counts();
  const schedule::RoutingCounts& own = trainer.routing_counts();
  const auto n = static_cast<int64_t>(counts.expert_rows.size());
  Tensor total = Tensor::empty({n}, DType::kI64, MemCategory::kOther, "routing.total");
  std::copy(counts.expert_rows.begin(), counts.expert_rows.end(), total.data<int64_t>());
  groups.ep->all_reduce_sum(total);
  const int64_t sent = moe_routed_rows(m, m.seq_length);  // S, micro-batch 1
  const bool dropping = m.has_expert_capacity() && !m.moe_pad_expert_input_to_capacity;
  for (int64_t i = 0; i < n; ++i) {
    // A dense layer (DeepSeek-V3's first) routes nothing.
    const bool moe = m.is_moe_layer(i % counts.num_layers);
    if (dropping && moe) {
      EXPECT_LE(total.data<int64_t>()[i], groups.layout.ep * sent) << "entry " << i;
    } else {
      EXPECT_EQ(total.data<int64_t>()[i], moe ? groups.layout.ep * sent : 0) << "entry " << i;
    }
    if (!moe) continue;
    if (own.expert_rows[i] >= 0) {
      EXPECT_EQ(own.expert_rows[i], counts.expert_rows[i]) << "entry " << i;
    }
    checked.uneven_rows += counts.expert_rows[i] != sent ? 1 : 0;
  }
  return counts;
}

// The weights each node is the first to read: the planner's count (StageNode::params, from the
// config) against the runtime's prefix of the flat buffer (node_weight_ends, from the weights'
// names), node by node, for each of this rank's stages. The deferred update relies on both.
void expect_plan_reads_the_weights_nodes_read(const schedule::Plan& plan,
                                              PipelineTrainer& trainer) {
  for (const StageRuntime& s : trainer.stages()) {
    const std::vector<schedule::StageNode>& planned =
        plan.model.stages[static_cast<size_t>(s.stage)].nodes;
    const std::vector<model::NodeRef>& nodes = s.chunk->nodes();
    ASSERT_EQ(nodes.size(), planned.size()) << "stage " << s.stage;
    int64_t before = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      EXPECT_EQ(nodes[i].kind, planned[i].kind) << "stage " << s.stage << " node " << i;
      EXPECT_EQ(s.weight_ends[i] - before, planned[i].params)
          << "stage " << s.stage << " node " << i << " (" << node_kind_name(nodes[i].kind) << ")";
      before = s.weight_ends[i];
    }
    EXPECT_EQ(before, s.params->numel()) << "stage " << s.stage;
  }
}

// The loss of `trainer`'s step and its gradients against the same step of `reference` (its
// first), bit for bit.
void expect_bitwise_step(const PipelineTrainer& trainer, double loss, PipelineTrainer& reference,
                         const std::string& at) {
  EXPECT_EQ(loss, reference.forward_backward(0).loss) << at << " rank " << g_world->rank();
  for (size_t s = 0; s < trainer.stages().size(); ++s) {
    const Tensor& got = trainer.stages()[s].params->flat_grads();
    const Tensor& ref = reference.stages()[s].params->flat_grads();
    EXPECT_EQ(0, std::memcmp(got.data<float>(), ref.data<float>(), got.nbytes()))
        << at << " stage " << trainer.stages()[s].stage;
  }
}

// Runs every schedule the generators allow on pipeline size pp with dp data-parallel ranks (ep
// of them expert-parallel) and compares this rank's measured activation peak with the plan's
// for its pipeline rank.
// recompute: TrainConfig::recompute_experts on both sides (Note [Recomputed experts]).
// offload: TrainConfig::offload_activations on both sides (Note [Activation offload]); then the
// host bytes' peak is the plan's too, and the loss and every gradient are bitwise those of the
// same step without offload.
// merge: TrainConfig::moe_wgrad_merge on both sides (Note [Merged expert weight gradients]);
// then the loss is that of the same step without it (f32: only the experts' weight gradients'
// summation order differs, and the loss is formed before them).
// documents: Megatron-LM's three document options on id 5 of the tokens (Note [Document masking]
// in data/document_masks.h), on the trainer's side only: the plan is the same with them.
// modules: TrainConfig::recompute on both sides (Note [Recomputed modules] in
// model/ffn_nodes.cc); then the loss and every gradient are bitwise those of the same step
// without it.
Checked check_layout(const ModelConfig& m, int pp, int dp, int ep, bool recompute = false,
                     const std::string& offload = {}, int64_t first_layers = 0, int64_t merge = 1,
                     bool documents = false, const std::string& modules = {}) {
  Checked checked;
  for (const char* name :
       {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "combined-1f1b", "dualpipev"}) {
    for (const auto& [v, pair] : {std::pair{1, false}, {2, false}, {1, true}}) {
      TrainConfig t;
      t.micro_batch_size = 1;
      t.global_batch_size = 4 * pp * dp;
      t.recompute_experts = recompute;
      t.offload_activations = offload;
      t.first_stage_layers = first_layers;
      t.moe_wgrad_merge = merge;
      t.recompute = modules;
      if (documents) {
        t.reset_attention_mask = t.document_positions = t.eod_mask_loss = true;
        t.eod_token_id = 5;
      }
      schedule::PlanRequest req;
      req.schedule_name = name;
      req.shape = {pp, v, static_cast<int32_t>(4 * pp), pair};
      req.inputs.model = m;
      req.inputs.micro_batch_size = 1;
      req.inputs.expert_parallel_size = ep;
      req.inputs.recompute_experts = recompute;
      req.inputs.offload_kinds = parse_offload_kinds(offload, m);
      req.inputs.first_stage_layers = first_layers;
      req.inputs.moe_wgrad_merge = merge;
      req.inputs.recompute = parse_recompute(modules);
      req.inputs.cost.kind = schedule::CostModelKind::kUniform;
      schedule::Plan plan;
      try {
        plan = schedule::make_plan(req);
      } catch (const Error&) {
        continue;  // the schedule does not support this shape (generators.h lists which do)
      }
      std::vector<int> all;
      for (int r = 0; r < g_world->size(); ++r) all.push_back(r);
      Groups groups = Groups::make(g_world->subgroup(all, "world"), pp, ep);
      RandomTokens data(16);
      PipelineTrainer trainer(m, t, plan.schedule, groups, data, DType::kF32, CommOverlap::kOff);
      expect_plan_reads_the_weights_nodes_read(plan, trainer);
      cpu_allocator().reset_peaks();  // the peaks of this step only
      const int64_t base = cpu_allocator().stats().in_use_of(MemCategory::kActivation);
      const StepResult r = trainer.forward_backward(0);
      const int64_t measured = cpu_allocator().stats().peak_of(MemCategory::kActivation) - base;
      const int32_t pp_rank = groups.layout.pp_rank(g_world->rank());
      if (merge > 1) {
        TrainConfig plain = t;
        plain.moe_wgrad_merge = 1;
        PipelineTrainer reference(m, plain, plan.schedule, groups, data, DType::kF32,
                                  CommOverlap::kOff);
        EXPECT_EQ(r.loss, reference.forward_backward(0).loss)
            << name << " v" << v << " rank " << g_world->rank();
        for (size_t s = 0; s < trainer.stages().size(); ++s) {
          const Tensor& got = trainer.stages()[s].params->flat_grads();
          const Tensor& ref = reference.stages()[s].params->flat_grads();
          double diff = 0, scale = 0;
          for (int64_t i = 0; i < got.numel(); ++i) {
            diff = std::max(diff, double(std::fabs(got.data<float>()[i] - ref.data<float>()[i])));
            scale = std::max(scale, double(std::fabs(ref.data<float>()[i])));
          }
          EXPECT_LE(diff, 1e-5 * scale) << name << " v" << v << " stage " << s;
        }
      }
      const std::string at = std::string(name) + " v" + std::to_string(v);
      if (!modules.empty()) {
        TrainConfig plain = t;
        plain.recompute.clear();
        PipelineTrainer reference(m, plain, plan.schedule, groups, data, DType::kF32,
                                  CommOverlap::kOff);
        expect_bitwise_step(trainer, r.loss, reference, at);
      }
      if (!offload.empty()) {
        EXPECT_NE(trainer.offload(), nullptr);
        if (trainer.offload() == nullptr) continue;
        EXPECT_EQ(trainer.offload()->layers_out(), 0u);
        TrainConfig plain = t;
        plain.offload_activations.clear();
        PipelineTrainer reference(m, plain, plan.schedule, groups, data, DType::kF32,
                                  CommOverlap::kOff);
        expect_bitwise_step(trainer, r.loss, reference, at);
      }
      const bool dropping = m.has_expert_capacity() && !m.moe_pad_expert_input_to_capacity;
      if (ep > 1 || dropping) {  // plan again with what this rank's pipeline's experts received
        checked.balanced_misses += plan.sim.ranks[pp_rank].activation_peak_bytes != measured;
        req.inputs.routing = measured_routing(trainer, groups, m, checked);
        plan = schedule::make_plan(req);
      }
      const int64_t planned = plan.sim.ranks[pp_rank].activation_peak_bytes;
      EXPECT_EQ(measured, planned)
          << name << (pair ? " paired first forwards" : "") << " v" << v << " pp" << pp << " dp"
          << dp << " ep" << ep << " rank " << g_world->rank();
      if (!offload.empty()) {
        EXPECT_EQ(trainer.offload()->host_peak(), plan.sim.ranks[pp_rank].offload_host_peak_bytes)
            << name << " v" << v << " rank " << g_world->rank();
        EXPECT_GT(trainer.offload()->host_peak(), 0) << name;
      }
      ++checked.schedules;
    }
  }
  return checked;
}

ModelConfig truth_model() {
  ModelConfig m;
  m.vocab_size = 16;
  m.hidden_size = 8;
  m.num_layers = std::max(8, 2 * g_world->size());  // every stage of V = 2 gets a layer
  m.num_attention_heads = 2;
  m.num_query_groups = 1;
  m.ffn_hidden_size = 12;
  m.num_experts = 4;
  m.seq_length = 6;
  return m;
}

TEST(MemoryTruth, MeasuredActivationPeakAgainstPlan) {
  const ModelConfig m = truth_model();
  // Every pipeline size that leaves a data-parallel size of 1 or 2 on this many ranks.
  int checked = 0;
  for (int dp : {1, 2}) {
    if (g_world->size() % dp != 0) continue;
    checked += check_layout(m, g_world->size() / dp, dp, 1).schedules;
  }
  EXPECT_GE(checked, g_world->size() == 1 ? 5 : 6);
}

// Document masks (their bounds, positions and loss mask are batch inputs, as the ids: no node
// saves them): the planned activation peak is still the measured one, every schedule.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithDocumentMasks) {
  const ModelConfig m = truth_model();
  const int checked = check_layout(m, g_world->size(), 1, 1, false, {}, 0, 1, true).schedules;
  EXPECT_GE(checked, g_world->size() == 1 ? 5 : 6);
}

// Recomputed experts (they keep only their input rows, and act again from the input-gradient
// backward to the weight gradient): still exact, for every schedule (the W-split ones hold act
// from I to W), one and two expert ranks.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithRecomputedExperts) {
  const ModelConfig m = truth_model();
  int checked = check_layout(m, g_world->size(), 1, 1, /*recompute=*/true).schedules;
  if (g_world->size() % 2 == 0) {
    checked += check_layout(m, 1, g_world->size(), 2, /*recompute=*/true).schedules;
  }
  EXPECT_GE(checked, g_world->size() == 1 ? 5 : 6);
}

// Note [Recomputed modules] (model/ffn_nodes.cc): dense layers and MoE layers with a gated shared
// expert, in turn, their mlp and shared expert keeping nothing from forward to backward (act
// again from the input-gradient backward to the weight gradient): still exact, for every
// schedule, and the loss and gradients bitwise those of the step that keeps them; with the
// other MoE layers' experts recomputed too.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithRecomputedModules) {
  ModelConfig m = truth_model();
  m.moe_layer_freq = "[0";
  for (int64_t l = 1; l < m.num_layers; ++l) m.moe_layer_freq += l % 2 != 0 ? ",1" : ",0";
  m.moe_layer_freq += "]";
  m.moe_shared_expert_intermediate_size = 6;
  m.moe_shared_expert_gate = true;
  int checked = 0;
  for (const bool experts : {false, true}) {
    checked +=
        check_layout(m, g_world->size(), 1, 1, experts, {}, 0, 1, false, "mlp,shared_experts")
            .schedules;
  }
  EXPECT_GE(checked, g_world->size() == 1 ? 10 : 12);
}

// Offloaded activations (every offloadable node of the layers, a gated shared expert among
// them): the device's activation peak and the host's peak as planned, for every schedule, and
// the step's loss and gradients those of the same step without offload; one and two expert
// ranks.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithOffload) {
  ModelConfig m = truth_model();
  m.moe_shared_expert_intermediate_size = 6;
  m.moe_shared_expert_gate = true;
  const std::string all = "attention,experts,shared-expert,combine";
  int checked = check_layout(m, g_world->size(), 1, 1, false, all).schedules;
  if (g_world->size() % 2 == 0) {
    checked += check_layout(m, 1, g_world->size(), 2, false, "experts,combine").schedules;
  }
  EXPECT_GE(checked, g_world->size() == 1 ? 5 : 6);
}

// Note [Merged expert weight gradients]: the experts' weight gradients of three micro-batches
// in one product (four micro-batches a pipeline rank: a group of three, then one of one), the
// three waiting as activations until then: still exact, for every schedule (with offloaded and
// with recomputed experts too), and the loss and gradients those of the step without the
// merge; one expert rank, and two (groups of two).
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithMergedExpertGrads) {
  const ModelConfig m = truth_model();
  int checked = check_layout(m, g_world->size(), 1, 1, false, {}, 0, /*merge=*/3).schedules;
  // with the experts' saved tensors offloaded between forward and backward, and recomputed
  checked += check_layout(m, g_world->size(), 1, 1, false, "experts,combine", 0, 3).schedules;
  checked += check_layout(m, g_world->size(), 1, 1, true, {}, 0, 3).schedules;
  if (g_world->size() % 2 == 0) {
    checked += check_layout(m, 1, g_world->size(), 2, false, {}, 0, /*merge=*/2).schedules;
  }
  EXPECT_GE(checked, g_world->size() == 1 ? 15 : 18);
}

// Note [Uneven stages]: the first stage one layer, the others the rest evenly (where that
// splits), for every schedule on every pipeline size of this world.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithUnevenStages) {
  if (g_world->size() < 2) GTEST_SKIP() << "uneven stages need a pipeline";
  const ModelConfig m = truth_model();
  const int checked = check_layout(m, g_world->size(), 1, 1, false, {}, 1).schedules;
  EXPECT_GE(checked, 3);
}

// DeepSeek-V3's model (multi-head latent attention with its latents, values of their own width,
// the sigmoid router with its bias, a shared expert without a gate): every pipeline size with a
// dense first layer, and two expert ranks (every layer MoE) where the world is even.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanDeepseekV3) {
  const ModelConfig all_moe = testing::with_deepseek_v3_options(truth_model(), 5);
  ModelConfig dense_first = all_moe;
  dense_first.moe_layer_freq = "[0";
  for (int64_t l = 1; l < all_moe.num_layers; ++l) dense_first.moe_layer_freq += ",1";
  dense_first.moe_layer_freq += "]";
  int checked = check_layout(dense_first, g_world->size(), 1, 1).schedules;
  if (g_world->size() % 2 == 0) checked += check_layout(all_moe, 1, g_world->size(), 2).schedules;
  EXPECT_GE(checked, g_world->size() == 1 ? 5 : 6);
}

// Qwen3-MoE's dense layers among MoE ones, two at each end, so that combined 1F1B pairs a dense
// layer's forward with a dense layer's backward (kPairDense in planner/simulator.cc, the same
// order in runtime/combined.cc): one rank, and two expert ranks where the world is even.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithDenseLayerPairs) {
  ModelConfig m = truth_model();
  m.qk_layernorm = true;  // Qwen3-MoE: dense layers by --moe-layer-freq
  m.moe_layer_freq = "[";
  for (int64_t l = 0; l < m.num_layers; ++l) {
    m.moe_layer_freq += std::string(l ? "," : "") + (l < 2 || l >= m.num_layers - 2 ? "0" : "1");
  }
  m.moe_layer_freq += "]";
  int checked = check_layout(m, 1, g_world->size(), 1).schedules;
  if (g_world->size() % 2 == 0) checked += check_layout(m, 1, g_world->size(), 2).schedules;
  EXPECT_GE(checked, g_world->size() == 1 ? 5 : 10);
}

// Two and four expert ranks: the plan made from the measured routing counts is exact too.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithExpertRanks) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const ModelConfig m = truth_model();
  int checked = 0;
  Tensor t = Tensor::zeros({2}, DType::kI64, MemCategory::kOther, "uneven");  // over all ranks
  for (int ep : {2, 4}) {
    for (int pp : {1, 2}) {
      if (g_world->size() % (pp * ep) != 0) continue;  // EP divides DP = world / PP
      const Checked c = check_layout(m, pp, g_world->size() / pp, ep);
      checked += c.schedules;
      t.data<int64_t>()[0] += c.uneven_rows;
      t.data<int64_t>()[1] += c.balanced_misses;
    }
  }
  EXPECT_GE(checked, 6);
  // The routing was uneven, and the balanced figure alone would have missed some peaks.
  g_world->all_reduce_sum(t);
  EXPECT_GT(t.data<int64_t>()[0], 0);
  EXPECT_GT(t.data<int64_t>()[1], 0);
  if (g_world->rank() == 0) {
    std::cout << "EP = 2 and 4: " << checked << " schedules per rank, " << t.data<int64_t>()[1]
              << " (rank, schedule) peaks that balanced routing would have missed\n";
  }
}

// Note [Expert capacity]: padded to the capacity (4 experts take ceil(6 x 2 / 4 x 1.5) = 5 rows
// each of the 12 a rank routes, so the rows sent grow to 20), every size is known before the
// step: the plan alone is exact, with one and with two expert ranks (no peak missed). Without
// padding, rows dropped past a capacity of 3, the plan from the measured routing is exact, one
// expert rank included. With the z-loss's logits and the seq_aux_loss counts kept too.
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithExpertCapacity) {
  ModelConfig padded = truth_model();
  padded.moe_expert_capacity_factor = 1.5;
  padded.moe_pad_expert_input_to_capacity = true;
  padded.moe_z_loss_coeff = 0.01;
  ASSERT_EQ(moe_routed_rows(padded, padded.seq_length), 20);
  ModelConfig dropping = truth_model();
  dropping.moe_expert_capacity_factor = 1.0;
  dropping.moe_router_load_balancing_type = "seq_aux_loss";
  Checked c = check_layout(padded, g_world->size(), 1, 1);
  c.schedules += check_layout(dropping, g_world->size(), 1, 1).schedules;
  if (g_world->size() % 2 == 0) {
    const Checked p = check_layout(padded, 1, g_world->size(), 2);
    c.schedules += p.schedules;
    EXPECT_EQ(p.balanced_misses, 0) << "padded: the plan alone should be exact";
    c.schedules += check_layout(dropping, 1, g_world->size(), 2).schedules;
  }
  EXPECT_GE(c.schedules, g_world->size() == 1 ? 10 : 12);
}

// Multi-token prediction (its modules inside the loss node, their MoE layers' state and the
// shared head's among its saved bytes): one pipeline stage (the modules need the embedding), the
// world data-parallel, with one expert rank, and with two where the experts' inputs are padded
// to their capacity (the measured routing the plan takes covers the model's layers, not the
// modules': with expert ranks and no padding their rows are planned balanced).
TEST(MemoryTruth, MeasuredActivationPeakAgainstPlanWithMtp) {
  ModelConfig m = truth_model();
  m.mtp_num_layers = 2;
  m.moe_z_loss_coeff = 0.01;
  int checked = check_layout(m, 1, g_world->size(), 1).schedules;
  if (g_world->size() % 2 == 0) {
    m.moe_expert_capacity_factor = 1.5;
    m.moe_pad_expert_input_to_capacity = true;
    checked += check_layout(m, 1, g_world->size(), 2).schedules;
  }
  EXPECT_GE(checked, 3);
}

// Two MoE layers of four experts: a combined step of a few micro-batches in moments.
ModelConfig two_moe_layers() {
  ModelConfig m;
  m.vocab_size = 20;
  m.hidden_size = 8;
  m.num_layers = 2;
  m.num_attention_heads = 2;
  m.num_query_groups = 1;
  m.ffn_hidden_size = 12;
  m.num_experts = 4;
  m.seq_length = 6;
  return m;
}

// The planner's FB and FF pairs (kPairMoe, kForwardsMoe in planner/simulator.cc) and the
// runtime's issue order (Note [Issue order] in runtime/combined.cc) are written separately;
// what they must share is each stream's order. Oracle: the plan's spans of the pair actions,
// stream by stream (input-gradient and forward halves; a node's weight half follows its input
// half on the same stream; the embedding left out, whose backward is a weight half only),
// against the nodes the runtime ran inside its pair actions, stream by stream: combined-1f1b
// with its first forwards paired or not, with two expert ranks (the all-to-all on the
// communication worker) when the world size is even, else one (then only the compute stream's
// nodes are compared, the all-to-all running in order beside them).
TEST(PlanTruth, EachStreamRunsThePairsNodesInThePlannedOrder) {
  const ModelConfig m = two_moe_layers();
  const int world = g_world->size();
  const int ep = world % 2 == 0 ? 2 : 1;
  for (const bool paired : {false, true}) {
    TrainConfig t;
    t.micro_batch_size = 1;
    t.global_batch_size = 4 * world;  // 4 micro-batches on each rank (all are data-parallel)
    schedule::PlanRequest req;
    req.schedule_name = "combined-1f1b";
    req.shape = {1, 1, 4, paired};
    req.inputs.model = m;
    req.inputs.expert_parallel_size = ep;
    const schedule::Plan plan = schedule::make_plan(req);
    std::vector<int> all;
    for (int r = 0; r < world; ++r) all.push_back(r);
    Groups groups = Groups::make(g_world->subgroup(all, "world"), 1, ep);
    RandomTokens data(16);
    PipelineTrainer trainer(m, t, plan.schedule, groups, data);
    trainer.forward_backward(0);
    const std::vector<schedule::Action>& list = plan.schedule.ranks[0];
    for (const std::string stream : {"compute", "comm"}) {
      if (ep == 1 && stream == "comm") continue;
      std::vector<std::string> planned, ran;
      for (const schedule::Span& s : plan.sim.ranks[0].spans) {
        const bool on = (s.stream == schedule::Stream::kCompute) == (stream == "compute");
        const bool weight_half = s.phase == schedule::Phase::kBackwardWeight;
        if (s.kind != schedule::SpanKind::kNode || !on || weight_half ||
            !schedule::is_pair(list[static_cast<size_t>(s.action)].kind)) {
          continue;
        }
        if (ep == 1 && schedule::node_is_communication(s.node)) continue;
        if (s.node == NodeKind::kEmbed) continue;  // its backward is only a weight half
        planned.push_back(std::string(s.phase == schedule::Phase::kForward ? "F" : "B") +
                          std::to_string(s.microbatch) + " " + std::string(node_kind_name(s.node)));
      }
      for (const Span& s : trainer.timeline()) {
        const bool node = (s.name[0] == 'F' || s.name[0] == 'B') && s.name.size() > 1 &&
                          std::isdigit(static_cast<unsigned char>(s.name[1])) &&
                          s.name.find(' ') != std::string::npos;
        const bool comm_kind = s.name.find(" dispatch") != std::string::npos ||
                               s.name.find(" combine") != std::string::npos;
        const bool embed = s.name.find(" embed") != std::string::npos;
        if (!node || embed || s.stream != stream || (ep == 1 && comm_kind)) continue;
        ran.push_back(s.name);
      }
      EXPECT_GT(planned.size(), 8u) << stream;
      EXPECT_EQ(ran, planned) << stream << (paired ? ", paired first forwards" : "");
    }
  }
}

}  // namespace
}  // namespace tandem::runtime

namespace tandem::runtime {
namespace {

// Inside a combined forward-backward step, the loss node's fp32 logits are freed during its
// backward, before the next node of the step starts. Oracle: the measured timeline (node spans)
// and the allocator's trace of the same step.
TEST(MemoryTruth, LogitsFreedBeforeTheNextNodeOfACombinedStep) {
  const ModelConfig m = two_moe_layers();
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 3;
  schedule::PlanRequest req;
  req.schedule_name = "combined-1f1b";
  req.shape = {1, 1, 3};
  req.inputs.model = m;
  const schedule::Plan plan = schedule::make_plan(req);
  // Every rank runs the case on its own (a group of one).
  Groups groups = Groups::make(g_world->subgroup({g_world->rank()}, "self"), 1, 1);
  RandomTokens data(16);
  PipelineTrainer trainer(m, t, plan.schedule, groups, data);
  cpu_allocator().set_trace(true);
  trainer.forward_backward(0);
  const std::vector<MemEvent> mem = cpu_allocator().trace();
  cpu_allocator().set_trace(false);
  const double t0 = trainer.step_start_seconds();
  const std::vector<Span>& spans = trainer.timeline();
  int checked = 0;
  for (size_t i = 0; i + 1 < spans.size(); ++i) {
    if (spans[i].name.rfind("B", 0) != 0 || spans[i].name.find(" loss") == std::string::npos)
      continue;
    // The loss backward of a combined step: find the logits' free inside it.
    int frees = 0;
    for (const MemEvent& e : mem) {
      if (e.tag != "loss.logits" || e.bytes >= 0) continue;
      const double at = e.time - t0;
      if (at >= spans[i].start && at <= spans[i + 1].start) ++frees;
    }
    EXPECT_EQ(frees, 1) << spans[i].name << " then " << spans[i + 1].name;
    ++checked;
  }
  EXPECT_GE(checked, 2) << "combined steps with a loss backward";
}

}  // namespace
}  // namespace tandem::runtime
