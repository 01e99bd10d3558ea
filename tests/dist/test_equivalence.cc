// Every schedule and parallel layout (PP up to 4, EP up to 4, PP2 x EP4 on 8 ranks), for a dense,
// a Mixtral-like, a Qwen3-MoE-like and a Qwen2-MoE-like model (and one with MTP modules on the
// layouts of one stage), against the single-rank sequential
// reference: the same
// global batch gives the same loss and the same gradient for every parameter (compared by its
// Hugging Face name). fp64. Oracle: runtime::ReferenceTrainer on one rank, computed on every rank.
//  - bitwise when only the pipeline is split (EP = DP = 1): each stage runs the same arithmetic
//    on the same micro-batches, and accumulates gradients in the same micro-batch order;
//  - otherwise within 1e-12 relative (per tensor, in norm): the data-parallel all-reduce and the
//    expert GEMMs over rows from several ranks sum in another order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "core/rng.h"
#include "dist_env.h"
#include "layouts.h"
#include "model/tiny.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/generators.h"
#include "schedule/validator.h"

namespace tandem::runtime {
namespace {

using testing::g_world;

using testing::RandomTokens;

// kMoeDropping, kMoePadded, kV3Routing: Megatron-LM's routing options (docs/model.md "Load
// balancing", "Expert capacity") on the Mixtral-like and the DeepSeek-V3 model: dropping past a
// capacity (by weight, unpadded), padding to it (by position) under forced balancing's random
// logits, the z-loss and each load-balancing granularity but the global one (whose statistics
// span the data-parallel ranks: GlobalAuxLoss... below).
enum class Model : uint8_t {
  kDense,
  kMoe,
  kQwen3,
  kQwen2,
  kDeepseekV3,
  kMoeDropping,
  kMoePadded,
  kV3Routing,
  kMtp,
  kTied,     // Note [Tied embeddings]: the MoE model, its output layer the embedding table
  kTiedMtp,  // the same with two MTP modules (one stage), which use the tied table too
};

ModelConfig tiny(bool moe);

// Qwen3-MoE's options (q/k norms, a head dim of its own, narrower experts, pre-softmax routing,
// dense layers among the MoE ones) and Qwen2-MoE's (q/k/v biases, a gated shared expert).
ModelConfig tiny(Model model) {
  const ModelConfig m = tiny(model != Model::kDense);
  if (model == Model::kQwen3) return testing::with_qwen3_options(m, "[0,1,1,1,1,0,1,1]");
  if (model == Model::kQwen2) return testing::with_qwen2_options(m);
  if (model == Model::kDeepseekV3 || model == Model::kV3Routing) {
    ModelConfig d = testing::with_deepseek_v3_options(m, 5);
    d.moe_layer_freq = "[0,1,1,1,1,1,1,1]";
    if (model == Model::kV3Routing) {
      d.moe_router_load_balancing_type = "aux_loss";
      d.moe_aux_loss_coeff = 0.05;
      d.moe_z_loss_coeff = 0.01;
      d.moe_expert_capacity_factor = 0.75;
      d.moe_pad_expert_input_to_capacity = true;
    }
    return d;
  }
  ModelConfig r = m;
  r.untie_embeddings_and_output_weights = model != Model::kTied && model != Model::kTiedMtp;
  if (model == Model::kMtp || model == Model::kTiedMtp) {  // two MTP modules of MoE layers
    r.mtp_num_layers = 2;
    r.moe_z_loss_coeff = 0.01;
  } else if (model == Model::kMoeDropping) {
    r.moe_expert_capacity_factor = 0.75;
    r.moe_router_load_balancing_type = "seq_aux_loss";
    r.moe_z_loss_coeff = 0.01;
  } else if (model == Model::kMoePadded) {
    r.moe_expert_capacity_factor = 1.0;
    r.moe_token_drop_policy = "position";
    r.moe_pad_expert_input_to_capacity = true;
  }
  return r;
}

// Forced balancing's random logits (Note [Forced load balancing]) for kMoePadded.
bool forced_balance(Model model) { return model == Model::kMoePadded; }

const char* model_name(Model m) {
  switch (m) {
    case Model::kDense:
      return "dense";
    case Model::kMoe:
      return "moe";
    case Model::kQwen3:
      return "qwen3-moe";
    case Model::kQwen2:
      return "qwen2-moe";
    case Model::kDeepseekV3:
      return "deepseek-v3";
    case Model::kMoeDropping:
      return "moe dropping past a capacity";
    case Model::kMoePadded:
      return "moe padded to a capacity, forced balance";
    case Model::kV3Routing:
      return "deepseek-v3 aux loss, z-loss, padded capacity";
    case Model::kMtp:
      return "moe with two MTP modules";
    case Model::kTied:
      return "moe with tied embeddings";
    case Model::kTiedMtp:
      return "moe with tied embeddings and two MTP modules";
  }
  return "?";
}

ModelConfig tiny(bool moe) { return testing::dist_tiny(moe); }

using testing::rel_diff;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (a.data<double>()[i] != b.data<double>()[i]) return false;
  }
  return true;
}

