// The chunk-level nodes (embed on the first stage, loss on the last) and the bookkeeping shared
// by every node: allocation by category and the saved-tensor lists checked against footprint.h.
#include <unordered_set>

#include "model/nodes.h"
#include "ops/ops.h"

namespace tandem::model {

using ops::Accumulate;

Tensor saved_tensor(const Shape& shape, DType dtype, const char* tag) {
  return Tensor::empty(shape, dtype, MemCategory::kActivation, tag, current_device());
}

Tensor work_tensor(const Shape& shape, DType dtype, const char* tag) {
  return Tensor::empty(shape, dtype, MemCategory::kOther, tag, current_device());
}

Tensor comm_tensor(const Shape& shape, DType dtype, const char* tag) {
  return Tensor::empty(shape, dtype, MemCategory::kCommunication, tag, current_device());
}

void embed_forward(EmbedActs& a, const Tensor& ids, const ModelWeights& w, const NodeContext& c) {
  const int64_t n = c.tokens();
  a.ids_saved = saved_tensor({n}, DType::kI32, "embed.ids");
  a.ids_saved.copy_from(ids);
  a.out = work_tensor({n, c.cfg.hidden_size}, c.dtype, "embed.out");  // handed to layer 0
  // Ids still on the host are checked here, so a GPU need not wait for its own check.
  ops::IdCheck check = ops::IdCheck::kCheck;
  if (ids.device() == Device::kCPU && a.ids_saved.device() != Device::kCPU) {
    const int32_t* p = ids.data<int32_t>();
    const int64_t v = w.embed.size(0);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      TANDEM_CHECK(p[i] >= 0 && p[i] < v, "embedding: id ", p[i], " at row ", i, " is outside [0, ",
                   v, ")");
    }
    check = ops::IdCheck::kCheckedByCaller;
  }
  ops::embedding_forward(a.out, a.ids_saved, w.embed, check);
}

void embed_backward(EmbedActs&, const NodeContext&) {}  // token ids have no gradient

void embed_backward_weights(EmbedActs& a, const ModelWeights& g, const NodeContext&) {
  ops::embedding_backward(g.embed, a.d_out, a.ids_saved);
  release_storage({&a.ids_saved});
  a = EmbedActs{};
}

// Note [Loss mask]: with --eod-mask-loss (NodeContext::loss_mask) the loss node's loss is
// Megatron-LM's sum(loss * mask) / sum(mask) over the micro-batch's tokens, the tokens whose
// input is the end-of-document id weighing 0; the trainers then average the micro-batches' losses
// and the data-parallel ranks' gradients as they do unmasked, as Megatron-LM does without
// --calculate-per-token-loss (with it the divisor is the global batch's count instead:
// Note [Per-token loss] in runtime/step.h). A micro-batch with no token of weight 1 has the loss
// 0 / 0 (NaN), as in Megatron-LM, which --nan-policy judges. Both heads take the mask: the
// unfused one (cross_entropy_*_masked) and the fused one (lm_head_ce_*_masked), whose masked rows
// add nothing to the loss or to either gradient; the count of tokens of weight 1 comes from the
// host (NodeContext::loss_tokens), so no step waits for the device to count them.
static double loss_tokens(const NodeContext& c) { return c.loss_divisor(); }

