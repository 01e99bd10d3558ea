// Whole-model gradients of a tiny dense and a tiny MoE model of every family, every parameter
// tensor, against fp64 central finite differences of the loss (lm loss + aux losses) computed by
// the same forward (grad_check.h; Megatron-LM's routing options: test_routing_grad.cc). Oracle:
// finite differences; routing is piecewise constant, so the perturbation is kept far below the
// smallest gap between router logits of the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "grad_check.h"
#include "model/chunk.h"
#include "tiny.h"

namespace tandem::model {
namespace {

TEST(ModelGradient, DenseMatchesFiniteDifferences) { check_gradients(testing::tiny_config(false)); }
TEST(ModelGradient, MoeMatchesFiniteDifferences) { check_gradients(testing::tiny_config(true)); }
// Note [Tied embeddings]: one table for the lookup and the LM head, its gradient both uses'
// (finite differences move the one tensor both read), with the CPU's head and the fused one.
TEST(ModelGradient, TiedEmbeddingsMatchFiniteDifferences) {
  check_gradients(testing::tied_config(testing::tiny_config(false)));
  check_gradients(testing::tied_config(testing::tiny_config(true)));
  check_gradients(testing::tied_config(testing::tiny_config(true)), true);
}
TEST(ModelGradient, FusedLmHeadMatchesFiniteDifferences) {
  check_gradients(testing::tiny_config(true), true);
}
// q/k norms, an independent head dim, narrower experts, pre-softmax routing, a dense layer. The
// norms of heads of 10x weights curve the loss sharply: a step of 1e-7 keeps the difference's
// truncation error within the tolerance (at 1e-6 it reaches 7e-6 relative on a k_proj weight).
TEST(ModelGradient, Qwen3MoeMatchesFiniteDifferences) {
  check_gradients(testing::tiny_qwen3_config(), false, 1e-7);
  check_gradients(testing::tiny_qwen3_config(), true, 1e-7);
}
// q/k/v biases and a gated shared expert.
TEST(ModelGradient, Qwen2MoeMatchesFiniteDifferences) {
  check_gradients(testing::tiny_qwen2_config());
  check_gradients(testing::tiny_qwen2_config(), true);
}

// Multi-head latent attention with and without q's latent, the sigmoid router with its expert
// bias, groups, scaling and normalised weights (and one expert's, which Megatron-LM leaves
// unnormalised), shared experts without a gate.
// The latents' norms of 10x weights curve the loss as the q/k norms do: a step of 3e-8 keeps
// the truncation error within the tolerance (at 1e-7 it reaches 1.2e-6 relative on an embedding).
TEST(ModelGradient, DeepseekV3MatchesFiniteDifferences) {
  check_gradients(testing::tiny_deepseek_v3_config(5), false, 3e-8);
  check_gradients(testing::tiny_deepseek_v3_config(0), false, 3e-8);
  ModelConfig top1 = testing::tiny_deepseek_v3_config(5);
  top1.moe_router_topk = 1;
  check_gradients(top1, false, 3e-8);
}
// DeepSeek-V3's sequence-wise aux loss, weighted high enough to matter.
TEST(ModelGradient, DeepseekV3WithSequenceAuxLossMatchesFiniteDifferences) {
  ModelConfig c = testing::tiny_deepseek_v3_config(5);
  c.moe_router_load_balancing_type = "seq_aux_loss";
  c.moe_aux_loss_coeff = 0.5;
  check_gradients(c, false, 3e-8);
}
TEST(ModelGradient, DeepseekV3WithYarnMatchesFiniteDifferences) {
  ModelConfig c = testing::tiny_deepseek_v3_config(5);
  c.rope_type = "yarn";
  c.rotary_scaling_factor = 4;
  c.rope_original_max_position = 2;
  c.yarn_mscale = 1;
  c.yarn_mscale_all_dim = 0.7;
  check_gradients(c, false, 1e-7);
}

TEST(ModelGradient, ForwardIsDeterministic) {
  const ModelConfig cfg = testing::tiny_config(true);
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF32);
  params.initialize(3);
  ModelChunk chunk(params);
  const Tensor ids = testing::random_ids(10, cfg.vocab_size, 5);
  const Tensor targets = testing::random_ids(10, cfg.vocab_size, 6);
  const double a = run_loss(chunk, ids, targets, 2, false);
  const double b = run_loss(chunk, ids, targets, 2, false);
  EXPECT_EQ(a, b);
  EXPECT_GT(a, 0.5 * std::log(11.0));
}

TEST(Parameters, ChunkInitialisationMatchesWholeModel) {
  const ModelConfig cfg = testing::tiny_config(true);
  Parameters whole(cfg, ChunkSpec::whole(cfg), DType::kF32);
  whole.initialize(11);
  ChunkSpec part{1, 2, false, true, 2, 4, {}};
  Parameters chunk(cfg, part, DType::kF32);
  chunk.initialize(11);
  const Tensor a = whole.weights().layers[1].e_down[3];  // expert 3 of layer 1
  const Tensor b = chunk.weights().layers[0].e_down[1];
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.data<float>()[i], b.data<float>()[i]);
  EXPECT_EQ(whole.weights().layers[0].input_norm.data<float>()[0], 1.0f);
}

