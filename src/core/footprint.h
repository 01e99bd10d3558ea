// What each schedule node saves for its backward, in bytes, as a function of the config: the one
// table that the model's nodes (checked in tests/model) and the planner (src/schedule) share, so
// the planned and the measured activation memory agree byte for byte.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/config.h"

namespace tandem {

// The schedule nodes (docs/design.md "Nodes"). A MoE layer is attention, dispatch, experts,
// combine; a dense layer is attention, mlp. embed opens the first stage, loss closes the last.
enum class NodeKind : uint8_t {
  kEmbed,
  kAttention,
  kDispatch,
  kExperts,
  kCombine,
  kMlp,
  kLoss,
  kSharedExpert,  // MoE layers with a shared expert: between dispatch and experts
};
constexpr int kNumNodeKinds = 8;
// The names the node-times file and the plan's outputs use.
inline constexpr EnumName<NodeKind> kNodeKindNames[] = {
    {NodeKind::kEmbed, "embed"},       {NodeKind::kAttention, "attention"},
    {NodeKind::kDispatch, "dispatch"}, {NodeKind::kExperts, "experts"},
    {NodeKind::kCombine, "combine"},   {NodeKind::kMlp, "mlp"},
    {NodeKind::kLoss, "loss"},         {NodeKind::kSharedExpert, "shared_expert"}};
static_assert(std::size(kNodeKindNames) == kNumNodeKinds);
constexpr std::span<const EnumName<NodeKind>> enum_names(NodeKind) { return kNodeKindNames; }
std::string_view node_kind_name(NodeKind kind);

// Note [Activation offload] (runtime/activation_offload.h): the node kinds whose saved tensors
// --offload-activations may keep in host memory, by the names it takes.
struct OffloadKind {
  NodeKind kind;
  const char* name;
};
const std::vector<OffloadKind>& offload_kinds();
// The kinds `text` names (comma-separated, e.g. "attention,experts"; empty: none) as bits
// 1 << NodeKind. Throws tandem::Error naming a name that is not a kind, or a kind `cfg` does not
// have (experts without experts, mlp without a dense layer, shared-expert without a shared
// expert): offloading nothing there would leave the memory the user asked to save.
uint32_t parse_offload_kinds(std::string_view text, const ModelConfig& cfg);
// Why `cfg` has no node of that offloadable kind ("--num-experts 0", ...); null when it has one.
const char* offload_kind_absent(NodeKind kind, const ModelConfig& cfg);
inline bool offloads(uint32_t kinds, NodeKind kind) {
  return (kinds & (1u << static_cast<unsigned>(kind))) != 0;
}

// Note [Recomputed modules] (model/ffn_nodes.cc): the modules --recompute names, by Megatron-LM's
// names (its --recompute-modules), each keeping only its input from forward to backward.
enum class Recompute : uint8_t { kMlp, kSharedExperts };
// The bits 1 << Recompute of `text`, a comma-separated list of mlp, shared_experts (empty: 0).
// Throws tandem::Error naming a word that is not one of them.
uint32_t parse_recompute(std::string_view text);
inline bool recomputes(uint32_t bits, Recompute module) {
  return (bits & (1u << static_cast<unsigned>(module))) != 0;
}

// Note [Expert capacity]: with --moe-expert-capacity-factor f each expert takes at most
// C = ceil((N k / E) f) of the N k rows a rank's micro-batch routes (Megatron-LM's get_capacity,
// in double as it computes it); the router's choice is unchanged and the rows past C are dropped
// before the all-to-all (a dropped row's routing weight counts as 0). The rows a rank sends,
// the slots S of the attention node's permutation: N k (dropless, or dropping without padding:
// the dropped rows are left unsent at the end), or C E with
// --moe-pad-expert-input-to-capacity, every expert's block then C rows, zeros after its own.
// So with padding every size is known before the step (each local expert receives C x EP
// rows); without it the rows the experts receive depend on the routing, with EP = 1 too
// (Note [Measured routing] in schedule/routing_file.h).
int64_t moe_expert_capacity(const ModelConfig& cfg, int64_t tokens);  // 0: dropless
int64_t moe_routed_rows(const ModelConfig& cfg, int64_t tokens);      // S

struct FootprintShape {
  int64_t tokens = 0;       // N: tokens of one micro-batch on this rank (micro_batch * seq)
  int64_t expert_rows = 0;  // R: rows the local experts receive (N * k when EP = 1, dropless)
  // S: the slots the router's permutation and the rows sent (moe_routed_rows); 0: N * k.
  int64_t routed_rows = 0;
  int64_t local_experts = 0;
  int64_t ep_size = 1;             // expert-parallel ranks
  int64_t elem_bytes = 4;          // activation element size (4 for f32, 8 for f64, 2 for bf16)
  int64_t stat_bytes = 0;          // statistics' element size (norm rstd, attention lse, router
                                   // probabilities and weights); 0: the same as elem_bytes. The GPU
                                   // keeps bf16 activations and f32 statistics (docs/cuda.md).
  bool fused_lm_head = false;      // the loss node runs ops::lm_head_ce_forward_backward (the
                                   // GPU's loss node, gradients formed in the forward)
  bool recompute_experts = false;  // TrainConfig::recompute_experts: experts keep x_in only
  uint32_t recompute = 0;          // parse_recompute(TrainConfig::recompute)'s bits
  // The node's layer is a MoE layer (ModelConfig::is_moe_layer): its attention saves the
  // router's state. Dense layers of a MoE model set it false.
  bool moe_layer = true;
  // --eod-mask-loss: the MTP modules' head takes each depth's rolled loss mask, an f32 [Nv]
  // temporary (Note [MTP loss mask] in model/mtp.cc).
  bool loss_mask = false;
  int64_t stat_size() const { return stat_bytes > 0 ? stat_bytes : elem_bytes; }
  int64_t routed(int64_t k) const { return routed_rows > 0 ? routed_rows : tokens * k; }
};

// The shape of one micro-batch with EP = 1 (every routed row stays local).
FootprintShape single_rank_shape(const ModelConfig& cfg, int64_t micro_batch_size,
                                 int64_t elem_bytes);

// Bytes a node holds from the end of its forward until its backward (and weight backward) ran.
//  embed:     ids i32 [N]
//  attention: x, n1, h1, n2 [N,H]; q, a [N,heads*D]; k, v [N,kv*D]; statistics rstd1,
//             rstd2 [N], lse [N*heads]; --qk-layernorm adds q_raw [N,heads*D], k_raw [N,kv*D],
//             statistics rstd_q [N*heads], rstd_k [N*kv]; --multi-latent-attention instead:
//             x, n1, h1, n2 [N,H]; q, k [N,heads*(dn+dr)]; v, a [N,heads*dv]; q's latent and
//             its norm [N,rq] each (q_lora_rank > 0); the kv latent and its norm [N,rkv];
//             statistics rstd1, rstd2, rstd_c [N], rstd_cq [N] (rq > 0), lse [N*heads]; MoE layers
//             add statistics probs [N,E], topk_w [N,k], and topk_idx i32 [N,k], counts i32 [E],
//             perm i32 [S]; with a load-balancing loss the statistic aux_counts [G,E] (G: the
//             sequences for seq_aux_loss, else 1), with a z-loss the statistic logits [N,E]
//  dispatch:  EP > 1: recv_counts i32 [EP * local E] (the rows it receives are the experts')
//  experts:   x_in [R,H]; gate_up [R,2F] (gate | up), act [R,F]; rows_per_expert i32 [local E]
//             (recompute_experts: x_in and rows_per_expert only; the input-gradient backward
//             forms act again and keeps it for the weight gradient)
//  combine:   y [S,H] (EP > 1) or [R,H] (EP = 1: the experts' output itself), the expert
//             outputs in expert-sorted order, for the routing-weight gradient
//  shared expert: gate_up [N,2Fs], act [N,Fs]; gated: z [N,H], statistic gate [N]
//  mlp:       gate_up [N,2F] (gate | up), act [N,F]
//  loss:      x, nf [N,H]; rstd [N]; logits [N,V]; targets i32 [N]
//             fused LM head (training): x, d_nf [N,H]; statistic rstd [N] (the gradient is
//             formed in the forward); with MTP modules, mtp_saved_bytes besides
int64_t node_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& shape);

