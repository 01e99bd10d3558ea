// Multi-token prediction (DeepSeek-V3's MTP modules, as Megatron-LM trains them; docs/model.md
// "Multi-token prediction"), run inside the loss node of the last stage. Module k (1-based) of D:
//   e    = E_tok[ids shifted k left within each sequence, 0 past its end]
//   x    = [rmsnorm(e, g_enorm) | rmsnorm(h_{k-1}, g_hnorm)] @ W_eh^T     h_0: the main head's nf
//   y    = the module's transformer layer (attention, then mlp or the MoE nodes) of x
//   h_k  = rmsnorm(y, g_final_k)
//   L_k  = mean over the rows with a target (positions i < T - k) of cross_entropy(h_k W_out^T,
//          the token k + 1 ahead)
// and the step's loss adds mtp_loss_scaling_factor / D times the sum of the L_k. The embedding
// and the LM head are the main model's (their gradients add to theirs).
//
// Note [MTP loss mask]: with Megatron-LM's document masking the modules see what its
// multi_token_prediction.py gives them. The ids, the labels and the loss mask are rolled k left
// (0 past the sequence's end); the attention mask and the RoPE positions are not rolled (the
// module's layer takes the main layers' attention mask and rotary embedding), so the layer reads
// NodeContext's key_begin and positions as the model's layers do. With --eod-mask-loss, L_k is
// the mean over the rows whose rolled mask is 1: row i of a sequence weighs mask[i + k], and
// the divisor is their count n_k (counted on the host, NodeContext::mtp_loss_tokens), at least
// 1 as Megatron-LM clamps it. With --calculate-per-token-loss Megatron-LM weighs depth k's sum by
// n / (n_k G), n the micro-batch's own tokens of weight 1 and G the global batch's over its
// micro-batches (NodeContext::per_token_divisor): the same as the mean without a loss mask.
//
// Note [MTP rows by copies]: the shifted ids, the concatenation [e | h], the rows with a target
// and their targets are all row copies (ops::copy_row_blocks: one launch on the GPU), so the
// modules need no kernel of their own. [N, 2H] viewed as [2N, H] has the embedding's rows at
// 2n and h's at 2n + 1.
#include <algorithm>
#include <utility>
#include <vector>

#include "model/nodes.h"
#include "ops/ops.h"
#include "ops/row_blocks.h"

namespace tandem::model {

using ops::Accumulate;
using ops::RowBlock;

namespace {

// The blocks that take rows [off, T) of each of the B sequences of T rows to rows [0, T - off) of
// a sequence of `to_len` rows (to_len T: in place of the sequence; T - k: packed).
std::vector<RowBlock> shifted_blocks(int64_t batch, int64_t seq, int64_t off, int64_t rows,
                                     int64_t to_len) {
  std::vector<RowBlock> blocks;
  for (int64_t b = 0; b < batch; ++b) blocks.push_back({b * seq + off, b * to_len, rows});
  return blocks;
}

// Rows of `in` [N, H] to every other row of `out` [N, 2H] viewed as [2N, H], from `first`.
void to_half(const Tensor& out, const Tensor& in, int64_t first) {
  const int64_t n = in.size(0), h = in.size(1);
  std::vector<RowBlock> blocks;
  blocks.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) blocks.push_back({i, 2 * i + first, 1});
  ops::copy_row_blocks(out.reshape({2 * n, h}), in, blocks);
}

// The reverse: every other row of `in` [N, 2H] from `first` to `out` [N, H].
void from_half(const Tensor& out, const Tensor& in, int64_t first) {
  const int64_t n = out.size(0), h = out.size(1);
  std::vector<RowBlock> blocks;
  blocks.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) blocks.push_back({2 * i + first, i, 1});
  ops::copy_row_blocks(out, in.reshape({2 * n, h}), blocks);
}

// The module's layer sees the context of the model's layers, but merges no expert gradients
// across micro-batches (its own product each pass).
NodeContext layer_context(const NodeContext& c) {
  NodeContext l = c;
  l.merged_expert_grads = nullptr;
  return l;
}

void layer_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  attention_forward(a, w, c);
  if (!w.moe()) {
    mlp_forward(a, w, c);
    return;
  }
  dispatch_forward(a, c);
  if (c.cfg.has_shared_expert()) shared_expert_forward(a, w, c);
  experts_forward(a, w, c);
  combine_forward(a, c);
}

