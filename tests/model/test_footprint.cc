// Each node's saved state against core/footprint.h, byte for byte, and release at last use:
// the activation bytes the allocator counts after a whole forward equal the sum of the
// footprints, every node holds zero bytes once its backward has run, and the loss node's fp32
// logits are freed before the next node's backward starts. Oracle: footprint.h's formulas and the
// allocator's exact statistics.
#include <gtest/gtest.h>

#include "model/chunk.h"
#include "tiny.h"

namespace tandem::model {
namespace {

// kMoeLosses: a z-loss and seq_aux_loss (their statistics kept); kMoePadded and kMoeDropped: an
// expert capacity with and without padding (Note [Expert capacity] in core/footprint.h);
// kDeepseekV3Global: global_aux_loss and a z-loss with a padded capacity on the sigmoid router;
// kMtp*: multi-token prediction modules in the loss node (two, or DeepSeek-V3's one of MoE with
// shared experts).
enum class Model : uint8_t {
  kDense,
  kMoe,
  kQwen3,
  kQwen2,
  kDeepseekV3,
  kDeepseekV3NoQ,
  kMoeLosses,
  kMoePadded,
  kMoeDropped,
  kDeepseekV3Global,
  kMtpDense,
  kMtpMoe,
  kMtpDeepseekV3
};

struct Case {
  Model model;
  DType dtype;
  bool fused = false;  // the loss node through ops::lm_head_ce_* (no logits kept)
  // TrainConfig::recompute: the modules that keep nothing (Note [Recomputed modules] in
  // model/ffn_nodes.cc).
  const char* recompute = "";
};

ModelConfig config_of(Model m) {
  switch (m) {
    case Model::kDense:
      return testing::tiny_config(false);
    case Model::kMoe:
      return testing::tiny_config(true);
    case Model::kQwen3:
      return testing::tiny_qwen3_config();
    case Model::kQwen2:
      return testing::tiny_qwen2_config();
    case Model::kDeepseekV3:
      return testing::tiny_deepseek_v3_config(5);
    case Model::kDeepseekV3NoQ:
      return testing::tiny_deepseek_v3_config(0);
    case Model::kMoeLosses: {
      ModelConfig c = testing::tiny_config(true);
      c.moe_z_loss_coeff = 0.01;
      c.moe_router_load_balancing_type = "seq_aux_loss";
      return c;
    }
    case Model::kMoePadded:
    case Model::kMoeDropped: {
      ModelConfig c = testing::tiny_config(true);
      c.moe_expert_capacity_factor = 0.5;
      c.moe_token_drop_policy = "position";
      c.moe_pad_expert_input_to_capacity = m == Model::kMoePadded;
      return c;
    }
    case Model::kDeepseekV3Global: {
      ModelConfig c = testing::tiny_deepseek_v3_config(5);
      c.moe_router_load_balancing_type = "global_aux_loss";
      c.moe_aux_loss_coeff = 0.01;
      c.moe_z_loss_coeff = 0.01;
      c.moe_expert_capacity_factor = 1;
      c.moe_pad_expert_input_to_capacity = true;
      return c;
    }
    case Model::kMtpDense:
    case Model::kMtpMoe: {
      ModelConfig c = testing::tiny_config(m == Model::kMtpMoe);
      c.mtp_num_layers = 2;
      c.moe_z_loss_coeff = 0.01;
      return c;
    }
    case Model::kMtpDeepseekV3: {
      ModelConfig c = testing::tiny_deepseek_v3_config(5);
      c.mtp_num_layers = 1;
      return c;
    }
  }
  return {};
}

// The footprint shape of a whole-model chunk's node: its layer's kind (dense layers of a MoE
// model save no routing state), and with a capacity but no padding the rows its layer's experts
// received (what the planner takes from measured routing: Note [Measured routing]).
FootprintShape shape_of(const ModelConfig& cfg, FootprintShape shape, const NodeRef& node,
                        const MicroBatchState& mb) {
  if (node.layer < 0) return shape;
  shape.moe_layer = cfg.is_moe_layer(node.layer);
  const Tensor& rows = mb.layers[static_cast<size_t>(node.layer)].experts.x_in;
  if (cfg.has_expert_capacity() && !cfg.moe_pad_expert_input_to_capacity && rows.defined()) {
    shape.expert_rows = rows.size(0);
  }
  return shape;
}

class FootprintTest : public ::testing::TestWithParam<Case> {};

TEST_P(FootprintTest, SavedBytesMatchFormulaAndAreReleased) {
  const ModelConfig cfg = config_of(GetParam().model);
  const DType dt = GetParam().dtype;
  const int64_t batch = 3, n = batch * cfg.seq_length;
  Parameters params(cfg, ChunkSpec::whole(cfg), dt);
  params.initialize(1);
  ModelChunk chunk(params);
  FootprintShape shape = single_rank_shape(cfg, batch, dtype_size(dt));
  shape.fused_lm_head = GetParam().fused;
  shape.recompute = parse_recompute(GetParam().recompute);
  Allocator& alloc = cpu_allocator();
  const int64_t base = alloc.stats().in_use_of(MemCategory::kActivation);

  MicroBatchState mb;
  mb.ids = testing::random_ids(n, cfg.vocab_size, 3);
  mb.targets = testing::random_ids(n, cfg.vocab_size, 4);
  NodeContext c = chunk.context(batch, 1.0);
  c.fused_lm_head = GetParam().fused;
  c.recompute = shape.recompute;
  int64_t expected_total = 0;
  for (size_t i = 0; i < chunk.nodes().size(); ++i) {
    chunk.forward_node(i, mb, c);
    expected_total +=
        node_saved_bytes(chunk.nodes()[i].kind, cfg, shape_of(cfg, shape, chunk.nodes()[i], mb));
  }
  // After the whole forward every node holds exactly its footprint...
  for (size_t i = 0; i < chunk.nodes().size(); ++i) {
    EXPECT_EQ(
        chunk.node_saved_bytes_live(i, mb),
        node_saved_bytes(chunk.nodes()[i].kind, cfg, shape_of(cfg, shape, chunk.nodes()[i], mb)))
        << node_kind_name(chunk.nodes()[i].kind) << " of layer " << chunk.nodes()[i].layer;
  }
  // ...and the allocator holds nothing else as activations.
  EXPECT_EQ(alloc.stats().in_use_of(MemCategory::kActivation) - base, expected_total);

  int64_t released = 0;
  for (size_t i = chunk.nodes().size(); i-- > 0;) {
    const int64_t held = chunk.node_saved_bytes_live(i, mb);
    chunk.backward_node(i, mb, c);
    chunk.backward_weights_node(i, mb, c);
    released += held;
    EXPECT_EQ(chunk.node_saved_bytes_live(i, mb), 0) << node_kind_name(chunk.nodes()[i].kind);
    EXPECT_EQ(alloc.stats().in_use_of(MemCategory::kActivation) - base, expected_total - released)
        << "after the backward of " << node_kind_name(chunk.nodes()[i].kind);
  }
  EXPECT_EQ(alloc.stats().in_use_of(MemCategory::kActivation), base);
}

TEST_P(FootprintTest, InputBackwardKeepsExactlyWhatTheWeightGradientNeeds) {
  const ModelConfig cfg = config_of(GetParam().model);
  const DType dt = GetParam().dtype;
  const int64_t batch = 2, n = batch * cfg.seq_length;
  Parameters params(cfg, ChunkSpec::whole(cfg), dt);
  params.initialize(1);
  ModelChunk chunk(params);
  FootprintShape shape = single_rank_shape(cfg, batch, dtype_size(dt));
  shape.fused_lm_head = GetParam().fused;
  shape.recompute = parse_recompute(GetParam().recompute);
  MicroBatchState mb;
  mb.ids = testing::random_ids(n, cfg.vocab_size, 3);
  mb.targets = testing::random_ids(n, cfg.vocab_size, 4);
  NodeContext c = chunk.context(batch, 1.0);
  c.fused_lm_head = GetParam().fused;
  c.recompute = shape.recompute;
  chunk.forward(mb, c);
  chunk.backward(mb, c, WeightGrad::kDeferred);  // every node's I, no W yet
  for (size_t i = 0; i < chunk.nodes().size(); ++i) {
    EXPECT_EQ(chunk.node_saved_bytes_live(i, mb),
              node_weight_saved_bytes(chunk.nodes()[i].kind, cfg,
                                      shape_of(cfg, shape, chunk.nodes()[i], mb)))
        << node_kind_name(chunk.nodes()[i].kind) << " of layer " << chunk.nodes()[i].layer;
  }
  chunk.backward_weights(mb, c);
  for (size_t i = 0; i < chunk.nodes().size(); ++i)
    EXPECT_EQ(chunk.node_saved_bytes_live(i, mb), 0);
}

INSTANTIATE_TEST_SUITE_P(
    All, FootprintTest,
    ::testing::Values(
        Case{Model::kDense, DType::kF32}, Case{Model::kMoe, DType::kF32},
        Case{Model::kMoe, DType::kF64}, Case{Model::kDense, DType::kF32, true},
        Case{Model::kMoe, DType::kF64, true}, Case{Model::kQwen3, DType::kF32},
        Case{Model::kQwen3, DType::kF64, true}, Case{Model::kQwen2, DType::kF32},
        Case{Model::kQwen2, DType::kF64, true}, Case{Model::kDeepseekV3, DType::kF32},
        Case{Model::kDeepseekV3, DType::kF64}, Case{Model::kDeepseekV3NoQ, DType::kF32},
        Case{Model::kMoeLosses, DType::kF32}, Case{Model::kMoePadded, DType::kF32},
        Case{Model::kMoeDropped, DType::kF64}, Case{Model::kMoeDropped, DType::kF32, true},
        Case{Model::kDeepseekV3Global, DType::kF32}, Case{Model::kMtpDense, DType::kF32},
        Case{Model::kMtpDense, DType::kF32, true}, Case{Model::kMtpMoe, DType::kF64},
        Case{Model::kMtpMoe, DType::kF32, true}, Case{Model::kMtpDeepseekV3, DType::kF32},
        Case{Model::kMtpDeepseekV3, DType::kF64, true},
        Case{Model::kDense, DType::kF32, false, "mlp"},
        Case{Model::kQwen2, DType::kF64, false, "shared_experts"},
        Case{Model::kDeepseekV3, DType::kF32, true, "mlp,shared_experts"},
        Case{Model::kMtpDeepseekV3, DType::kF64, false, "mlp,shared_experts"}));

TEST(LossNode, LogitsFreedRightAfterLossBackward) {
  const ModelConfig cfg = testing::tiny_config(true);
  const int64_t batch = 2, n = batch * cfg.seq_length;
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF32);
  params.initialize(1);
  ModelChunk chunk(params);
  MicroBatchState mb;
  mb.ids = testing::random_ids(n, cfg.vocab_size, 3);
  mb.targets = testing::random_ids(n, cfg.vocab_size, 4);
  const NodeContext c = chunk.context(batch, 1.0);
  chunk.forward(mb, c);
  const size_t loss = chunk.nodes().size() - 1;
  ASSERT_EQ(chunk.nodes()[loss].kind, NodeKind::kLoss);
  Tensor logits = mb.loss.logits;  // a second view must not keep the storage alive
  EXPECT_GT(chunk.node_saved_bytes_live(loss, mb), n * cfg.vocab_size * 4);
  chunk.backward_node(loss, mb, c);
  chunk.backward_weights_node(loss, mb, c);
  EXPECT_EQ(chunk.node_saved_bytes_live(loss, mb), 0);
  EXPECT_TRUE(logits.released());
  EXPECT_THROW(logits.data<float>(), Error);
}

TEST(Release, InputOnlyStateGoesAtBackwardWeightStateAtWeightBackward) {
  const ModelConfig cfg = testing::tiny_config(false);
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF32);
  params.initialize(1);
  ModelChunk chunk(params);
  MicroBatchState mb;
  mb.ids = testing::random_ids(5, cfg.vocab_size, 3);
  mb.targets = testing::random_ids(5, cfg.vocab_size, 4);
  const NodeContext c = chunk.context(1, 1.0);
  chunk.forward(mb, c);
  const size_t loss = chunk.nodes().size() - 1;
  chunk.backward_node(loss, mb, c);
  // The loss input is dead after the input gradient; reading it is a checked error.
  EXPECT_TRUE(mb.loss.x.released());
  EXPECT_THROW(mb.loss.x.data<float>(), Error);
  // The normalised input stays until the LM head's weight gradient has been taken.
  EXPECT_FALSE(mb.loss.nf.released());
  chunk.backward_weights_node(loss, mb, c);
  EXPECT_FALSE(mb.loss.nf.defined());
}

}  // namespace
}  // namespace tandem::model