using testing::world_groups;

struct Case {
  Model model;
  int pp, ep, v;
  schedule::ScheduleKind kind;
  bool pair_first_forwards = false;
  int64_t first = 0, last = 0;  // Note [Uneven stages]: the first and last stage's layers
  // Megatron-LM's document masking, all three options, on id 5 of the random tokens
  // (Note [Document masking] in data/document_masks.h).
  bool documents = false;
  // --calculate-per-token-loss (Note [Per-token loss] in runtime/step.h), with the documents'
  // loss mask: the global batch's count spans every data-parallel rank's micro-batches.
  bool per_token = false;
};

// Runs one case on every rank; returns false (and says why) when the schedule does not support
// the shape.
bool run_case(const Case& c, int dp) {
  const ModelConfig m = tiny(c.model);
  TrainConfig t;
  t.moe_router_force_balance = forced_balance(c.model);
  t.micro_batch_size = 1;
  const int32_t mb_per_rank = 4 * c.pp;
  t.global_batch_size = mb_per_rank * dp;
  t.first_stage_layers = c.first;
  t.last_stage_layers = c.last;
  if (c.documents) {
    t.reset_attention_mask = t.document_positions = t.eod_mask_loss = true;
    t.eod_token_id = 5;
  }
  t.calculate_per_token_loss = c.per_token;
  const std::optional<schedule::Schedule> sched =
      testing::layout_schedule({c.pp, c.ep, c.v, c.kind, c.pair_first_forwards}, mb_per_rank);
  if (!sched) return false;
  RandomTokens data(m.vocab_size);

  ReferenceTrainer reference(m, t, data, DType::kF64);
  const StepResult want = reference.forward_backward(0);
  std::map<std::string, Tensor> ref_grads;
  for (const auto& e : reference.params().entries()) ref_grads[e.name] = reference.params().grad(e);

  Groups groups = world_groups(c.pp, c.ep);
  PipelineTrainer trainer(m, t, *sched, groups, data, DType::kF64);
  const StepResult got = trainer.forward_backward(0);

  std::ostringstream what;
  what << model_name(c.model) << " " << schedule::schedule_kind_name(c.kind) << " pp" << c.pp
       << " ep" << c.ep << " dp" << dp << " v" << c.v
       << (c.pair_first_forwards ? " paired first forwards" : "")
       << (c.documents ? " document masks" : "") << (c.per_token ? " per-token loss" : "")
       << " layers first " << c.first << " last " << c.last << " on rank " << g_world->rank();
  const bool exact = c.ep == 1 && dp == 1;
  EXPECT_NEAR(got.loss, want.loss, 1e-12 * std::abs(want.loss)) << what.str();
  if (exact) {
    EXPECT_EQ(got.loss, want.loss) << what.str();
  }
  int compared = 0;
  for (StageRuntime& s : trainer.stages()) {
    for (const auto& e : s.params->entries()) {
      const Tensor& ref = ref_grads.at(e.name);
      const Tensor g = s.params->grad(e);
      // Note [Tying in the reference]: the reference adds the table's two gradients in another
      // order.
      if (exact && !(m.tied_embeddings() && e.name == "model.embed_tokens.weight")) {
        EXPECT_TRUE(bitwise_equal(g, ref))
            << what.str() << ": " << e.name << " differs by " << rel_diff(g, ref);
      } else {
        EXPECT_LT(rel_diff(g, ref), 1e-12) << what.str() << ": " << e.name;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << what.str();
  if (g_world->rank() == 0)
    std::cout << "  checked " << what.str() << (exact ? " (bitwise)\n" : "\n");
  return true;
}

void run_matrix(Model model) {
  const int world = g_world->size();
  const int ran =
      testing::for_each_layout(model != Model::kDense, [&](const testing::Layout& l, int dp) {
        return run_case({model, l.pp, l.ep, l.v, l.kind, l.pair_first_forwards}, dp);
      });
  if (world == 1 || world == 2 || world == 4 || world == 8) {
    EXPECT_GT(ran, 0) << "no case ran on " << world << " ranks";
  }
}

// Note [Paired forwards]: (0F0;0F1) changes when the forwards run, not what they compute, nor the
// order in which gradients are accumulated: bitwise the unpaired combined-1f1b on the same
// layout (expert parallel over up to 4 ranks, so the all-to-alls run inside the pair).
TEST(Equivalence, PairedFirstForwardsAreBitwiseTheUnpairedSchedule) {
  const int world = g_world->size();
  const int ep = world >= 4 ? 4 : world;
  const ModelConfig m = tiny(true);
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 4 * world;
  RandomTokens data(m.vocab_size);
  const auto kind = schedule::ScheduleKind::kCombined1f1b;
  const schedule::Schedule plain = schedule::generate_schedule(kind, {1, 1, 4, false});
  const schedule::Schedule paired = schedule::generate_schedule(kind, {1, 1, 4, true});
  ASSERT_EQ(paired.ranks[0].front().kind, schedule::ActionKind::kForwardForward);
  Groups g1 = world_groups(1, ep), g2 = world_groups(1, ep);
  PipelineTrainer a(m, t, plain, g1, data, DType::kF64);
  PipelineTrainer b(m, t, paired, g2, data, DType::kF64);
  const StepResult ra = a.forward_backward(0), rb = b.forward_backward(0);
  EXPECT_EQ(ra.loss, rb.loss);
  EXPECT_EQ(ra.aux_loss, rb.aux_loss);
  int compared = 0;
  for (size_t k = 0; k < a.stages().size(); ++k) {
    for (const auto& e : a.stages()[k].params->entries()) {
      const Tensor ga = a.stages()[k].params->grad(e), gb = b.stages()[k].params->grad(e);
      EXPECT_TRUE(bitwise_equal(gb, ga)) << e.name << " differs by " << rel_diff(gb, ga);
      ++compared;
    }
  }
  EXPECT_GT(compared, 0);
}

// Note [Gradients reduced beside the backward]: each layer's gradients all-reduced as soon as the
// step is done with it, against all of them after the backward (TrainConfig::
// overlap_grad_reduce), on every schedule and every layout with a data-parallel or expert-data-
// parallel group: bitwise where every group has two ranks (one order to add two numbers), else
// within 1e-14 (MPI may add more than two in another order for another size). A unit reduced
// before its last gradient would miss it on the other ranks; one reduced after the step's end
// trips the trainer's check.
void run_overlap_against_end(bool moe) {
  const int world = g_world->size();
  const ModelConfig m = tiny(moe);
  RandomTokens data(m.vocab_size);
  int ran = 0;
  for (int pp : {1, 2}) {
    for (int ep : {1, 2}) {
      if (world % pp != 0 || (!moe && ep > 1) || (world / pp) % ep != 0) continue;
      const int dp = world / pp;  // the dense weights' group; the experts' has dp / ep ranks
      if (dp < 2) continue;
      const bool exact = dp == 2;
      for (int k = 0; k < schedule::kNumScheduleKinds; ++k) {
        const auto kind = static_cast<schedule::ScheduleKind>(k);
        const schedule::ScheduleShape shape{pp, 1, 2 * pp, false};
        try {
          schedule::check_supported(kind, shape);
        } catch (const Error&) {
          continue;
        }
        const schedule::Schedule sched = schedule::generate_schedule(kind, shape);
        TrainConfig t;
        t.micro_batch_size = 1;
        t.global_batch_size = 2 * pp * dp;
        TrainConfig at_end = t;
        at_end.overlap_grad_reduce = false;
        Groups g1 = world_groups(pp, ep), g2 = world_groups(pp, ep);
        PipelineTrainer a(m, t, sched, g1, data, DType::kF64);
        PipelineTrainer b(m, at_end, sched, g2, data, DType::kF64);
        const StepResult ra = a.forward_backward(0), rb = b.forward_backward(0);
        std::ostringstream what;
        what << (moe ? "moe " : "dense ") << schedule::schedule_kind_name(kind) << " pp" << pp
             << " ep" << ep << " dp" << dp << " on rank " << g_world->rank();
        EXPECT_EQ(ra.loss, rb.loss) << what.str();
        for (size_t s = 0; s < a.stages().size(); ++s) {
          for (const auto& e : a.stages()[s].params->entries()) {
            const Tensor ga = a.stages()[s].params->grad(e), gb = b.stages()[s].params->grad(e);
            if (exact) {
              EXPECT_TRUE(bitwise_equal(ga, gb))
                  << what.str() << ": " << e.name << " differs by " << rel_diff(ga, gb);
            } else {
              EXPECT_LT(rel_diff(ga, gb), 1e-14) << what.str() << ": " << e.name;
            }
          }
        }
        ++ran;
      }
    }
  }
  if (world > 1) {
    EXPECT_GT(ran, 0) << "no layout with a data-parallel group on " << world;
  }
}

TEST(Equivalence, GradientsReducedBesideTheBackwardAreThoseReducedAtTheEnd) {
  run_overlap_against_end(false);
  run_overlap_against_end(true);
}

// Note [Uneven stages]: a first or last stage of its own layer count, the rest shared evenly,
// on DeepSeek-V3's model (its first layer dense): loss and every gradient the one rank's, bitwise
// without expert or data parallelism.
TEST(Equivalence, UnevenStagesAreTheOneRank) {
  using schedule::ScheduleKind;
  const int world = g_world->size();
  std::vector<std::pair<Case, int>> cases;  // (case, dp)
  if (world == 2) {
    cases.push_back({{Model::kDeepseekV3, 2, 1, 1, ScheduleKind::k1f1b, false, 3, 0}, 1});
    cases.push_back({{Model::kDeepseekV3, 2, 1, 1, ScheduleKind::kZbH1, false, 0, 2}, 1});
    cases.push_back({{Model::kDeepseekV3, 2, 1, 2, ScheduleKind::kDualPipeV, false, 1, 1}, 1});
  } else if (world == 4) {
    cases.push_back({{Model::kDeepseekV3, 4, 1, 1, ScheduleKind::k1f1b, false, 1, 1}, 1});
    cases.push_back({{Model::kDeepseekV3, 2, 2, 1, ScheduleKind::kCombined1f1b, false, 1, 0}, 2});
  } else if (world == 8) {
    cases.push_back({{Model::kDeepseekV3, 4, 1, 1, ScheduleKind::k1f1b, false, 1, 3}, 2});
  } else {
    GTEST_SKIP() << "uneven stages need a pipeline: 2, 4 or 8 ranks";
  }
  for (const auto& [c, dp] : cases) EXPECT_TRUE(run_case(c, dp));
}

// Document masking (--reset-attention-mask, --document-positions, --eod-mask-loss): every stage
// reads the masks from the micro-batch's ids itself, the loss node its loss mask; loss and every
// gradient the one rank's (bitwise without expert or data parallelism), DeepSeek-V3's MLA and
// Mixtral's attention both.
TEST(Equivalence, DocumentMasksAreTheOneRank) {
  using schedule::ScheduleKind;
  const int world = g_world->size();
  std::vector<std::pair<Case, int>> cases;  // (case, dp)
  const auto documents = [](Case c) {
    c.documents = true;
    return c;
  };
  if (world == 1) {
    cases.push_back({documents({Model::kMoe, 1, 1, 1, ScheduleKind::k1f1b}), 1});
  } else if (world == 2) {
    cases.push_back({documents({Model::kDeepseekV3, 2, 1, 1, ScheduleKind::k1f1b}), 1});
    cases.push_back({documents({Model::kMoe, 2, 1, 2, ScheduleKind::kInterleaved1f1b}), 1});
    cases.push_back({documents({Model::kMoe, 1, 2, 1, ScheduleKind::k1f1b}), 2});
  } else if (world == 4) {
    cases.push_back({documents({Model::kDeepseekV3, 2, 2, 1, ScheduleKind::kCombined1f1b}), 2});
  } else {
    GTEST_SKIP() << "document masks run on 1, 2 and 4 ranks";
  }
  for (const auto& [c, dp] : cases) EXPECT_TRUE(run_case(c, dp));
}

// The per-token loss over document-masked micro-batches, and the MTP modules with document
// masks (Note [MTP loss mask] in model/mtp.cc), on pipeline, expert and data-parallel layouts.
TEST(Equivalence, PerTokenLossAndMtpWithDocumentMasksAreTheOneRank) {
  using schedule::ScheduleKind;
  const int world = g_world->size();
  std::vector<std::pair<Case, int>> cases;  // (case, dp)
  const auto documents = [](Case c, bool per_token) {
    c.documents = true;
    c.per_token = per_token;
    return c;
  };
  if (world == 1) {
    cases.push_back({documents({Model::kMoe, 1, 1, 1, ScheduleKind::k1f1b}, true), 1});
    cases.push_back({documents({Model::kMtp, 1, 1, 1, ScheduleKind::k1f1b}, false), 1});
    cases.push_back({documents({Model::kMtp, 1, 1, 1, ScheduleKind::k1f1b}, true), 1});
  } else if (world == 2) {
    cases.push_back({documents({Model::kDense, 2, 1, 1, ScheduleKind::k1f1b}, true), 1});
    cases.push_back({documents({Model::kMoe, 1, 2, 1, ScheduleKind::k1f1b}, true), 2});
    cases.push_back({documents({Model::kMtp, 1, 2, 1, ScheduleKind::k1f1b}, true), 2});
    cases.push_back({documents({Model::kMtp, 1, 1, 1, ScheduleKind::k1f1b}, false), 2});
  } else if (world == 4) {
    cases.push_back({documents({Model::kDeepseekV3, 2, 2, 1, ScheduleKind::k1f1b}, true), 2});
    cases.push_back({documents({Model::kTiedMtp, 1, 2, 1, ScheduleKind::k1f1b}, true), 4});
  } else {
    GTEST_SKIP() << "per-token losses run on 1, 2 and 4 ranks";
  }
  for (const auto& [c, dp] : cases) EXPECT_TRUE(run_case(c, dp));
}

TEST(Equivalence, DenseEverySchedule) { run_matrix(Model::kDense); }
TEST(Equivalence, MoeEverySchedule) { run_matrix(Model::kMoe); }
TEST(Equivalence, Qwen3MoeEverySchedule) { run_matrix(Model::kQwen3); }
TEST(Equivalence, Qwen2MoeEverySchedule) { run_matrix(Model::kQwen2); }
TEST(Equivalence, DeepseekV3EverySchedule) { run_matrix(Model::kDeepseekV3); }
TEST(Equivalence, MoeDroppingPastACapacityEverySchedule) { run_matrix(Model::kMoeDropping); }
TEST(Equivalence, MoePaddedToACapacityWithForcedBalanceEverySchedule) {
  run_matrix(Model::kMoePadded);
}
TEST(Equivalence, DeepseekV3RoutingLossesAndCapacityEverySchedule) {
  run_matrix(Model::kV3Routing);
}

// Multi-token prediction (docs/model.md "Multi-token prediction") on one pipeline stage (the
// modules read the embedding the first stage holds): every schedule of one stage and every
// expert split the world allows, the modules' MoE layers' all-to-alls run inside the loss node
// (combined-1f1b with expert ranks is refused: check_mtp_overlap).
void run_mtp_every_expert_split(Model model) {
  // for_each_layout gives one stage data-parallel sizes up to 4 (its note).
  if (testing::g_world->size() > 4) GTEST_SKIP() << "no one-stage layout at this world size";
  const int ran = testing::for_each_layout(true, [&](const testing::Layout& l, int dp) {
    if (l.pp != 1 || l.v != 1) return false;
    if (l.ep > 1 && l.kind == schedule::ScheduleKind::kCombined1f1b) return false;
    return run_case({model, l.pp, l.ep, l.v, l.kind, l.pair_first_forwards}, dp);
  });
  EXPECT_GT(ran, 0);
}

TEST(Equivalence, MtpEveryExpertSplit) { run_mtp_every_expert_split(Model::kMtp); }

// Note [Tied embeddings] (model/parameters.h): the output layer the embedding table, on every
// schedule and layout (one stage: one tensor; several, interleaved and V-shaped included: the
// first stage's table and the last stage's copy, their gradients summed over the embedding
// group), against the reference, which ties them its own way (Note [Tying in the reference]).
TEST(Equivalence, TiedEmbeddingsEverySchedule) { run_matrix(Model::kTied); }
TEST(Equivalence, TiedEmbeddingsWithMtpEveryExpertSplit) {
  run_mtp_every_expert_split(Model::kTiedMtp);
}

// global_aux_loss: Megatron-LM's statistics are the running mean over the step's micro-batches
// so far of the counts summed over the data-parallel group, so the loss depends on the
// data-parallel size (as in Megatron-LM) and on nothing else. Every pipeline of one
// data-parallel rank against the one rank's (bitwise), and with the world data-parallel, expert
// parallelism over 2 ranks against none (within 1e-12); the loss differs from aux_loss's.
TEST(Equivalence, GlobalAuxLossIsTheOneRanksForEveryPipelineAndTheSameForEveryExpertSplit) {
  const int world = g_world->size();
  ModelConfig m = tiny(Model::kMoe);
  m.moe_router_load_balancing_type = "global_aux_loss";
  m.moe_aux_loss_coeff = 0.5;
  RandomTokens data(m.vocab_size);
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 4 * world;
  const auto kind = schedule::ScheduleKind::k1f1b;
  {  // the world as one pipeline
    const schedule::Schedule sched =
        schedule::generate_schedule(kind, {world, 1, 4 * world, false});
    ReferenceTrainer reference(m, t, data, DType::kF64);
    const StepResult want = reference.forward_backward(0);
    Groups groups = world_groups(world, 1);
    PipelineTrainer trainer(m, t, sched, groups, data, DType::kF64);
    const StepResult got = trainer.forward_backward(0);
    EXPECT_EQ(got.loss, want.loss);
    ModelConfig plain = m;
    plain.moe_router_load_balancing_type = "aux_loss";
    ReferenceTrainer aux(plain, t, data, DType::kF64);
    EXPECT_NE(aux.forward_backward(0).aux_loss, want.aux_loss);
  }
  if (world % 2 != 0) return;
  const schedule::Schedule sched = schedule::generate_schedule(kind, {1, 1, 4, false});
  Groups g1 = world_groups(1, 1), g2 = world_groups(1, 2);
  PipelineTrainer a(m, t, sched, g1, data, DType::kF64);
  PipelineTrainer b(m, t, sched, g2, data, DType::kF64);
  const StepResult ra = a.forward_backward(0), rb = b.forward_backward(0);
  EXPECT_NEAR(rb.loss, ra.loss, 1e-12 * std::abs(ra.loss));
  for (size_t k = 0; k < a.stages().size(); ++k) {
    for (const auto& e : b.stages()[k].params->entries()) {
      const Tensor gb = b.stages()[k].params->grad(e);
      const Tensor ga = a.stages()[k].params->grad(*std::find_if(
          a.stages()[k].params->entries().begin(), a.stages()[k].params->entries().end(),
          [&](const model::ParamEntry& r) { return r.name == e.name; }));
      EXPECT_LT(rel_diff(gb, ga), 1e-12) << e.name << " on rank " << g_world->rank();
    }
  }
}

// Calls body(pp, ep, dp, schedule) for each layout of PP and EP up to 2 that this world allows
// (PP2 x EP2 on 4 ranks), 1f1b over 2 x PP micro-batches per rank; returns how many ran.
template <class Body>
int for_each_small_layout(Body body) {
  const int world = g_world->size();
  int ran = 0;
  for (int pp : {1, 2}) {
    for (int ep : {1, 2}) {
      if (world % pp != 0 || (world / pp) % ep != 0) continue;
      const schedule::ScheduleShape shape{pp, 1, 2 * pp, false};
      body(pp, ep, world / pp, schedule::generate_schedule(schedule::ScheduleKind::k1f1b, shape));
      ++ran;
    }
  }
  return ran;
}

// The reference trainer's weight of that name.
Tensor reference_param(const ReferenceTrainer& r, const std::string& name) {
  const auto& entries = r.params().entries();
  return r.params().param(*std::find_if(
      entries.begin(), entries.end(), [&](const model::ParamEntry& e) { return e.name == name; }));
}

// Note [Expert bias]: three training steps of DeepSeek-V3's model, its expert bias moved after
// each from the step's load, on every layout of PP and EP up to 2 (PP2 x EP2 on 4 ranks) against
// the one-rank reference trainer: the biases bitwise (their updates add +-rate from integer
// loads), the weights within 1e-12 (the data-parallel sums' order), and the bias has moved.
TEST(Equivalence, ExpertBiasAfterStepsIsTheOneRanksOnEveryLayout) {
  ModelConfig m = tiny(Model::kDeepseekV3);
  m.moe_router_bias_update_rate = 0.01;
  RandomTokens data(m.vocab_size);
  const int ran =
      for_each_small_layout([&](int pp, int ep, int dp, const schedule::Schedule& sched) {
        TrainConfig t;
        t.micro_batch_size = 1;
        t.global_batch_size = 2 * pp * dp;
        t.train_iters = 3;
        t.lr_warmup_iters = 0;
        ReferenceTrainer reference(m, t, data, DType::kF64);
        Groups groups = world_groups(pp, ep);
        PipelineTrainer trainer(m, t, sched, groups, data, DType::kF64);
        for (int step = 0; step < 3; ++step) {
          reference.step();
          trainer.step();
        }
        std::ostringstream what;
        what << "pp" << pp << " ep" << ep << " dp" << dp << " on rank " << g_world->rank();
        int biases = 0;
        double moved = 0;  // a layer's bias may come back to 0 (+u then -u), not every one
        for (StageRuntime& s : trainer.stages()) {
          for (const auto& e : s.params->entries()) {
            const Tensor want = reference_param(reference, e.name);
            const Tensor got = s.params->param(e);
            if (e.kind == model::ParamKind::kBuffer) {
              EXPECT_TRUE(bitwise_equal(got, want)) << what.str() << ": " << e.name;
              for (int64_t i = 0; i < got.numel(); ++i) moved += std::abs(got.data<double>()[i]);
              ++biases;
            } else {
              EXPECT_LT(rel_diff(got, want), 1e-12) << what.str() << ": " << e.name;
            }
          }
        }
        EXPECT_GT(biases, 0) << what.str();
        EXPECT_GT(moved, 0) << what.str() << ": no expert bias moved";
      });
  EXPECT_GT(ran, 0);
}

// The steps tests' options: micro-batches of one, two per stage and data-parallel rank.
TrainConfig steps_train(int pp, int dp) {
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 2 * pp * dp;
  t.train_iters = 4;
  t.lr = 1e-2;
  t.clip_grad = 0.5;
  return t;
}

// The optimizers the steps tests run: 0 the plain one, 1 the distributed one, 2 the update
// deferred to the next forward.
const char* const kOptimizerVariants[] = {"", " distributed", " deferred"};
TrainConfig optimizer_variant(TrainConfig t, int variant) {
  t.use_distributed_optimizer = variant == 1;
  t.defer_optimizer = variant == 2;
  return t;
}

// Note [Decoupled learning rate]: three steps with --decoupled-lr and --decoupled-min-lr (a
// warm-up and a cosine decay, clipping on) on every layout of PP and EP up to 2, with the plain
// optimizer, the distributed one (its parts cut inside the embedding and the output layer) and
// the update deferred to the next forward, against the one-rank reference trainer with the same
// options: every weight within 1e-12 (the gradient norm that clipping reads, and the
// data-parallel sums, add in another order), the embedding on the first stage and the output
// layer on the last at the decoupled rate as on one rank; and those two are not the weights of a
// run without the option.
TEST(Equivalence, DecoupledLrIsTheOneRanksOnEveryLayout) {
  const ModelConfig m = tiny(Model::kMoe);
  RandomTokens data(m.vocab_size);
  const int ran = for_each_small_layout([&](int pp, int ep, int dp,
                                            const schedule::Schedule& sched) {
    TrainConfig t = steps_train(pp, dp);
    t.min_lr = 1e-3;
    t.lr_warmup_iters = 1;
    t.lr_warmup_init = 1e-3;
    t.lr_decay_style = LrDecayStyle::kCosine;
    TrainConfig plain_lr = t;
    t.decoupled_lr = 5e-2;
    t.decoupled_min_lr = 2e-4;
    ReferenceTrainer reference(m, t, data, DType::kF64), without(m, plain_lr, data, DType::kF64);
    for (int step = 0; step < 3; ++step) {
      reference.step();
      without.step();
    }
    for (const int variant : {0, 1, 2}) {
      Groups groups = world_groups(pp, ep);
      PipelineTrainer trainer(m, optimizer_variant(t, variant), sched, groups, data, DType::kF64);
      for (int step = 0; step < 3; ++step) {
        const StepResult r = trainer.step();
        EXPECT_EQ(r.decoupled_lr, learning_rates(t, step + 1).embedding_output);
      }
      std::ostringstream what;
      what << "pp" << pp << " ep" << ep << " dp" << dp << kOptimizerVariants[variant] << " on rank "
           << g_world->rank();
      int decoupled = 0;
      for (StageRuntime& s : trainer.stages()) {  // finishes a deferred update
        for (const auto& e : s.params->entries()) {
          const Tensor got = s.params->param(e);
          EXPECT_LT(rel_diff(got, reference_param(reference, e.name)), 1e-12)
              << what.str() << ": " << e.name;
          if (e.name == "model.embed_tokens.weight" || e.name == "lm_head.weight") {
            EXPECT_GT(rel_diff(got, reference_param(without, e.name)), 1e-6)
                << what.str() << ": " << e.name << " as without --decoupled-lr";
            ++decoupled;
          }
        }
      }
      // The first stage holds the embedding, the last the output layer.
      EXPECT_EQ(decoupled, pp == 1 ? 2 : 1) << what.str();
    }
  });
  EXPECT_GT(ran, 0);
}

// Every rank's tied table (the first stage's) or copy (the last stage's), as bytes; "" where it
// holds neither. Note [Tied embeddings]: all of them are the same bits.
std::vector<std::string> tied_tables(PipelineTrainer& trainer) {
  std::string mine;
  for (StageRuntime& s : trainer.stages()) {
    for (const auto& e : s.params->entries()) {
      if (e.name != "model.embed_tokens.weight") continue;
      const Tensor w = s.params->param(e);
      mine.assign(reinterpret_cast<const char*>(w.data<double>()),
                  static_cast<size_t>(w.numel()) * sizeof(double));
    }
  }
  return g_world->all_gather_bytes(mine);
}

// Note [Tied embeddings] and Note [The embedding group] (runtime/grad_reduce.cc): three steps of
// the tied MoE model (clipping on, so the norm counts the table once) on every layout of PP and EP
// up to 2, with the plain optimizer, the distributed one and the update deferred to the next
// forward, against the one-rank reference: every loss and weight within 1e-9, and the first
// stage's table and the last stage's copy bitwise equal on every rank.
TEST(Equivalence, TiedEmbeddingsAfterStepsAreTheOneRanksOnEveryLayout) {
  const ModelConfig m = tiny(Model::kTied);
  RandomTokens data(m.vocab_size);
  const int ran = for_each_small_layout([&](int pp, int ep, int dp,
                                            const schedule::Schedule& sched) {
    const TrainConfig t = steps_train(pp, dp);
    ReferenceTrainer reference(m, t, data, DType::kF64);
    std::vector<StepResult> want;
    for (int step = 0; step < 3; ++step) want.push_back(reference.step());
    for (const int variant : {0, 1, 2}) {
      Groups groups = world_groups(pp, ep);
      PipelineTrainer trainer(m, optimizer_variant(t, variant), sched, groups, data, DType::kF64);
      std::ostringstream what;
      what << "pp" << pp << " ep" << ep << " dp" << dp << kOptimizerVariants[variant] << " on rank "
           << g_world->rank();
      for (int step = 0; step < 3; ++step) {
        const StepResult r = trainer.step();
        EXPECT_NEAR(r.loss, want[step].loss, 1e-9 * std::abs(want[step].loss)) << what.str();
        EXPECT_NEAR(r.grad_norm, want[step].grad_norm, 1e-9 * want[step].grad_norm)
            << what.str() << " step " << step + 1;
      }
      int tables = 0;
      for (StageRuntime& s : trainer.stages()) {  // finishes a deferred update
        for (const auto& e : s.params->entries()) {
          EXPECT_LT(rel_diff(s.params->param(e), reference_param(reference, e.name)), 1e-9)
              << what.str() << ": " << e.name;
          tables += e.name == "model.embed_tokens.weight";
        }
      }
      // One tensor on one stage; the table and its copy on the two ends of a pipeline.
      EXPECT_EQ(tables, 1) << what.str();
      std::string first;
      for (const std::string& table : tied_tables(trainer)) {
        if (table.empty()) continue;
        if (first.empty()) first = table;
        EXPECT_TRUE(table == first) << what.str() << ": the copies of the table differ";
      }
    }
  });
  EXPECT_GT(ran, 0);
}

}  // namespace
}  // namespace tandem::runtime