// The multi-token prediction modules' part of the loss node's (core/footprint_mtp.cc; the loss
// node runs them, model/mtp.cc), per module j of D (Nv = B (T - j - 1) rows with a target):
//   ids i32 [N]; e, y [N,H], cat [N,2H]; statistics rstd_e, rstd_h, rstd_f [N]; hk [N,H] (the
//   next module's input; not the last module's); its layer's nodes' footprints (the kind of the
//   model's last layer); hv [Nv,H], logits [Nv,V], targets i32 [Nv], or with the fused LM head
//   (training) d_hv [Nv,H]; and once, with the fused head, the main head's nf [N,H], which the
//   first module reads.
// After the input-gradient backward: cat [N,2H] and eh_proj's output gradient [N,H]; the layer's
// nodes' weight bytes; hv [Nv,H] and dlogits [Nv,V] (not with the fused head).
int64_t mtp_saved_bytes(const ModelConfig& cfg, const FootprintShape& shape);
int64_t mtp_weight_saved_bytes(const ModelConfig& cfg, const FootprintShape& shape);

// Of those, the bytes a node still holds after its input-gradient backward when the weight
// gradient is deferred (W-split schedules); the rest is freed at that backward.
//  embed: ids; attention: n1, n2 [N,H], a [N,heads*Dv] (MLA also the normed latents [N,rq],
//  [N,rkv]); experts: x_in [R,H], act [R,F],
//  rows_per_expert; mlp: act [N,F]; shared expert: act [N,Fs]; loss: nf [N,H], logits [N,V]
//  (holding dlogits);
//  dispatch, combine: nothing.
int64_t node_weight_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& shape);