// Note [Expert placement]: a chunk's places hold the experts the placement names, initialised
// as the whole model's experts of those ids, and named by them.
TEST(Parameters, PlacedExpertsAreTheWholeModelsExpertsOfThoseIds) {
  const ModelConfig cfg = testing::tiny_config(true);
  Parameters whole(cfg, ChunkSpec::whole(cfg), DType::kF32);
  whole.initialize(11);
  ChunkSpec part{1, 2, false, true, 2, 4, {}};
  part.placement.layers = {{}, {3, 0, 2, 1}};  // layer 1: places 2, 3 hold experts 2, 1
  Parameters chunk(cfg, part, DType::kF32);
  chunk.initialize(11);
  for (const auto& [place, expert] : {std::pair{0, 2}, std::pair{1, 1}}) {
    const Tensor a = whole.weights().layers[1].e_gate_up[expert];
    const Tensor b = chunk.weights().layers[0].e_gate_up[place];
    ASSERT_EQ(a.numel(), b.numel());
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]);
  }
  bool named = false;
  for (const ParamEntry& e : chunk.entries()) {
    named = named || e.name == "model.layers.1.block_sparse_moe.experts.1.w2.weight";
    EXPECT_EQ(e.name.find("experts.0."), std::string::npos) << e.name;
  }
  EXPECT_TRUE(named);
  // Each expert's place, for the attention node's sort.
  const Tensor slot = chunk.weights().layers[0].expert_slot;
  ASSERT_TRUE(slot.defined());
  EXPECT_EQ(std::vector<int32_t>(slot.data<int32_t>(), slot.data<int32_t>() + 4),
            (std::vector<int32_t>{1, 3, 2, 0}));
  EXPECT_FALSE(whole.weights().layers[1].expert_slot.defined());
}

TEST(Parameters, SetPlacementRenamesTheExpertsInPlace) {
  const ModelConfig cfg = testing::tiny_config(true);
  Parameters p(cfg, ChunkSpec::whole(cfg), DType::kF32);
  const std::vector<ParamEntry> before = p.entries();
  p.set_placement(ExpertPlacement{{{1, 0, 3, 2}}});
  ASSERT_EQ(p.entries().size(), before.size());
  int renamed = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(p.entries()[i].offset, before[i].offset);
    renamed += p.entries()[i].name != before[i].name;
  }
  EXPECT_EQ(renamed, 4 * 3);  // layer 0's four experts, three matrices each
  EXPECT_TRUE(p.weights().layers[0].expert_slot.defined());
  EXPECT_FALSE(p.weights().layers[1].expert_slot.defined() &&
               p.weights().layers[1].expert_slot.data<int32_t>()[0] != 0);
}

TEST(Parameters, BadPlacementIsRefusedNamingIt) {
  const ModelConfig cfg = testing::tiny_config(true);
  ChunkSpec spec = ChunkSpec::whole(cfg);
  spec.placement.layers = {{0, 1, 1, 3}};
  try {
    Parameters p(cfg, spec, DType::kF32);
    FAIL() << "a placement with expert 1 twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 holds expert 1"), std::string::npos) << e.what();
  }
  spec.placement.layers = {{0, 1, 2}};
  EXPECT_THROW(Parameters(cfg, spec, DType::kF32), Error);
}