void loss_forward(LossActs& a, const Tensor& x, const Tensor& targets, const ModelWeights& w,
                  const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), h = cfg.hidden_size;
  a.x = x;                   // (N, H)
  adopt_as_activation(a.x);  // Note [Hand-over]
  // Training with the fused LM head, nf is an op temporary
  // (Note [Loss gradient in the forward]): counted as one, as the planner counts it (the loss
  // forward's workspace), so the activation peak does not hold it beside d_nf.
  // The MTP modules read nf (their first hnorm's input), so it is kept for them.
  const bool nf_temporary = c.fused_lm_head && c.grads != nullptr && !mtp_runs(c);
  a.nf = (nf_temporary ? work_tensor : saved_tensor)({n, h}, c.dtype, "loss.nf");
  a.rstd = saved_tensor({n}, c.stat_dtype(), "loss.rstd");
  ops::rmsnorm_forward(a.nf, a.rstd, a.x, w.final_norm, cfg.norm_epsilon);
  if (c.fused_lm_head && c.grads != nullptr) {
    // Note [Loss gradient in the forward]: the loss is the last node of its micro-batch's
    // forward and its gradient depends on nothing later, so when training, the fused node forms
    // it at once: one LM-head product per block serves the loss and both gradients, the LM
    // head's weight gradient lands in c.grads now, and what waits for the backward is d_nf (the
    // size of the nf it replaces). nf, lse and targets are op temporaries here.
    Tensor tgt = work_tensor({n}, DType::kI32, "loss.targets");
    tgt.copy_from(targets);
    Tensor lse = work_tensor({n}, c.stat_dtype(), "loss.lse");
    a.d_nf = saved_tensor({n, h}, c.dtype, "loss.d_nf");
    // The loss stays on its way to the host (Note [Reads to the host ahead of use]).
    const double kept = loss_tokens(c);
    a.lm_loss =
        ops::lm_head_ce_forward_backward_masked(a.d_nf, c.grads->lm_head, lse, a.nf, w.lm_head, tgt,
                                                c.loss_scale / kept, c.loss_mask, Accumulate::kAdd)
            .then([kept](double sum) { return sum / kept; });
    if (mtp_runs(c)) {
      mtp_forward(a, targets, w, c);
      return;
    }
    release_storage({&a.nf});
    a.nf = Tensor();
    return;
  }
  if (c.fused_lm_head) {
    // The logits exist only block by block inside the op; lse is what the backward needs.
    a.targets = saved_tensor({n}, DType::kI32, "loss.targets");
    a.targets.copy_from(targets);
    a.lse = saved_tensor({n}, c.stat_dtype(), "loss.lse");
    a.lm_loss = ops::PendingScalar(
        ops::lm_head_ce_forward_masked(a.lse, a.nf, w.lm_head, a.targets, c.loss_mask) /
        loss_tokens(c));
    if (mtp_runs(c)) mtp_forward(a, targets, w, c);
    return;
  }
  a.logits = saved_tensor({n, cfg.vocab_size}, c.dtype, "loss.logits");  // (N, V)
  ops::linear_forward(a.logits, a.nf, w.lm_head);
  a.targets = saved_tensor({n}, DType::kI32, "loss.targets");
  a.targets.copy_from(targets);
  a.lm_loss = ops::PendingScalar(
      ops::cross_entropy_forward_masked(a.logits, a.targets, c.loss_mask) / loss_tokens(c));
  if (mtp_runs(c)) mtp_forward(a, targets, w, c);
}

void loss_backward(LossActs& a, const ModelWeights& w, const ModelWeights& g,
                   const NodeContext& c) {
  const int64_t n = c.tokens(), h = c.cfg.hidden_size;
  // The MTP modules' gradient at nf, added to the head's before the final norm's backward.
  Tensor d_mtp = a.mtp.empty() ? Tensor() : mtp_backward(a, w, g, c);
  const auto add_mtp = [&](const Tensor& d_nf) {
    if (!d_mtp.defined()) return;
    ops::axpy(d_nf, d_mtp, 1.0);
    release_storage({&d_mtp});
  };
  if (a.d_nf.defined()) {  // formed in the forward (Note [Loss gradient in the forward])
    add_mtp(a.d_nf);
    release_storage({&a.nf});  // kept for the MTP modules only
    a.d_x = work_tensor({n, h}, c.dtype, "loss.d_x");
    ops::rmsnorm_backward(a.d_x, g.final_norm, a.d_nf, a.x, w.final_norm, a.rstd,
                          Accumulate::kOverwrite);
    release_storage({&a.x, &a.rstd, &a.d_nf});
    return;
  }
  if (c.fused_lm_head) {
    // The LM head's input and weight gradients come together, so nothing waits for a W step.
    Tensor d_nf = work_tensor({n, h}, c.dtype, "loss.d_nf");
    ops::lm_head_ce_backward_masked(d_nf, g.lm_head, a.nf, w.lm_head, a.targets, a.lse,
                                    c.loss_scale / loss_tokens(c), c.loss_mask, Accumulate::kAdd);
    release_storage({&a.nf, &a.lse, &a.targets});
    add_mtp(d_nf);
    a.d_x = work_tensor({n, h}, c.dtype, "loss.d_x");
    ops::rmsnorm_backward(a.d_x, g.final_norm, d_nf, a.x, w.final_norm, a.rstd,
                          Accumulate::kOverwrite);
    release_storage({&a.x, &a.rstd});
    return;
  }
  // dlogits overwrite the logits in place: the fp32 logits die the moment their gradient exists.
  ops::cross_entropy_backward_masked(a.logits, a.logits, a.targets, c.loss_scale / loss_tokens(c),
                                     c.loss_mask);
  Tensor d_nf = work_tensor({n, h}, c.dtype, "loss.d_nf");
  ops::linear_backward_input(d_nf, a.logits, w.lm_head);
  add_mtp(d_nf);
  a.d_x = work_tensor({n, h}, c.dtype, "loss.d_x");
  ops::rmsnorm_backward(a.d_x, g.final_norm, d_nf, a.x, w.final_norm, a.rstd,
                        Accumulate::kOverwrite);
  release_storage({&a.x, &a.rstd, &a.targets});  // dlogits and nf stay for the LM head's gradient
}

