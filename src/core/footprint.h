// What each schedule node saves for its backward, in bytes, as a function of the config: the one
// table that the model's nodes (checked in tests/model) and the planner (src/schedule) share, so
// the planned and the measured activation memory agree byte for byte.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/config.h"

namespace tandem {

// The schedule nodes of DESIGN.md. A MoE layer is attention, dispatch, experts, combine; a dense
// layer is attention, mlp. embed opens the first stage, loss closes the last.
enum class NodeKind : uint8_t { kEmbed, kAttention, kDispatch, kExperts, kCombine, kMlp, kLoss };
constexpr int kNumNodeKinds = 7;
std::string_view node_kind_name(NodeKind kind);

struct FootprintShape {
  int64_t tokens = 0;       // N: tokens of one micro-batch on this rank (micro_batch * seq)
  int64_t expert_rows = 0;  // rows the local experts receive (N * k when EP = 1)
  int64_t local_experts = 0;
  int64_t ep_size = 1;      // expert-parallel ranks
  int64_t elem_bytes = 4;   // activation element size (4 for f32, 8 for f64, 2 for bf16)
  int64_t stat_bytes = 0;   // statistics' element size (norm rstd, attention lse, router
                            // probabilities and weights); 0: the same as elem_bytes. The GPU
                            // keeps bf16 activations and f32 statistics (docs/cuda.md).
  bool fused_lm_head = false;  // the loss node runs ops::lm_head_ce_forward_backward (the
                               // GPU's loss node, gradients formed in the forward)
  int64_t stat_size() const { return stat_bytes > 0 ? stat_bytes : elem_bytes; }
};

// The shape of one micro-batch with EP = 1 (every routed row stays local).
FootprintShape single_rank_shape(const ModelConfig& cfg, int64_t micro_batch_size,
                                 int64_t elem_bytes);

// Bytes a node holds from the end of its forward until its backward (and weight backward) ran.
//  embed:     ids i32 [N]
//  attention: x, n1, h1, n2 [N,H]; q, a [N,heads*D]; k, v [N,kv*D]; statistics rstd1,
//             rstd2 [N], lse [N*heads]; MoE adds statistics probs [N,E], topk_w [N,k], and
//             topk_idx i32 [N,k], counts i32 [E], perm i32 [N*k]
//  dispatch:  EP > 1: recv_counts i32 [EP * local E] (the rows it receives are the experts')
//  experts:   x_in [R,H]; gate, up, act [R,F]; rows_per_expert i32 [local E]
//  combine:   y [N*k,H] (expert outputs in expert-sorted order, for the routing-weight gradient)
//  mlp:       gate, up, act [N,F]
//  loss:      x, nf [N,H]; rstd [N]; logits [N,V]; targets i32 [N]
//             fused LM head (training): x, d_nf [N,H]; statistic rstd [N] (the gradient is
//             formed in the forward)
int64_t node_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& shape);

// Of those, the bytes a node still holds after its input-gradient backward when the weight
// gradient is deferred (W-split schedules); the rest is freed at that backward.
//  embed: ids; attention: n1, n2 [N,H], a [N,heads*D]; experts: x_in [R,H], act [R,F],
//  rows_per_expert; mlp: act [N,F]; loss: nf [N,H], logits [N,V] (holding dlogits);
//  dispatch, combine: nothing.
int64_t node_weight_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& shape);

}  // namespace tandem
