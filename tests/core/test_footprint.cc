// Node workspace and the fused LM head's blocks (core/footprint.h). Oracles: the block rule
// worked out by hand (1.25 GiB of bf16 logits, at most 8192 rows, blocks as even as possible) and
// the work tensors of src/model/*.cc summed by hand for one shape.
#include <gtest/gtest.h>

#include "core/footprint.h"

namespace tandem {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(LmHeadBlocks, RowsFollowTheBudget) {
  // 1280 MiB / (50304 * 2) = 13340 rows, so the row cap of 8192 decides: 8192 rows in one
  // block, 32768 in 4 blocks of 8192, 10000 in 2 of 5000.
  EXPECT_EQ(lm_head_block_rows(8192, 50304), 8192);
  EXPECT_EQ(lm_head_block_rows(32768, 50304), 8192);
  EXPECT_EQ(lm_head_block_rows(10000, 50304), 5000);
  // 1280 MiB / (151936 * 2) = 4416 rows at most (Qwen3's vocabulary): 4096 rows in one block,
  // 8192 in 2 of 4096, 5000 in 2 of 2500.
  EXPECT_EQ(lm_head_block_rows(4096, 151936), 4096);
  EXPECT_EQ(lm_head_block_rows(8192, 151936), 4096);
  EXPECT_EQ(lm_head_block_rows(5000, 151936), 2500);
  // A small vocabulary hits the row cap: 100000 rows in 13 blocks of 7693.
  EXPECT_EQ(lm_head_block_rows(100000, 8), 7693);
  EXPECT_EQ(lm_head_block_rows(100, 32000), 100);  // one block
  // A row larger than the budget still gets a block of one row.
  EXPECT_EQ(lm_head_block_rows(3, kLmHeadMaxBlockBytes), 1);
  EXPECT_EQ(lm_head_block_rows(0, 32000), 1);
  EXPECT_EQ(lm_head_padded_vocab(32000), 32000);
  EXPECT_EQ(lm_head_padded_vocab(32001), 32008);
  EXPECT_EQ(lm_head_padded_vocab(50257), 50264);
}

// The shape measured on 2 H200s (docs/schedules.md): N = 4096 tokens, bf16, 8 experts top-2.
ModelConfig measured_model() {
  return {.vocab_size = 32000,
          .hidden_size = 1024,
          .num_layers = 8,
          .num_attention_heads = 16,
          .num_query_groups = 8,
          .ffn_hidden_size = 2816,
          .num_experts = 8,
          .moe_router_topk = 2,
          .seq_length = 2048};
}

FootprintShape gpu_shape(const ModelConfig& c) {
  FootprintShape s = single_rank_shape(c, 2, 2);
  s.stat_bytes = 4;
  s.fused_lm_head = true;
  return s;
}

// The CPU layout runs the same nodes' code with the unfused LM head and CPU ops whose own scratch
// is not the allocator's: each node's figures are the GPU layout's at f32 but for the loss
// node (by hand: no forward temporaries, its logits being saved; d_nf and d_x [N,H] in the
// backward) and the GPU attention op's f32 buffers, which the CPU's attention has not.
TEST(NodeWorkspace, CpuLayoutIsTheGpusAtF32ButTheLossAndTheAttentionOp) {
  const ModelConfig c = measured_model();
  const FootprintShape cpu = single_rank_shape(c, 2, 4);
  FootprintShape gpu32 = cpu;
  gpu32.fused_lm_head = true;
  const int64_t n = 2 * 2048, h = 1024;
  for (int k = 0; k < kNumNodeKinds; ++k) {
    const auto kind = static_cast<NodeKind>(k);
    const NodeWorkspace w = node_workspace_bytes(kind, c, cpu);
    const NodeWorkspace g = node_workspace_bytes(kind, c, gpu32);
    SCOPED_TRACE(std::string(node_kind_name(kind)));
    if (kind == NodeKind::kLoss) {
      EXPECT_EQ(w.forward, 0);
      EXPECT_EQ(w.backward_input, 2 * n * h * 4);
      EXPECT_EQ(w.backward_weight, 0);
      EXPECT_EQ(w.incoming_grad, 0);
      continue;
    }
    EXPECT_EQ(w.forward, g.forward);
    EXPECT_EQ(w.backward_weight, g.backward_weight);
    EXPECT_EQ(w.incoming_grad, g.incoming_grad);
    if (kind == NodeKind::kAttention) {
      EXPECT_LT(w.backward_input, g.backward_input);  // the op's delta and partial dk, dv
    } else {
      EXPECT_EQ(w.backward_input, g.backward_input);
    }
  }
}

TEST(NodeWorkspace, MeasuredShapeByHand) {
  const ModelConfig c = measured_model();
  const FootprintShape s = gpu_shape(c);
  // [N,H] bf16 = 8 MiB, [R,H] = 16 MiB (R = N k = 8192), [R,F] = 44 MiB.
  const int64_t nh = 8 * kMiB, rh = 16 * kMiB, rf = 44 * kMiB, topk_w = 4096 * 2 * 4;
  const NodeWorkspace loss = node_workspace_bytes(NodeKind::kLoss, c, s);
  // Block 4096 x 32000 bf16 (250 MiB), nf, and targets, lse, row losses [N] 4 bytes each.
  EXPECT_EQ(loss.forward, int64_t{4096} * 32000 * 2 + nh + 3 * 4096 * 4);
  EXPECT_EQ(loss.backward_input, nh);  // d_x
  EXPECT_EQ(loss.backward_weight, 0);
  const NodeWorkspace ex = node_workspace_bytes(NodeKind::kExperts, c, s);
  EXPECT_EQ(ex.forward, rh);                                     // expert_out
  EXPECT_EQ(ex.backward_input, nh + topk_w + rh + 3 * rf + rh);  // d_out, d_topk_w, d_y, ...
  EXPECT_EQ(ex.backward_weight, rh + 2 * rf);                    // d_y, d_gate, d_up
  const NodeWorkspace comb = node_workspace_bytes(NodeKind::kCombine, c, s);
  EXPECT_EQ(comb.forward, nh);
  EXPECT_EQ(comb.backward_input, nh + topk_w + rh);  // d_out, d_topk_w, d_y
  EXPECT_EQ(comb.incoming_grad, nh);
  const NodeWorkspace attn = node_workspace_bytes(NodeKind::kAttention, c, s);
  // Held through I: d_n2, d_logits [N,8] bf16, d_h1, d_a, d_q, d_k, d_v (4 MiB each); beside
  // them the op's delta [N*16] f32 (256 KiB: the deterministic backward has no f32 dq
  // workspace) and, split in two (2 x 8 x 32 key tiles = 512 blocks), its f32 partial dk and
  // dv, 2 x [N, 8 x 64] each (32 MiB; Note [Attention key split]): more than the end's d_n1 +
  // d_x (16 MiB).
  const int64_t d_logits = 4096 * 8 * 2;
  EXPECT_EQ(attn.backward_input, 4 * nh + 2 * 4 * kMiB + d_logits + 256 * 1024 + 32 * kMiB);
  EXPECT_EQ(attn.backward_weight, d_logits + 2 * nh + 2 * 4 * kMiB);
  EXPECT_EQ(attn.forward, 4096 * 8 * 4 + rh);  // router logits, routed rows
}

// Note [Attention key split]: the least divisor of the group reaching 1,024 blocks of 64 keys.
TEST(AttentionKeySplit, LeastDivisorOfTheGroupFillingTheGpu) {
  EXPECT_EQ(attention_key_split(1, 4096, 4, 8, 128, 128), 4);   // 256 blocks: shape (c)
  EXPECT_EQ(attention_key_split(2, 2048, 8, 2, 64, 64), 2);     // 512 blocks: shape (b)
  EXPECT_EQ(attention_key_split(8, 4096, 8, 2, 64, 64), 1);     // 4,096 blocks already
  EXPECT_EQ(attention_key_split(1, 4096, 16, 1, 192, 128), 1);  // no group to split (MLA)
  EXPECT_EQ(attention_key_split(1, 64, 1, 6, 64, 64), 6);       // few blocks: the whole group
  EXPECT_EQ(attention_key_split(1, 4096, 1, 8, 96, 96), 1);     // the generic kernels' head dim
}

TEST(NodeWorkspace, DenseMlpAndExpertParallelBuffers) {
  ModelConfig dense = measured_model();
  dense.num_experts = 0;
  FootprintShape s = gpu_shape(dense);
  const int64_t nh = 8 * kMiB, nf = 22 * kMiB;
  const NodeWorkspace mlp = node_workspace_bytes(NodeKind::kMlp, dense, s);
  EXPECT_EQ(mlp.backward_input, nh + 3 * nf + nh);  // d_out, d_act, d_gate, d_up, d_n2
  EXPECT_EQ(mlp.backward_weight, nh + 2 * nf);
  EXPECT_EQ(mlp.incoming_grad, nh);
  // EP 2: dispatch's receive buffer beside the received rows, combine's send and receive ones
  // (model/moe_exchange.cc): its forward's send buffer beside out and the received y (saved, so
  // not counted here), its backward's receive buffer and d_expert_out after y is freed.
  const ModelConfig moe = measured_model();
  s = gpu_shape(moe);
  s.ep_size = 2;
  s.local_experts = 4;
  const int64_t rh = 16 * kMiB, topk_w = 4096 * 2 * 4;
  EXPECT_EQ(node_workspace_bytes(NodeKind::kDispatch, moe, s).forward, 2 * rh);
  EXPECT_EQ(node_workspace_bytes(NodeKind::kCombine, moe, s).forward, rh + nh);
  EXPECT_EQ(node_workspace_bytes(NodeKind::kCombine, moe, s).backward_input,
            nh + topk_w + rh + 2 * rh - rh);
}

}  // namespace
}  // namespace tandem