// The fused LM head's blocks (ops/cuda/lm_head.cu forms the bf16 logits of one block of rows at
// a time): a block's bf16 logits [rows, padded_vocab] stay within kLmHeadMaxBlockBytes, at most
// kLmHeadMaxBlockRows rows, and the blocks of n rows are as even as that allows. The op and the
// planner both call lm_head_block_rows, so the planned block is the one the op allocates.
// Each block's weight-gradient product reads and writes the whole f32 [V, H] gradient once
// (2.5 GB at V 151,936 and H 2,048): a micro-batch of 4,096 tokens in one block of 1.16 GiB
// instead of four of 1,024 rows moves 7.5 GB less, which the budget of 1.25 GiB buys
// (bench/results/families.md, "The LM head's block").
constexpr int64_t kLmHeadMaxBlockRows = 8192;
constexpr int64_t kLmHeadMaxBlockBytes = int64_t{1280} << 20;
constexpr int64_t kLmHeadLogitBytes = 2;  // bf16 (fp32 accumulation; the loss math is fp32)
// V rounded up to 8 logits: the logits' row stride (lm_head.cu's padded_vocab).
int64_t lm_head_padded_vocab(int64_t vocab);
// Rows per block for n rows (1 when n <= 0).
int64_t lm_head_block_rows(int64_t n, int64_t padded_vocab);