// The chunk's backward order of the layer's nodes, input gradients only.
void layer_backward(LayerActs& a, const LayerWeights& w, const LayerWeights& g,
                    const NodeContext& c) {
  if (!w.moe()) {
    mlp_backward(a, w, c);
  } else {
    combine_backward(a, c);
    experts_backward(a, w, c);
    if (c.cfg.has_shared_expert()) shared_expert_backward(a, w, c);
    dispatch_backward(a, c);
  }
  attention_backward(a, w, g, c);
}

void layer_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext& c,
                            int64_t layer) {
  if (!g.moe()) {
    mlp_backward_weights(a, g, c);
  } else {
    experts_backward_weights(a, g, c, layer);
    if (c.cfg.has_shared_expert()) shared_expert_backward_weights(a, g, c);
  }
  attention_backward_weights(a, g, c);
}

// Note [MTP loss mask]: the weight of each row of depth k's summed cross-entropy.
double row_weight(const NodeContext& c, int64_t k, int64_t nv) {
  const double kept = c.loss_mask.defined()
                          ? static_cast<double>(c.mtp_loss_tokens[static_cast<size_t>(k - 1)])
                          : static_cast<double>(nv);
  const double clamped = std::max(kept, 1.0);
  if (c.per_token_divisor < 0) return 1.0 / clamped;
  return c.own_loss_tokens() / (clamped * c.per_token_divisor);
}

// Depth k's rolled loss mask over its rows with a target [Nv] f32 (Note [MTP loss mask]); undefined
// without a loss mask. An op temporary, formed again where the backward needs it.
Tensor rolled_mask(const NodeContext& c, int64_t k) {
  if (!c.loss_mask.defined()) return Tensor();
  const int64_t b = c.batch, t = c.seq, valid = t - k;
  TANDEM_ASSERT(static_cast<int64_t>(c.mtp_loss_tokens.size()) >= k,
                "the MTP modules need the rolled loss masks' counts");
  Tensor m = work_tensor({b * valid}, DType::kF32, "mtp.loss_mask");
  ops::copy_row_blocks(m, c.loss_mask, shifted_blocks(b, t, k, valid, valid));
  return m;
}

}  // namespace

bool mtp_runs(const NodeContext& c) { return c.mtp && c.cfg.has_mtp(); }

