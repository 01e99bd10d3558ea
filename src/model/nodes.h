// The schedule nodes of a transformer layer and of a chunk's ends (docs/design.md "Nodes"): each
// has forward, backward (input gradient) and backward_weights (matrix gradients, for W-split
// schedules). Data flows between the nodes of a layer through LayerActs; each node's saved
// state is its own struct, sized exactly as core/footprint.h says, and released
// (Note [Early release]) as soon as the node's backward and weight backward have run.
//
// Note [Activation categories]: tensors a forward leaves for a backward are kActivation (each
// is held by exactly one node, so the activation bytes in use are the sum of the live nodes'
// footprints); gradients flowing backward and op temporaries are kOther; a tensor one node
// hands to the next is kOther until the receiving node adopts it (Note [Hand-over] in
// core/tensor.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config.h"
#include "core/footprint.h"
#include "core/host_read.h"
#include "core/tensor.h"
#include "model/parameters.h"
#include "ops/ops.h"

namespace tandem::comm {
class Communicator;
}

namespace tandem::model {

// Shape and scaling of one micro-batch's pass through a node.
struct MergedExpertGrads;  // below

struct NodeContext {
  const ModelConfig& cfg;
  int64_t batch;      // sequences in the micro-batch
  int64_t seq;        // tokens per sequence
  DType dtype;        // activation dtype (f32 to train, f64 for gradient checks, bf16 on
                      // the GPU)
  double loss_scale;  // d(step loss)/d(micro-batch loss): 1 / num_microbatches
  comm::Communicator* ep = nullptr;  // the expert-parallel group; null when EP = 1
  // The loss node through ops::lm_head_ce_* (no [N, V] logits; the GPU's choice).
  bool fused_lm_head = false;
  // Where a fused loss node's forward adds the LM head's weight gradient when it forms its
  // gradients at once (Note [Loss gradient in the forward] in end_nodes.cc); null: it does not
  // (a forward without backward, e.g. evaluation).
  const ModelWeights* grads = nullptr;
  // The experts form gate, up and act again in their backward (Note [Recomputed experts] in
  // ffn_nodes.cc; TrainConfig::recompute_experts).
  bool recompute_experts = false;
  // The modules that form their activations again in their backward (parse_recompute's bits of
  // TrainConfig::recompute; Note [Recomputed modules] in ffn_nodes.cc).
  uint32_t recompute = 0;
  // Random router logits for benchmarks (TrainConfig::moe_router_force_balance,
  // Note [Forced load balancing] in attention_node.cc), drawn from this micro-batch's key.
  bool force_balanced_routing = false;
  uint64_t routing_key = 0;
  // The data-parallel group (holding the expert-parallel ranks): global_aux_loss sums each
  // micro-batch's counts over it; null: one rank.
  comm::Communicator* dp = nullptr;
  // The tensor-parallel group (Note [Tensor parallelism] in core/config_tp.cc): cfg is then one
  // rank's shard of the model, and the row-parallel outputs and the column-parallel blocks' input
  // gradients are summed over it; null: TP 1.
  comm::Communicator* tp = nullptr;
  // The trainer's merge of the experts' weight gradients over micro-batches
  // (Note [Merged expert weight gradients]); null: each micro-batch's own products.
  MergedExpertGrads* merged_expert_grads = nullptr;
  // The loss node runs the MTP modules (ModelConfig::mtp_num_layers; docs/model.md
  // "Multi-token prediction"): off for forwards whose loss is the LM loss only (evaluation,
  // generation), as Megatron-LM's MTP changes only the training loss.
  bool mtp = true;
  // Megatron-LM's document masking of this micro-batch (Note [Document masking] in
  // data/document_masks.h), on the nodes' device, undefined when off: each query's first key
  // (--reset-attention-mask) and each token's RoPE position (--document-positions), i32 [N]; the
  // loss mask (--eod-mask-loss), f32 [N], 0 where the input is the end-of-document token: the
  // loss node's loss is the mean over the loss_tokens tokens of mask 1 (counted on the host;
  // Note [Loss mask] in end_nodes.cc).
  Tensor key_begin = {}, positions = {}, loss_mask = {};
  int64_t loss_tokens = 0;
  // With --eod-mask-loss and MTP modules: depth k's tokens of weight 1 in the loss mask rolled k
  // left (mtp_loss_tokens[k - 1], counted on the host; Note [MTP loss mask] in mtp.cc).
  std::vector<int64_t> mtp_loss_tokens = {};
  // Note [Per-token loss] (runtime/step.h): with --calculate-per-token-loss, the global batch's
  // tokens of weight 1 over its micro-batches (of all data-parallel ranks), by which the loss
  // node divides its sum in place of its own count; < 0: off.
  double per_token_divisor = -1;
  int64_t tokens() const { return batch * seq; }
  // The tokens of weight 1 of the loss node's own micro-batch (all of them without a loss mask).
  double own_loss_tokens() const {
    return static_cast<double>(loss_mask.defined() ? loss_tokens : tokens());
  }
  // The loss node's divisor of its summed cross-entropy: its own tokens of weight 1, or the
  // per-token divisor.
  double loss_divisor() const {
    return per_token_divisor >= 0 ? per_token_divisor : own_loss_tokens();
  }
  // Statistics (norm rstd, attention lse, router probabilities and weights) stay f32 when the
  // activations are bf16 (docs/cuda.md "Numerics on the GPU").
  DType stat_dtype() const { return dtype == DType::kBF16 ? DType::kF32 : dtype; }
};

struct AttentionSaved {
  Tensor x, n1, rstd1, q, k, v, a, lse, h1, rstd2, n2;  // see footprint.h
  Tensor q_raw, k_raw, rstd_q, rstd_k;  // --qk-layernorm: q and k before their norms
  // --multi-latent-attention: q's latent before and after its norm (q_lora_rank > 0) and the
  // kv latent likewise (model/mla.cc).
  Tensor cq, rstd_cq, cqn, ckv, rstd_ckv, ckvn;
  // MoE routing. counts and perm go by place, which is by expert unless the layer's experts
  // are placed out of order (Note [Expert placement] in model/expert_placement.h).
  Tensor probs, topk_w, topk_idx, counts, perm;
  // The router's losses (ops::RouterLoss): the load-balancing loss's counts [G, E], and with a
  // z-loss the router's logits [N, E].
  Tensor aux_counts, logits;
  std::vector<int32_t> counts_host;       // counts on the host (Note [Routing counts on the host])
  std::shared_ptr<HostRead> counts_read;  // counts on their way there, taken by dispatch
  // Kept from backward to backward_weights: gradients at the matrices' outputs.
  Tensor d_h1, d_q, d_k, d_v, d_logits;
  Tensor d_q_in, d_cq, d_kv, d_ckv, d_k_rope;  // MLA: at q_b (or q), q_a, kv_b and kv_a's outputs
};

struct ExpertsSaved {
  Tensor x_in, gate_up, act, rows_per_expert;  // gate_up: [R, 2F], rows (gate | up)
  std::vector<int32_t> rows_host;  // rows_per_expert read once (a GPU copy waits for the stream)
  Tensor d_y, d_gate_up;           // kept for backward_weights
};

// Note [Merged expert weight gradients]: an experts node's weight gradient sums, per expert, a
// product over the rows the expert received: K = its rows, about N k / E (384 at shape (d)),
// short beside the [F, H] f32 gradient each product reads and writes. So with merge m > 1 the
// node's weight-gradient pass of a micro-batch only sets its tensors aside (x_in, act,
// rows_per_expert, d_y, d_gate_up; d_y and d_gate_up become activations), and the pass that
// makes m waiting (or the step's last pass of the layer) gathers the rows of all of them
// expert-major into one buffer each (copy_row_blocks) and runs one product per expert over
// them: the f32 gradients are read and written once per m micro-batches. The values differ
// from m = 1 only in rounding (one f32 sum instead of m). The tensors set aside stay until that
// pass: the activation memory the planner counts (docs/memory.md).
struct MergedExpertGrads {
  int64_t merge = 1;         // micro-batches per product (TrainConfig::moe_wgrad_merge)
  int64_t microbatches = 0;  // weight-gradient passes of each layer in a step
  std::vector<std::vector<ExpertsSaved>> waiting;  // per layer of the chunk
  std::vector<int64_t> passes;                     // per layer: this step's passes so far
  // Starts a step of `microbatches` passes over `layers` layers; nothing may be waiting.
  void begin_step(int64_t layers, int64_t microbatches);
  bool idle() const;  // no micro-batch waiting
};

struct CombineSaved {
  Tensor y;  // [N*k, H] expert outputs in expert-sorted order
};

// EP > 1 only: rows received from each source rank for each local expert, [EP * local E] i32
// (source-major); dispatch holds it until its backward, combine reads it.
struct DispatchSaved {
  Tensor recv_counts;
  std::vector<int32_t> recv_host;  // recv_counts on the host, read once by dispatch's forward
  // recv_counts on their way to the host (dispatch_exchange_counts); shared: LayerActs copies.
  std::shared_ptr<HostRead> recv_read;
};

// The shared expert of a MoE layer (a SwiGLU over every token, beside the routed experts).
struct SharedExpertSaved {
  Tensor gate_up, act;             // gate_up: [N, 2Fs], rows (gate | up); act: [N, Fs]
  Tensor z, gate;                  // gated: the output before its gate [N, H], and the gate [N]
  Tensor d_z, d_gate_up, d_logit;  // kept for backward_weights
};

struct MlpSaved {
  Tensor gate_up, act;      // gate_up: [N, 2F], rows (gate | up)
  Tensor d_out, d_gate_up;  // kept for backward_weights
};

// One layer's data for one micro-batch. Forward flow: x -> (attention) -> h1, routed | n2 ->
// (dispatch) -> expert_in -> (experts) -> expert_out -> (combine | mlp) -> out. Backward flow
// runs the other way through the d_ tensors.
struct LayerActs {
  int64_t layer = -1;  // the layer's index in the whole model
  Tensor x, h1, routed, expert_in, expert_rows, expert_out, shared_out, out;
  std::vector<int32_t> expert_rows_host;  // expert_rows on the host, handed on with it
  ops::PendingScalar aux_loss;            // the router's losses (load balancing and z)
  Tensor d_out, d_expert_out, d_expert_in, d_routed, d_topk_w, d_n2, d_x;
  AttentionSaved attn;
  DispatchSaved dispatch;
  ExpertsSaved experts;
  CombineSaved combine;
  SharedExpertSaved shared;
  MlpSaved mlp;
};

struct EmbedActs {
  Tensor ids_saved;  // [N] i32
  Tensor out;        // [N, H] -> layer 0's x
  Tensor d_out;
};

// One MTP module's state for one micro-batch (model/mtp.cc), N = B T rows, Nv = B (T - k) the
// rows of module k (1-based) that have a target.
struct MtpActs {
  Tensor ids;               // [N] i32: the tokens k ahead, 0 past the sequence's end
  Tensor e, rstd_e;         // the embedding [N, H] (enorm's input) and its norm's rstd [N]
  Tensor h_in, rstd_h;      // hnorm's input [N, H] (the previous depth's output) and its rstd
  Tensor cat;               // [N, 2H]: each row the normed embedding, then the normed h_in
  LayerActs layer;          // the module's transformer layer (x: eh_proj's output)
  Tensor y, rstd_f;         // the layer's output [N, H] (the final norm's input) and its rstd
  Tensor hk;                // the final norm's output [N, H]: the next depth's h_in
  Tensor hv, targets;       // its rows with a target [Nv, H] and their targets [Nv] i32
  Tensor logits, lse;       // [Nv, V] (holds dlogits after backward), or the fused head's [Nv]
  Tensor d_hv;              // fused head, gradient formed in the forward: [Nv, H]
  Tensor d_x;               // eh_proj's output gradient [N, H], kept for its weight gradient
  ops::PendingScalar loss;  // mean cross-entropy over the Nv rows
};

struct LossActs {
  Tensor x, nf, rstd, logits, targets;  // logits [N, V]; holds dlogits after backward
  Tensor lse;                           // fused LM head: [N] f32 instead of the logits
  Tensor d_nf;                          // fused, gradient formed in the forward: [N, H]
  ops::PendingScalar lm_loss;           // mean cross-entropy over the micro-batch's tokens
  Tensor d_x;                           // [N, H]
  std::vector<MtpActs> mtp;             // the MTP modules, in depth order
};

// ---- embed (first stage) ----
void embed_forward(EmbedActs& a, const Tensor& ids, const ModelWeights& w, const NodeContext& c);
void embed_backward(EmbedActs& a, const NodeContext& c);
void embed_backward_weights(EmbedActs& a, const ModelWeights& g, const NodeContext& c);

// ---- tensor parallelism's collectives (attention_node.cc) ----
// Note [Tensor parallelism] (core/config_tp.cc): out = residual + in @ w^T summed over the
// tensor-parallel ranks (each holds a block of w's columns and of in's), the residual added by tp
// rank 0 only; without a tp group the one product.
void tp_row_parallel_forward(const Tensor& out, const Tensor& in, const Tensor& w,
                             const Tensor& residual, const NodeContext& c);
// The input gradient of a column-parallel block (each rank's part from its rows of the block's
// matrices) summed over the tensor-parallel ranks, in place; nothing without a tp group.
void tp_input_grad_reduce(const Tensor& d_in, const NodeContext& c);

// ---- attention (norm, qkv, rope, attention, out-proj, residual, norm, router, permute) ----
void attention_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c);
void attention_backward(LayerActs& a, const LayerWeights& w, const LayerWeights& g,
                        const NodeContext& c);