// Note [Attention key split]: the GPU attention backward's dk/dv pass gives each block one
// (sequence, KV head, 64-key tile) and walks the query tiles of every query head of the KV head's
// group. With few KV heads (grouped-query attention: 4 KV heads of 32 query heads, one sequence
// of 4,096) that is a few hundred blocks, about one wave, in which the first key tile (it sees
// every query) takes twice the average: half the GPU idles. The pass then splits each group's
// query heads over `split` blocks, each writing f32 partial dk and dv ([split, N, kv_heads * D]
// and [split, N, kv_heads * Dv]) that a second kernel sums in part order (deterministic), into
// bf16. `split` is the least divisor of the group that makes at least kAttentionSplitBlocks
// blocks (the group when none does); 1 for the generic kernels' head dims (any but (64, 64),
// (128, 128), (192, 128)). The workspace is an op temporary the planner counts
// (node_workspace_bytes).
constexpr int64_t kAttentionSplitBlocks = 1024;
// Whether the GPU attention runs q/k heads of head_dim with v heads of v_dim on the tensor cores
// ((64, 64), (128, 128), (192, 128)); other widths take the generic kernels.
bool attention_tensor_core_dims(int64_t head_dim, int64_t v_dim);
int64_t attention_key_split(int64_t batch, int64_t seq, int64_t kv_heads, int64_t group,
                            int64_t head_dim, int64_t v_dim);

// Note [Node workspace]: op temporaries, the bytes a node's phase allocates beyond its saved
// bytes (node_saved_bytes) and frees by the time the phase ends: work tensors, communication
// buffers, the output it hands to the next node, the gradients it reads that its layer still
// holds, and ops' own buffers. Each figure counts the tensors alive at the phase's own peak (the
// larger of the moments listed), less what the node saves after that moment: the planner holds
// a phase's figure from its start and its saved bytes from its end, so the phase's peak is
// their sum. The tensor a forward adopts as saved (x, x_in, y) is counted by the node that made
// it until that node ends and as saved bytes from this node's end, not while it runs. With
// balanced routing (R = N k rows). Both layouts run the same nodes (src/model); they differ in
// the loss node and the attention op. The GPU's (shape.fused_lm_head): the fused LM head and the
// GPU attention's f32 buffers, below. The CPU's: the unfused head, whose logits are saved bytes
// (forward: nothing; I: d_nf and d_x [N,H]), and the CPU attention op's [T,T] probabilities in
// the forward, [T,T] twice and [T] in the backward (ops/cpu/attention.cc takes them from the
// allocator). tests/runtime/test_cpu_memory.cc holds the CPU trainer's whole peak to the plan's,
// tests/cuda/test_cuda_memory.cc the GPU's.
struct NodeWorkspace {
  int64_t forward = 0;
  int64_t backward_input = 0;   // the input-gradient half (I, or the first part of a full B)
  int64_t backward_weight = 0;  // the weight half, run right after the I or later on its own
  // Of backward_input, the gradient the node is handed (the pipeline message when the node is
  // the first of its stage's backward, which the planner counts as in flight instead).
  int64_t incoming_grad = 0;
  // Of backward_input, what outlives the I for later nodes and so is held through a W that
  // follows it in the same action (a full B): experts only, see below.
  int64_t handed = 0;
};