void mtp_forward(LossActs& a, const Tensor& targets, const ModelWeights& w, const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), h = cfg.hidden_size, t = c.seq, b = c.batch;
  const NodeContext lc = layer_context(c);
  TANDEM_ASSERT(static_cast<int64_t>(w.mtp.size()) == cfg.mtp_num_layers && w.embed.defined(),
                "the MTP modules need the chunk to hold them and the embedding");
  Tensor tgt = work_tensor({n}, DType::kI32, "mtp.targets_all");
  tgt.copy_from(targets);
  a.mtp.assign(static_cast<size_t>(cfg.mtp_num_layers), MtpActs{});
  const double scale = cfg.mtp_loss_scaling_factor / static_cast<double>(cfg.mtp_num_layers);
  for (int64_t j = 0; j < cfg.mtp_num_layers; ++j) {
    MtpActs& m = a.mtp[static_cast<size_t>(j)];
    const MtpWeights& mw = w.mtp[static_cast<size_t>(j)];
    const int64_t k = j + 1, valid = t - k, nv = b * valid;
    // The token k ahead of position i is the target of position i + k - 1.
    m.ids = saved_tensor({n}, DType::kI32, "mtp.ids");
    m.ids.zero_();
    ops::copy_row_blocks(m.ids, tgt, shifted_blocks(b, t, k - 1, valid, t));
    m.e = saved_tensor({n, h}, c.dtype, "mtp.e");
    ops::embedding_forward(m.e, m.ids, w.embed);
    m.rstd_e = saved_tensor({n}, c.stat_dtype(), "mtp.rstd_e");
    m.rstd_h = saved_tensor({n}, c.stat_dtype(), "mtp.rstd_h");
    m.cat = saved_tensor({n, 2 * h}, c.dtype, "mtp.cat");
    {
      Tensor normed = work_tensor({n, h}, c.dtype, "mtp.normed");
      ops::rmsnorm_forward(normed, m.rstd_e, m.e, mw.enorm, cfg.norm_epsilon);
      to_half(m.cat, normed, 0);
      m.h_in = j == 0 ? a.nf : a.mtp[static_cast<size_t>(j - 1)].hk;
      ops::rmsnorm_forward(normed, m.rstd_h, m.h_in, mw.hnorm, cfg.norm_epsilon);
      to_half(m.cat, normed, 1);
    }
    LayerActs& la = m.layer;
    la.x = work_tensor({n, h}, c.dtype, "mtp.x");  // handed to the layer (Note [Hand-over])
    ops::linear_forward(la.x, m.cat, mw.eh_proj);
    la.layer = cfg.num_layers + j;
    layer_forward(la, mw.layer, lc);
    m.y = std::exchange(la.out, Tensor());
    adopt_as_activation(m.y);
    // The last depth's output feeds only its head: an op temporary.
    const bool last = k == cfg.mtp_num_layers;
    m.hk = (last ? work_tensor : saved_tensor)({n, h}, c.dtype, "mtp.hk");
    m.rstd_f = saved_tensor({n}, c.stat_dtype(), "mtp.rstd_f");
    ops::rmsnorm_forward(m.hk, m.rstd_f, m.y, mw.final_norm, cfg.norm_epsilon);
    const std::vector<RowBlock> rows = shifted_blocks(b, t, 0, valid, valid);
    const bool grads_now = c.fused_lm_head && c.grads != nullptr;
    m.hv = (grads_now ? work_tensor : saved_tensor)({nv, h}, c.dtype, "mtp.hv");
    ops::copy_row_blocks(m.hv, m.hk, rows);
    if (last) {
      release_storage({&m.hk});
      m.hk = Tensor();
    }
    m.targets = (grads_now ? work_tensor : saved_tensor)({nv}, DType::kI32, "mtp.tk");
    ops::copy_row_blocks(m.targets, tgt, shifted_blocks(b, t, k, valid, valid));
    const double per_row = row_weight(c, k, nv);
    Tensor mask = rolled_mask(c, k);  // Note [MTP loss mask]
    if (grads_now) {
      // As the main head (Note [Loss gradient in the forward] in end_nodes.cc): the head's
      // gradients at once, d_hv kept for the backward.
      Tensor lse = work_tensor({nv}, c.stat_dtype(), "mtp.lse");
      m.d_hv = saved_tensor({nv, h}, c.dtype, "mtp.d_hv");
      m.loss = ops::lm_head_ce_forward_backward_masked(
                   m.d_hv, c.grads->lm_head, lse, m.hv, w.lm_head, m.targets,
                   c.loss_scale * scale * per_row, mask, Accumulate::kAdd)
                   .then([per_row](double sum) { return sum * per_row; });
      release_storage({&m.hv, &m.targets});
      m.hv = m.targets = Tensor();
    } else if (c.fused_lm_head) {
      m.lse = saved_tensor({nv}, c.stat_dtype(), "mtp.lse");
      m.loss = ops::PendingScalar(
          ops::lm_head_ce_forward_masked(m.lse, m.hv, w.lm_head, m.targets, mask) * per_row);
    } else {
      m.logits = saved_tensor({nv, cfg.vocab_size}, c.dtype, "mtp.logits");
      ops::linear_forward(m.logits, m.hv, w.lm_head);
      m.loss = ops::PendingScalar(ops::cross_entropy_forward_masked(m.logits, m.targets, mask) *
                                  per_row);
    }
    if (mask.defined()) release_storage({&mask});
  }
  release_storage({&tgt});
}