void attention_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext& c);
// Multi-head latent attention's part of the attention node (model/mla.cc): q, k, v from n1
// (saved in s, with the latents), the gradient at n1 from s.d_q, s.d_k, s.d_v (the latents'
// norm gains' gradients added to g), and the matrices' gradients.
void mla_forward(AttentionSaved& s, const LayerWeights& w, const NodeContext& c);
Tensor mla_backward(AttentionSaved& s, const LayerWeights& w, const LayerWeights& g,
                    const NodeContext& c);
void mla_backward_weights(AttentionSaved& s, const LayerWeights& g);

// ---- dispatch / combine: the all-to-all pair (a hand-over of ownership when EP = 1) ----
// With EP > 1, dispatch sends each expert's rows to the rank holding it (counts first, then
// rows) and orders what arrives by local expert; combine does the reverse, then the weighted sum.
void dispatch_forward(LayerActs& a, const NodeContext& c);
// The first part of dispatch's forward, which may run earlier
// (Note [Counts ahead of the rows] in moe_exchange.cc): the exchange of routing counts and the
// start of their read to the host. dispatch_forward runs it itself when it has not run.
void dispatch_exchange_counts(LayerActs& a, const NodeContext& c);
void dispatch_backward(LayerActs& a, const NodeContext& c);
void combine_forward(LayerActs& a, const NodeContext& c);
void combine_backward(LayerActs& a, const NodeContext& c);