//  embed:     F out [N,H] (handed to layer 0); W d_out [N,H] (the gradient it scatters)
//  attention: F MoE: router logits [N,E] stat, routed [N*k,H] (handed to dispatch)
//             I the largest of: at the start d_out [N,H], d_n2 [N,H], MoE d_routed [N*k,H],
//               d_topk_w [N,k] stat, d_logits [N,E]; mid: d_n2, d_logits, d_h1 [N,H],
//               d_a, d_q [N,heads*D], d_k, d_v [N,kv*D], the attention op's delta
//               [N*heads] f32 (its default backward has no f32 dq workspace) and with a key
//               split its f32 partial dk, dv [split,N,kv*D] (Note [Attention key split]); at the
//               end the same with d_n1, d_x [N,H] instead of the op's buffer
//             W d_h1, d_q, d_k, d_v, MoE d_logits (kept from I for W)
//             MLA: I mid as above with d_a, d_v [N,heads*Dv], then d_q_in [N,heads*(Dn+Dr)],
//               d_kv [N,heads*(Dn+Dv)], d_k_rope [N,Dr] beside them; later d_n1 [N,H] and the
//               latents' d_ckvn, d_ckv [N,Rkv] (d_cqn, d_cq [N,Rq]); at the end d_x [N,H]
//             W d_h1, d_q_in, d_kv, d_k_rope, d_ckv, d_cq, MoE d_logits
//  dispatch:  F EP = 1: the routed rows handed on [N*k,H]; EP > 1: recv [R,H] and the larger of
//               routed [N*k,H] and x_in [R,H]
//             I d_out [N,H], d_topk_w [N,k] stat (the layer's, held until attention), and
//               EP = 1: the rows handed on [N*k,H]; EP > 1: send [R,H] and the larger of
//               d_expert_in [R,H] and d_routed [N*k,H]
//  experts:   F expert_out [R,H] (handed to combine)
//             I d_out [N,H], d_topk_w [N,k] stat, d_y [R,H] (incoming), d_act [R,F],
//               d_gate_up [R,2F], d_expert_in [R,H]
//             W d_y [R,H], d_gate_up [R,2F]
//  combine:   F out [N,H] (handed on); EP > 1: send [R,H] and the larger of expert_out [R,H]
//               and out beside the received y [S,H] (saved, so less y)
//             I d_out [N,H] (incoming), d_y [N*k,H], d_topk_w [N,k] stat; EP > 1: recv, and
//               d_expert_out [R,H] once y [S,H] is freed
//  mlp:       F out [N,H] (handed on)
//             I d_out [N,H] (incoming, kept for W), d_act [N,F], d_gate_up [N,2F], d_n2 [N,H]
//             W d_out [N,H], d_gate_up [N,2F]
//  loss:      F (gradients formed in the forward) the logits block [block rows, padded V]
//               bf16, nf [N,H], targets i32 [N], lse [N] stat, row losses [N] f32
//             I d_x [N,H]
// What a full B's I passes on is held through its W: for experts d_out [N,H], d_topk_w [N,k]
// stat and d_expert_in [R,H] (`handed`), whose W can be the step's peak when it runs a merged
// group's products (Note [Merged expert weight gradients]); for the other nodes (d_x, d_n2
// [N,H]) it is not counted, their W holding far less than their I.
NodeWorkspace node_workspace_bytes(NodeKind kind, const ModelConfig& cfg,
                                   const FootprintShape& shape);
// The MTP modules' op temporaries inside the loss node. GPU layout: the modules' part, a peak
// estimate: forward, the targets, a row block and the larger of the module's layer's nodes' and
// its shared head's; backward, two [N,H] gradients beside the larger of the layer's nodes' and
// the concatenation's [N,2H] and a half of it. CPU layout: the whole loss node's figures, walked
// tensor by tensor as model/end_nodes.cc and model/mtp.cc run it (exact).
NodeWorkspace mtp_workspace(const ModelConfig& cfg, const FootprintShape& shape);

// Note [Merged expert weight gradients] (model/nodes.h): with --moe-wgrad-merge above 1, what an
// experts node's micro-batch holds beyond node_weight_saved_bytes while its weight gradient
// waits for the rest of its group: d_y [R,H] and d_gate_up [R,2F], activations from the end of
// its weight-gradient pass until the group's products ran (`waiting`); and its part of the
// buffers that pass gathers the group's rows into: x_in, d_y [R,H], act [R,F], d_gate_up [R,2F]
// (`gathered`, workspace).
struct ExpertMergeBytes {
  int64_t waiting = 0;
  int64_t gathered = 0;
};
ExpertMergeBytes expert_merge_bytes(const ModelConfig& cfg, const FootprintShape& shape);

}  // namespace tandem