// Note [Expert placement]: the loss and every gradient, by name, are bitwise those of the
// contiguous layout when the experts sit at other places (one rank: the places only reorder the
// sort and the experts' runs).
TEST(Parameters, PlacementChangesNoResultBitwise) {
  const ModelConfig cfg = testing::tiny_config(true);
  const int64_t batch = 2, n = batch * cfg.seq_length;
  const Tensor ids = testing::random_ids(n, cfg.vocab_size, 1);
  const Tensor targets = testing::random_ids(n, cfg.vocab_size, 2);
  auto run = [&](const ExpertPlacement& placement, double* loss) {
    ChunkSpec spec = ChunkSpec::whole(cfg);
    spec.placement = placement;
    auto params = std::make_unique<Parameters>(cfg, spec, DType::kF64);
    params->initialize(7);
    for (int64_t i = 0; i < params->numel(); ++i) params->flat_params().data<double>()[i] *= 10.0;
    ModelChunk chunk(*params);
    MicroBatchState mb;
    *loss = run_loss(chunk, ids, targets, batch, false, &mb);
    chunk.backward(mb, context_of(chunk, batch, false));
    std::map<std::string, std::vector<double>> grads;
    for (const ParamEntry& e : params->entries()) {
      const Tensor g = params->grad(e);
      grads[e.name].assign(g.data<double>(), g.data<double>() + g.numel());
    }
    return grads;
  };
  double a = 0, b = 0;
  const auto contiguous = run(ExpertPlacement{}, &a);
  const auto placed = run(ExpertPlacement{{{2, 3, 1, 0}, {3, 1, 0, 2}}}, &b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(contiguous, placed);
}

// Note [Expert gradients written first]: zero_grads_for_backward leaves the experts' gradients
// as they were (here garbage, NaN among it) and the first weight-gradient pass of each MoE layer
// writes them; after two micro-batches (the second adding) every gradient is bitwise the one
// accumulated from zero_grads' zeros. The first micro-batch of one token routes to 2 of 8
// experts, so experts without rows are zeroed by that first pass; dense and MoE layers mixed
// (Qwen3-MoE options with a dense first layer).
TEST(Parameters, ExpertGradientsWrittenFirstEqualAddedToZeros) {
  ModelConfig cfg = testing::tiny_qwen3_config();
  cfg.num_experts = 8;
  const auto run = [&](bool written_first) {
    Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF64);
    params.initialize(5);
    for (int64_t i = 0; i < params.numel(); ++i) params.flat_params().data<double>()[i] *= 10.0;
    double* g = params.flat_grads().data<double>();
    for (int64_t i = 0; i < params.numel(); ++i) g[i] = i % 7 == 0 ? std::nan("") : 3.0 + i;
    if (written_first) {
      params.zero_grads_for_backward();
    } else {
      params.zero_grads();
    }
    ModelChunk chunk(params);
    for (const int64_t tokens : {int64_t{1}, cfg.seq_length}) {
      const Tensor ids = testing::random_ids(tokens, cfg.vocab_size, 10 + tokens);
      const Tensor targets = testing::random_ids(tokens, cfg.vocab_size, 20 + tokens);
      MicroBatchState mb;
      mb.ids = ids;
      mb.targets = targets;
      NodeContext c = chunk.context(1, 1.0);
      c.seq = tokens;
      chunk.forward(mb, c);
      chunk.backward(mb, c);
    }
    return std::vector<double>(g, g + params.numel());
  };
  const std::vector<double> want = run(false), got = run(true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(std::isnan(want[i])) << "element " << i;
    ASSERT_EQ(got[i], want[i]) << "element " << i;
  }
}

// A deferred update's pieces zero the gradients but for the local experts'
// (Note [Deferred update] in runtime/optimizer.cc): zero_grads_outside_experts over pieces that
// cut through entries zeroes exactly the elements of the range outside every expert entry.
TEST(Parameters, ZeroGradsOutsideExpertsZeroesExactlyTheRestOfTheRange) {
  ModelConfig cfg = testing::tiny_qwen3_config();
  cfg.num_experts = 8;
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF64);
  const int64_t n = params.numel();
  std::vector<bool> expert(static_cast<size_t>(n), false);
  for (const ParamEntry& e : params.entries()) {
    if (e.shard != ParamShard::kExpert) continue;
    for (int64_t i = e.offset; i < e.offset + shape_numel(e.shape); ++i) expert[size_t(i)] = true;
  }
  ASSERT_GT(std::count(expert.begin(), expert.end(), true), 0);
  double* g = params.flat_grads().data<double>();
  std::fill(g, g + n, 1.0);
  const int64_t from = n / 5, to = n - n / 7;  // a range that starts and ends inside entries
  for (int64_t at = from; at < to; at += 997)
    params.zero_grads_outside_experts(at, std::min(at + 997, to));
  for (int64_t i = 0; i < n; ++i) {
    const bool zeroed = i >= from && i < to && !expert[size_t(i)];
    ASSERT_EQ(g[i], zeroed ? 0.0 : 1.0) << "element " << i;
  }
}

}  // namespace
}  // namespace tandem::model