void loss_backward_weights(LossActs& a, const ModelWeights& g, const NodeContext& c) {
  if (!a.mtp.empty()) mtp_backward_weights(a, g, c);
  if (!c.fused_lm_head) ops::linear_backward_weight(g.lm_head, a.logits, a.nf);
  release_storage({&a.logits, &a.nf});
  Tensor d_x = std::move(a.d_x);
  a = LossActs{};
  a.d_x = std::move(d_x);
}

int64_t live_bytes(const std::vector<const Tensor*>& tensors) {
  std::unordered_set<const StorageImpl*> seen;
  int64_t bytes = 0;
  for (const Tensor* t : tensors) {
    if (!t->defined() || t->released() || t->evicted()) continue;  // not in device memory
    if (seen.insert(t->storage().get()).second) bytes += t->storage()->bytes();
  }
  return bytes;
}

std::vector<const Tensor*> saved_tensors(NodeKind kind, const LayerActs& a) {
  const AttentionSaved& s = a.attn;
  switch (kind) {
    case NodeKind::kAttention:
      return {&s.x,       &s.n1,    &s.rstd1,  &s.q,        &s.k,      &s.v,          &s.a,
              &s.lse,     &s.h1,    &s.rstd2,  &s.n2,       &s.q_raw,  &s.k_raw,      &s.rstd_q,
              &s.rstd_k,  &s.probs, &s.topk_w, &s.topk_idx, &s.counts, &s.perm,       &s.cq,
              &s.rstd_cq, &s.cqn,   &s.ckv,    &s.rstd_ckv, &s.ckvn,   &s.aux_counts, &s.logits};
    case NodeKind::kDispatch:
      return {&a.dispatch.recv_counts};
    case NodeKind::kExperts:
      return {&a.experts.x_in, &a.experts.gate_up, &a.experts.act, &a.experts.rows_per_expert};
    case NodeKind::kCombine:
      return {&a.combine.y};
    case NodeKind::kSharedExpert:
      return {&a.shared.gate_up, &a.shared.act, &a.shared.z, &a.shared.gate};
    case NodeKind::kMlp:
      return {&a.mlp.gate_up, &a.mlp.act};
    default:
      return {};
  }
}

std::vector<const Tensor*> saved_tensors(const EmbedActs& a) { return {&a.ids_saved}; }

std::vector<const Tensor*> all_tensors(const LayerActs& a) {
  std::vector<const Tensor*> out = {&a.x,
                                    &a.h1,
                                    &a.routed,
                                    &a.expert_in,
                                    &a.expert_rows,
                                    &a.expert_out,
                                    &a.shared_out,
                                    &a.out,
                                    &a.d_out,
                                    &a.d_expert_out,
                                    &a.d_expert_in,
                                    &a.d_routed,
                                    &a.d_topk_w,
                                    &a.d_n2,
                                    &a.d_x,
                                    &a.attn.d_h1,
                                    &a.attn.d_q,
                                    &a.attn.d_k,
                                    &a.attn.d_v,
                                    &a.attn.d_logits,
                                    &a.attn.d_q_in,
                                    &a.attn.d_cq,
                                    &a.attn.d_kv,
                                    &a.attn.d_ckv,
                                    &a.attn.d_k_rope,
                                    &a.experts.d_y,
                                    &a.experts.d_gate_up,
                                    &a.shared.d_z,
                                    &a.shared.d_gate_up,
                                    &a.shared.d_logit,
                                    &a.mlp.d_out,
                                    &a.mlp.d_gate_up};
  for (NodeKind k : {NodeKind::kAttention, NodeKind::kDispatch, NodeKind::kExperts,
                     NodeKind::kSharedExpert, NodeKind::kCombine, NodeKind::kMlp}) {
    for (const Tensor* t : saved_tensors(k, a)) out.push_back(t);
  }
  return out;
}

std::vector<const Tensor*> saved_tensors(const LossActs& a) {
  std::vector<const Tensor*> out = {&a.x, &a.nf, &a.rstd, &a.logits, &a.targets, &a.lse, &a.d_nf};
  for (const MtpActs& m : a.mtp) {
    for (const Tensor* t : {&m.ids, &m.e, &m.rstd_e, &m.h_in, &m.rstd_h, &m.cat, &m.y, &m.rstd_f,
                            &m.hk, &m.hv, &m.targets, &m.logits, &m.lse, &m.d_hv, &m.d_x}) {
      out.push_back(t);
    }
    for (NodeKind k : {NodeKind::kAttention, NodeKind::kDispatch, NodeKind::kExperts,
                       NodeKind::kSharedExpert, NodeKind::kCombine, NodeKind::kMlp}) {
      for (const Tensor* t : saved_tensors(k, m.layer)) out.push_back(t);
    }
  }
  return out;
}

std::vector<int32_t> host_ints(const Tensor& t) {
  TANDEM_ASSERT(t.dtype() == DType::kI32);
  const Tensor host = t.device() == Device::kCPU ? t : t.to(Device::kCPU);
  const int32_t* p = host.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

}  // namespace tandem::model