// ---- experts (grouped SwiGLU over the rows each local expert receives) ----
void experts_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c);
void experts_backward(LayerActs& a, const LayerWeights& w, const NodeContext& c);
// layer: the chunk's index of the layer (Note [Merged expert weight gradients]).
void experts_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext& c,
                              int64_t layer);

// ---- shared expert (MoE layers with one: a SwiGLU over every token, gated or not; its output
// goes to combine, which adds it to the layer's output) ----
void shared_expert_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c);
void shared_expert_backward(LayerActs& a, const LayerWeights& w, const NodeContext& c);
void shared_expert_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext& c);

// ---- mlp (dense layers: SwiGLU and residual) ----
void mlp_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c);
void mlp_backward(LayerActs& a, const LayerWeights& w, const NodeContext& c);
void mlp_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext& c);

// ---- loss (final norm, LM head, cross-entropy; last stage) ----
void loss_forward(LossActs& a, const Tensor& x, const Tensor& targets, const ModelWeights& w,
                  const NodeContext& c);
void loss_backward(LossActs& a, const ModelWeights& w, const ModelWeights& g, const NodeContext& c);
void loss_backward_weights(LossActs& a, const ModelWeights& g, const NodeContext& c);

// ---- multi-token prediction (model/mtp.cc), run by the loss node: the modules read the main
// head's input nf and the targets; their backward returns the gradient at nf. ----
bool mtp_runs(const NodeContext& c);
void mtp_forward(LossActs& a, const Tensor& targets, const ModelWeights& w, const NodeContext& c);
Tensor mtp_backward(LossActs& a, const ModelWeights& w, const ModelWeights& g,
                    const NodeContext& c);