Tensor mtp_backward(LossActs& a, const ModelWeights& w, const ModelWeights& g,
                    const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), h = cfg.hidden_size, t = c.seq, b = c.batch;
  const NodeContext lc = layer_context(c);
  const double scale = cfg.mtp_loss_scaling_factor / static_cast<double>(cfg.mtp_num_layers);
  Tensor d_next;  // the gradient at the next depth's h_in: this depth's output hk
  for (int64_t j = cfg.mtp_num_layers; j-- > 0;) {
    MtpActs& m = a.mtp[static_cast<size_t>(j)];
    const MtpWeights& mw = w.mtp[static_cast<size_t>(j)];
    MtpWeights& mg = const_cast<MtpWeights&>(g.mtp[static_cast<size_t>(j)]);
    const int64_t k = j + 1, valid = t - k, nv = b * valid;
    const double grad_scale = c.loss_scale * scale * row_weight(c, k, nv);
    Tensor d_hv;
    if (m.d_hv.defined()) {
      d_hv = std::exchange(m.d_hv, Tensor());
    } else if (c.fused_lm_head) {
      Tensor mask = rolled_mask(c, k);
      d_hv = work_tensor({nv, h}, c.dtype, "mtp.d_hv");
      ops::lm_head_ce_backward_masked(d_hv, g.lm_head, m.hv, w.lm_head, m.targets, m.lse,
                                      grad_scale, mask, Accumulate::kAdd);
      release_storage({&m.hv, &m.lse, &m.targets});
      if (mask.defined()) release_storage({&mask});
    } else {
      // dlogits overwrite the logits; they and hv stay for the LM head's weight gradient.
      Tensor mask = rolled_mask(c, k);
      ops::cross_entropy_backward_masked(m.logits, m.logits, m.targets, grad_scale, mask);
      d_hv = work_tensor({nv, h}, c.dtype, "mtp.d_hv");
      ops::linear_backward_input(d_hv, m.logits, w.lm_head);
      release_storage({&m.targets});
      if (mask.defined()) release_storage({&mask});
    }
    Tensor d_hk;
    if (d_next.defined()) {
      d_hk = std::exchange(d_next, Tensor());
      Tensor rows = work_tensor({nv, h}, c.dtype, "mtp.d_rows");
      ops::copy_row_blocks(rows, d_hk, shifted_blocks(b, t, 0, valid, valid));
      ops::axpy(rows, d_hv, 1.0);
      ops::copy_row_blocks(d_hk, rows, shifted_blocks(b, valid, 0, valid, t));
      release_storage({&rows});
    } else {
      d_hk = work_tensor({n, h}, c.dtype, "mtp.d_hk");
      d_hk.zero_();
      ops::copy_row_blocks(d_hk, d_hv, shifted_blocks(b, valid, 0, valid, t));
    }
    release_storage({&d_hv});
    LayerActs& la = m.layer;
    la.d_out = work_tensor({n, h}, c.dtype, "mtp.d_y");
    ops::rmsnorm_backward(la.d_out, mg.final_norm, d_hk, m.y, mw.final_norm, m.rstd_f,
                          Accumulate::kOverwrite);
    release_storage({&d_hk, &m.y, &m.rstd_f});
    layer_backward(la, mw.layer, mg.layer, lc);
    m.d_x = std::exchange(la.d_x, Tensor());  // kept for eh_proj's weight gradient
    Tensor d_cat = work_tensor({n, 2 * h}, c.dtype, "mtp.d_cat");
    ops::linear_backward_input(d_cat, m.d_x, mw.eh_proj);
    Tensor d_half = work_tensor({n, h}, c.dtype, "mtp.d_half");
    from_half(d_half, d_cat, 0);
    Tensor d_e = work_tensor({n, h}, c.dtype, "mtp.d_e");
    ops::rmsnorm_backward(d_e, mg.enorm, d_half, m.e, mw.enorm, m.rstd_e, Accumulate::kOverwrite);
    ops::embedding_backward(g.embed, d_e, m.ids);
    release_storage({&d_e, &m.e, &m.rstd_e, &m.ids});
    from_half(d_half, d_cat, 1);
    release_storage({&d_cat});
    d_next = work_tensor({n, h}, c.dtype, "mtp.d_h_in");
    ops::rmsnorm_backward(d_next, mg.hnorm, d_half, m.h_in, mw.hnorm, m.rstd_h,
                          Accumulate::kOverwrite);
    release_storage({&d_half, &m.rstd_h});
    // h_in is the previous depth's output (freed here) or the main head's nf (the loss node's).
    if (j > 0) release_storage({&m.h_in});
    m.h_in = Tensor();
  }
  return d_next;  // the gradient at nf
}

void mtp_backward_weights(LossActs& a, const ModelWeights& g, const NodeContext& c) {
  const NodeContext lc = layer_context(c);
  for (int64_t j = c.cfg.mtp_num_layers; j-- > 0;) {
    MtpActs& m = a.mtp[static_cast<size_t>(j)];
    const MtpWeights& mg = g.mtp[static_cast<size_t>(j)];
    if (m.logits.defined()) ops::linear_backward_weight(g.lm_head, m.logits, m.hv);
    release_storage({&m.logits, &m.hv});
    layer_backward_weights(m.layer, mg.layer, lc, c.cfg.num_layers + j);
    ops::linear_backward_weight(mg.eh_proj, m.d_x, m.cat);
    release_storage({&m.d_x, &m.cat});
  }
  a.mtp.clear();
}

}  // namespace tandem::model
