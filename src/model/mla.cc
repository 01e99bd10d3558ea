// Multi-head latent attention's q, k and v (docs/model.md "Multi-head latent attention"): the
// latents and their norms, the products out of them, and the op that lays the heads out and
// rotates their RoPE parts; then their backward. The attention itself, the out-projection and
// the rest of the node are attention_node.cc's.
#include "model/nodes.h"
#include "ops/ops.h"

namespace tandem::model {

using ops::Accumulate;

// Wkv_a's rows: the latent's [0, rkv), k's rope part [rkv, rkv + dr).
static Tensor latent_rows(const Tensor& wkv_a, const ModelConfig& cfg) {
  return wkv_a.narrow_rows(0, cfg.kv_lora_rank);
}
static Tensor rope_rows(const Tensor& wkv_a, const ModelConfig& cfg) {
  return wkv_a.narrow_rows(cfg.kv_lora_rank, cfg.qk_pos_emb_head_dim);
}

void mla_forward(AttentionSaved& s, const LayerWeights& w, const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), heads = cfg.num_attention_heads, rq = cfg.q_lora_rank;
  const int64_t rkv = cfg.kv_lora_rank, dr = cfg.qk_pos_emb_head_dim;
  Tensor q_in = work_tensor({n, cfg.q_width()}, c.dtype, "mla.q_in");  // (N, heads*(dn+dr))
  if (rq > 0) {
    s.cq = saved_tensor({n, rq}, c.dtype, "mla.cq");
    s.rstd_cq = saved_tensor({n}, c.stat_dtype(), "mla.rstd_cq");
    s.cqn = saved_tensor({n, rq}, c.dtype, "mla.cqn");
    ops::linear_forward(s.cq, s.n1, w.wq_a);
    ops::rmsnorm_forward(s.cqn, s.rstd_cq, s.cq, w.q_a_norm, cfg.norm_epsilon);
    ops::linear_forward(q_in, s.cqn, w.wq_b);
  } else {
    ops::linear_forward(q_in, s.n1, w.wq);
  }
  s.ckv = saved_tensor({n, rkv}, c.dtype, "mla.ckv");
  s.rstd_ckv = saved_tensor({n}, c.stat_dtype(), "mla.rstd_ckv");
  s.ckvn = saved_tensor({n, rkv}, c.dtype, "mla.ckvn");
  Tensor k_rope = work_tensor({n, dr}, c.dtype, "mla.k_rope");
  ops::linear_forward(s.ckv, s.n1, latent_rows(w.wkv_a, cfg));
  ops::linear_forward(k_rope, s.n1, rope_rows(w.wkv_a, cfg));
  ops::rmsnorm_forward(s.ckvn, s.rstd_ckv, s.ckv, w.kv_a_norm, cfg.norm_epsilon);
  Tensor kv = work_tensor({n, heads * (cfg.qk_head_dim + cfg.v_head_dim)}, c.dtype, "mla.kv");
  ops::linear_forward(kv, s.ckvn, w.wkv_b);
  s.q = saved_tensor({n, cfg.q_width()}, c.dtype, "attn.q");
  s.k = saved_tensor({n, cfg.kv_width()}, c.dtype, "attn.k");
  s.v = saved_tensor({n, cfg.attn_out_width()}, c.dtype, "attn.v");
  ops::mla_qkv_forward_at(s.q, s.k, s.v, q_in, kv, k_rope, c.seq, heads, cfg.qk_head_dim, dr,
                          cfg.v_head_dim, cfg.rope(), c.positions);
}

Tensor mla_backward(AttentionSaved& s, const LayerWeights& w, const LayerWeights& g,
                    const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), h = cfg.hidden_size, heads = cfg.num_attention_heads;
  const int64_t rq = cfg.q_lora_rank, dr = cfg.qk_pos_emb_head_dim;
  s.d_q_in = work_tensor({n, cfg.q_width()}, c.dtype, "d_mla_q_in");
  s.d_kv = work_tensor({n, heads * (cfg.qk_head_dim + cfg.v_head_dim)}, c.dtype, "d_mla_kv");
  s.d_k_rope = work_tensor({n, dr}, c.dtype, "d_mla_k_rope");
  ops::mla_qkv_backward_at(s.d_q_in, s.d_kv, s.d_k_rope, s.d_q, s.d_k, s.d_v, c.seq, heads,
                           cfg.qk_head_dim, dr, cfg.v_head_dim, cfg.rope(), c.positions);
  s.d_q = Tensor();
  s.d_k = Tensor();
  s.d_v = Tensor();
  Tensor d_n1 = work_tensor({n, h}, c.dtype, "d_n1");
  // The kv latent: d ckvn = d_kv @ Wkv_b, through its norm.
  Tensor d_ckvn = work_tensor({n, cfg.kv_lora_rank}, c.dtype, "d_mla_ckvn");
  ops::linear_backward_input(d_ckvn, s.d_kv, w.wkv_b);
  s.d_ckv = work_tensor({n, cfg.kv_lora_rank}, c.dtype, "d_mla_ckv");
  ops::rmsnorm_backward(s.d_ckv, g.kv_a_norm, d_ckvn, s.ckv, w.kv_a_norm, s.rstd_ckv,
                        Accumulate::kOverwrite);
  ops::linear_backward_input(d_n1, s.d_ckv, latent_rows(w.wkv_a, cfg));
  ops::linear_backward_input(d_n1, s.d_k_rope, rope_rows(w.wkv_a, cfg), Accumulate::kAdd);
  if (rq > 0) {
    Tensor d_cqn = work_tensor({n, rq}, c.dtype, "d_mla_cqn");
    ops::linear_backward_input(d_cqn, s.d_q_in, w.wq_b);
    s.d_cq = work_tensor({n, rq}, c.dtype, "d_mla_cq");
    ops::rmsnorm_backward(s.d_cq, g.q_a_norm, d_cqn, s.cq, w.q_a_norm, s.rstd_cq,
                          Accumulate::kOverwrite);
    ops::linear_backward_input(d_n1, s.d_cq, w.wq_a, Accumulate::kAdd);
  } else {
    ops::linear_backward_input(d_n1, s.d_q_in, w.wq, Accumulate::kAdd);
  }
  return d_n1;
}

void mla_backward_weights(AttentionSaved& s, const LayerWeights& g) {
  const int64_t rkv = s.ckvn.size(1);
  ops::linear_backward_weight(g.wkv_b, s.d_kv, s.ckvn);
  ops::linear_backward_weight(g.wkv_a.narrow_rows(0, rkv), s.d_ckv, s.n1);
  ops::linear_backward_weight(g.wkv_a.narrow_rows(rkv, s.d_k_rope.size(1)), s.d_k_rope, s.n1);
  if (s.cqn.defined()) {
    ops::linear_backward_weight(g.wq_b, s.d_q_in, s.cqn);
    ops::linear_backward_weight(g.wq_a, s.d_cq, s.n1);
  } else {
    ops::linear_backward_weight(g.wq, s.d_q_in, s.n1);
  }
  release_storage({&s.cqn, &s.ckvn});
}

}  // namespace tandem::model