void mtp_backward_weights(LossActs& a, const ModelWeights& g, const NodeContext& c);

// Note [Routing counts on the host]: the experts' matrix products and the all-to-all need the
// routing counts on the host, and on a GPU a read waits for the copy (the host stops issuing
// work until the GPU has made the values). Each count is therefore read once: the router's
// counts start their copy in attention's forward, where they are made, and dispatch's forward
// takes them (HostRead, Note [Reads to the host ahead of use]: meanwhile the host issues the
// rest of attention and, under combined 1F1B, the other micro-batch's experts); the counts
// received from other ranks likewise (Note [Counts ahead of the rows] in moe_exchange.cc);
// later nodes (experts, combine, the backwards) take the host copies. The router's aux loss
// also stays on its way to the host until the step's end (ops::PendingScalar). The device
// tensors stay, so the saved state, and so the planner's memory figures, are unchanged.

// NodeContext::routing_key of a global batch's micro-batch (Note [Forced load balancing] in
// attention_node.cc).
uint64_t routing_key(uint64_t seed, int64_t iteration, int64_t global_microbatch);

// Bytes of distinct live storage among a node's saved tensors (for checks against footprint.h).
int64_t live_bytes(const std::vector<const Tensor*>& tensors);
std::vector<const Tensor*> saved_tensors(NodeKind kind, const LayerActs& a);
std::vector<const Tensor*> saved_tensors(const EmbedActs& a);
// Every tensor a layer's data holds, saved or in flight (keep in step with LayerActs): what a
// node running on another stream may have read (Note [Nodes on the communication stream] in
// runtime/combined.cc).
std::vector<const Tensor*> all_tensors(const LayerActs& a);
std::vector<const Tensor*> saved_tensors(const LossActs& a);

// Allocation helpers for node code (Note [Activation categories]).
Tensor saved_tensor(const Shape& shape, DType dtype, const char* tag);
Tensor work_tensor(const Shape& shape, DType dtype, const char* tag);
Tensor comm_tensor(const Shape& shape, DType dtype, const char* tag);
// The values of a small i32 tensor (routing counts) on the host; a device tensor is copied
// (which waits for the current stream).
std::vector<int32_t> host_ints(const Tensor& t);

}  // namespace tandem::model
