// The attention node: norm, q/k/v, rope, causal GQA attention, out-projection, residual,
// post-attention norm and, for MoE layers, the router and the permutation of tokens by expert.
#include <string>
#include <utility>

#include "comm/communicator.h"
#include "core/rng.h"
#include "model/nodes.h"
#include "ops/ops.h"

namespace tandem::model {

using ops::Accumulate;

// Note [Forced load balancing]: --moe-router-force-load-balancing (benchmarks only, as
// Megatron-LM's flag of that name) replaces the router's logits by standard normal draws before
// anything reads them, as Megatron-LM's apply_random_logits does: the choice, the routing weights
// and the router's losses read the random logits, and their gradient reaches the router's own
// logits unchanged (a straight-through estimator), so the router still trains. Each draw is a
// counter-based function of (seed, iteration, the micro-batch's place in the global batch, layer,
// token, expert) (NodeContext::routing_key), so it is the same on every layout and on both
// backends (up to the last bit of the GPU's log and cos). Every expert then receives about
// N k / E rows, a multinomial's spread around it; with --moe-expert-capacity-factor 1 and
// --moe-pad-expert-input-to-capacity exactly ceil(N k / E) (Note [Expert capacity] in
// core/footprint.h), which makes every expert rank's work and every size the same.
uint64_t routing_key(uint64_t seed, int64_t iteration, int64_t global_microbatch) {
  const uint64_t stream = splitmix64(seed ^ hash_name("router.random_logits"));
  const uint64_t step = splitmix64(stream ^ splitmix64(static_cast<uint64_t>(iteration)));
  return splitmix64(step ^ splitmix64(static_cast<uint64_t>(global_microbatch) + 1));
}

static uint64_t layer_routing_key(const NodeContext& c, int64_t layer) {
  return splitmix64(c.routing_key ^ splitmix64(static_cast<uint64_t>(layer) + 1));
}

// How the router chooses and weights. Megatron-LM normalises the sigmoid router's weights of
// k > 1 experts and never one expert's; --moe-router-pre-softmax is the softmax router's only.
static ops::RouterSpec router_spec(const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  ops::RouterSpec r;
  if (cfg.sigmoid_router()) {
    r.score =
        cfg.moe_router_topk > 1 ? ops::RouterScore::kSigmoidNormalized : ops::RouterScore::kSigmoid;
    r.groups = cfg.moe_router_num_groups;
    r.group_topk = cfg.moe_router_group_topk;
    r.scaling = cfg.moe_router_topk_scaling_factor;
  } else {
    r.score = cfg.moe_router_pre_softmax ? ops::RouterScore::kSoftmaxOfAll
                                         : ops::RouterScore::kSoftmaxOfSelected;
  }
  return r;
}

// The router's losses as Megatron-LM weights them (docs/model.md "Load balancing"): the switch
// loss coeff E / (k T^2) sum_e P_e C_e over T tokens, T the micro-batch's N (aux_loss), each
// sequence's (seq_aux_loss, then the mean over the B sequences), or the N tokens of every
// data-parallel rank (global_aux_loss); the z-loss's mean over the N tokens.
static ops::RouterLoss router_loss(const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  ops::RouterLoss loss;
  loss.normalized = cfg.sigmoid_router();
  const double n = static_cast<double>(c.tokens());
  if (cfg.has_balance_loss()) {
    const std::string& type = cfg.moe_router_load_balancing_type;
    const double dp = c.dp != nullptr ? static_cast<double>(c.dp->size()) : 1.0;
    const double t = type == "seq_aux_loss"      ? static_cast<double>(c.seq)
                     : type == "global_aux_loss" ? n * dp
                                                 : n;
    const double sequences = type == "seq_aux_loss" ? static_cast<double>(c.batch) : 1.0;
    loss.balance = cfg.moe_aux_loss_coeff * static_cast<double>(cfg.num_experts) /
                   (static_cast<double>(cfg.moe_router_topk) * t * t) / sequences;
  }
  loss.z = cfg.moe_z_loss_coeff / n;
  return loss;
}

// The load-balancing loss's counts (Megatron-LM's: the top k of the scores, without bias or
// groups, before any token is dropped): per sequence for seq_aux_loss; for global_aux_loss
// summed over the data-parallel group and then the running mean over the step's micro-batches
// (ops::router_aux_running_mean).
static void balance_counts(AttentionSaved& s, const LayerWeights& w, const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const bool per_sequence = cfg.moe_router_load_balancing_type == "seq_aux_loss";
  s.aux_counts = saved_tensor({per_sequence ? c.batch : 1, cfg.num_experts}, c.stat_dtype(),
                              "attn.aux_counts");
  ops::router_aux_counts(s.aux_counts, s.probs, cfg.moe_router_topk);
  if (!cfg.has_global_balance_loss()) return;
  if (c.dp != nullptr && c.dp->size() > 1) c.dp->all_reduce_sum(s.aux_counts);
  // Without totals (a chunk's forward outside a trainer) a micro-batch's own counts are the mean.
  if (w.aux_total.defined()) ops::router_aux_running_mean(s.aux_counts, w.aux_total);
}

// moe_permutation's capacity (Note [Expert capacity] in core/footprint.h).
static ops::MoeCapacity expert_capacity(const NodeContext& c) {
  ops::MoeCapacity cap;
  cap.capacity = moe_expert_capacity(c.cfg, c.tokens());
  cap.policy = c.cfg.moe_token_drop_policy == "position" ? ops::TokenDropPolicy::kPosition
                                                         : ops::TokenDropPolicy::kProbs;
  cap.pad = c.cfg.moe_pad_expert_input_to_capacity;
  cap.seq = c.seq;
  return cap;
}

// The attention's shape: q and k heads of qk_dim, v heads of v_dim, MLA's softmax scale.
static ops::AttentionShape attention_shape(const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  ops::AttentionShape s{c.batch, c.seq, cfg.num_attention_heads, cfg.num_query_groups,
                        cfg.qk_dim()};
  s.key_begin = c.key_begin;
  if (cfg.multi_latent_attention) {
    s.v_head_dim = cfg.v_dim();
    s.scale = cfg.softmax_scale();
  }
  return s;
}

void tp_row_parallel_forward(const Tensor& out, const Tensor& in, const Tensor& w,
                             const Tensor& residual, const NodeContext& c) {
  if (c.tp == nullptr || c.tp->rank() == 0) {
    ops::linear_forward_residual(out, in, w, residual);
  } else {
    ops::linear_forward(out, in, w);
  }
  if (c.tp != nullptr) c.tp->all_reduce_sum(out);
}

void tp_input_grad_reduce(const Tensor& d_in, const NodeContext& c) {
  if (c.tp != nullptr) c.tp->all_reduce_sum(d_in);
}

// Rows of one head: a [N, heads * D] tensor viewed as [N * heads, D].
static Tensor heads_as_rows(const Tensor& t, int64_t head_dim) {
  return t.reshape({t.numel() / head_dim, head_dim});
}

// --qk-layernorm: q = rmsnorm(q_raw) and k = rmsnorm(k_raw), each head its own row, with the
// gains q_norm, k_norm [D] (Qwen3).
static void qk_norm_forward(AttentionSaved& s, const LayerWeights& w, const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), d = cfg.head_dim();
  s.rstd_q = saved_tensor({n * cfg.num_attention_heads}, c.stat_dtype(), "attn.rstd_q");
  s.rstd_k = saved_tensor({n * cfg.num_query_groups}, c.stat_dtype(), "attn.rstd_k");
  ops::rmsnorm_forward(heads_as_rows(s.q, d), s.rstd_q, heads_as_rows(s.q_raw, d), w.q_norm,
                       cfg.norm_epsilon);
  ops::rmsnorm_forward(heads_as_rows(s.k, d), s.rstd_k, heads_as_rows(s.k_raw, d), w.k_norm,
                       cfg.norm_epsilon);
}

// d_q and d_k from the normed q and k's gradients to the raw ones' (the gains' gradients
// added to g); the products' weight gradients then read the raw ones'.
static void qk_norm_backward(AttentionSaved& s, const LayerWeights& w, const LayerWeights& g,
                             const NodeContext& c) {
  const int64_t d = c.cfg.head_dim();
  Tensor d_q = work_tensor(s.d_q.shape(), c.dtype, "d_q_raw");
  Tensor d_k = work_tensor(s.d_k.shape(), c.dtype, "d_k_raw");
  ops::rmsnorm_backward(heads_as_rows(d_q, d), g.q_norm, heads_as_rows(s.d_q, d),
                        heads_as_rows(s.q_raw, d), w.q_norm, s.rstd_q, Accumulate::kOverwrite);
  ops::rmsnorm_backward(heads_as_rows(d_k, d), g.k_norm, heads_as_rows(s.d_k, d),
                        heads_as_rows(s.k_raw, d), w.k_norm, s.rstd_k, Accumulate::kOverwrite);
  s.d_q = std::move(d_q);
  s.d_k = std::move(d_k);
}

// q, k and v of grouped-query attention, from n1: products (with biases), q/k norms, RoPE.
static void gqa_forward(AttentionSaved& s, const LayerWeights& w, const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens();
  s.q = saved_tensor({n, cfg.q_width()}, c.dtype, "attn.q");   // (N, heads*D)
  s.k = saved_tensor({n, cfg.kv_width()}, c.dtype, "attn.k");  // (N, kv*D)
  s.v = saved_tensor({n, cfg.kv_width()}, c.dtype, "attn.v");
  // With --qk-layernorm the products land in q_raw and k_raw, kept for the norms' backward.
  if (cfg.qk_layernorm) {
    s.q_raw = saved_tensor({n, cfg.q_width()}, c.dtype, "attn.q_raw");
    s.k_raw = saved_tensor({n, cfg.kv_width()}, c.dtype, "attn.k_raw");
  }
  const Tensor& q_out = cfg.qk_layernorm ? s.q_raw : s.q;
  const Tensor& k_out = cfg.qk_layernorm ? s.k_raw : s.k;
  ops::linear_forward(q_out, s.n1, w.wq);
  ops::linear_forward(k_out, s.n1, w.wk);
  ops::linear_forward(s.v, s.n1, w.wv);
  if (w.bq.defined()) {  // --add-qkv-bias
    ops::bias_forward(q_out, w.bq);
    ops::bias_forward(k_out, w.bk);
    ops::bias_forward(s.v, w.bv);
  }
  if (cfg.qk_layernorm) qk_norm_forward(s, w, c);
  ops::rope_forward_qk_at(s.q, s.k, c.seq, cfg.num_attention_heads, cfg.num_query_groups,
                          cfg.head_dim(), cfg.rope(), c.positions);
}

void attention_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), h = cfg.hidden_size;
  AttentionSaved& s = a.attn;
  s.x = a.x;                 // (N, H)
  adopt_as_activation(s.x);  // Note [Hand-over]
  s.n1 = saved_tensor({n, h}, c.dtype, "attn.n1");
  s.rstd1 = saved_tensor({n}, c.stat_dtype(), "attn.rstd1");
  ops::rmsnorm_forward(s.n1, s.rstd1, s.x, w.input_norm, cfg.norm_epsilon);
  if (cfg.multi_latent_attention) {
    mla_forward(s, w, c);
  } else {
    gqa_forward(s, w, c);
  }
  s.a = saved_tensor({n, cfg.attn_out_width()}, c.dtype, "attn.a");
  s.lse = saved_tensor({c.batch, cfg.num_attention_heads, c.seq}, c.stat_dtype(), "attn.lse");
  ops::attention_forward(s.a, s.lse, s.q, s.k, s.v, attention_shape(c));
  s.h1 = saved_tensor({n, h}, c.dtype, "attn.h1");
  tp_row_parallel_forward(s.h1, s.a, w.wo, s.x, c);  // + the residual x
  s.n2 = saved_tensor({n, h}, c.dtype, "attn.n2");
  s.rstd2 = saved_tensor({n}, c.stat_dtype(), "attn.rstd2");
  ops::rmsnorm_forward(s.n2, s.rstd2, s.h1, w.post_norm, cfg.norm_epsilon);
  a.h1 = s.h1;
  if (!w.moe()) return;

  const int64_t e = cfg.num_experts, k = cfg.moe_router_topk;
  const ops::RouterLoss loss = router_loss(c);
  // With a z-loss the backward reads the logits again.
  const auto make = loss.z != 0 ? saved_tensor : work_tensor;
  Tensor logits = make({n, e}, c.stat_dtype(), "attn.router_logits");
  ops::linear_forward(logits, s.n2, w.router);
  if (c.force_balanced_routing) {  // Note [Forced load balancing]
    ops::router_random_logits(logits, layer_routing_key(c, a.layer), 0);
  }
  if (loss.z != 0) s.logits = logits;
  s.topk_idx = saved_tensor({n, k}, DType::kI32, "attn.topk_idx");
  s.topk_w = saved_tensor({n, k}, c.stat_dtype(), "attn.topk_w");
  s.probs = saved_tensor({n, e}, c.stat_dtype(), "attn.probs");
  ops::router_forward(s.topk_idx, s.topk_w, s.probs, logits, router_spec(c), w.expert_bias);
  if (loss.balance != 0) balance_counts(s, w, c);
  const int64_t slots = moe_routed_rows(cfg, n);  // Note [Expert capacity]
  s.counts = saved_tensor({e}, DType::kI32, "attn.counts");
  s.perm = saved_tensor({slots}, DType::kI32, "attn.perm");
  ops::moe_permutation(s.perm, s.counts, s.topk_idx, s.topk_w, e, w.expert_slot,
                       expert_capacity(c));              // by place
  s.counts_read = std::make_shared<HostRead>(s.counts);  // Note [Routing counts on the host]
  a.aux_loss = loss.balance != 0 || loss.z != 0
                   ? ops::router_loss_start(s.probs, s.aux_counts, s.logits, loss)
                   : ops::PendingScalar(0.0);
  a.routed = work_tensor({slots, h}, c.dtype, "routed");  // handed to dispatch
  ops::permute_forward(a.routed, s.n2, s.perm, k);
}

// Gradient at n2: from the routed rows, the router and a shared expert (MoE) or from the mlp
// (dense); a shared expert's backward has left its part in d_n2, which the rest is added to.
static Tensor post_norm_input_grad(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  AttentionSaved& s = a.attn;
  if (!w.moe()) return std::exchange(a.d_n2, Tensor());
  const int64_t n = c.tokens(), k = cfg.moe_router_topk;
  const bool shared = a.d_n2.defined();
  Tensor d_n2 =
      shared ? std::exchange(a.d_n2, Tensor()) : work_tensor({n, cfg.hidden_size}, c.dtype, "d_n2");
  ops::permute_backward(d_n2, a.d_routed, s.perm, k,
                        shared ? Accumulate::kAdd : Accumulate::kOverwrite);
  s.d_logits = work_tensor({n, cfg.num_experts}, c.dtype, "d_router_logits");
  ops::router_backward(s.d_logits, a.d_topk_w, s.topk_idx, s.topk_w, s.probs, s.aux_counts,
                       s.logits, router_spec(c), router_loss(c), c.loss_scale);
  ops::linear_backward_input(d_n2, s.d_logits, w.router, Accumulate::kAdd);
  a.d_routed = Tensor();
  a.d_topk_w = Tensor();
  return d_n2;
}

// The gradient at n1 of gqa_forward's q, k and v from s.d_q, s.d_k, s.d_v (kept, the products'
// outputs' gradients, for the weight gradients).
static Tensor gqa_backward(AttentionSaved& s, const LayerWeights& w, const LayerWeights& g,
                           const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  ops::rope_backward_qk_at(s.d_q, s.d_k, c.seq, cfg.num_attention_heads, cfg.num_query_groups,
                           cfg.head_dim(), cfg.rope(), c.positions);
  if (cfg.qk_layernorm) qk_norm_backward(s, w, g, c);
  Tensor d_n1 = work_tensor({c.tokens(), cfg.hidden_size}, c.dtype, "d_n1");
  ops::linear_backward_input(d_n1, s.d_q, w.wq);
  ops::linear_backward_input(d_n1, s.d_k, w.wk, Accumulate::kAdd);
  ops::linear_backward_input(d_n1, s.d_v, w.wv, Accumulate::kAdd);
  return d_n1;
}

void attention_backward(LayerActs& a, const LayerWeights& w, const LayerWeights& g,
                        const NodeContext& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t n = c.tokens(), h = cfg.hidden_size;
  AttentionSaved& s = a.attn;
  // The step's load of each expert, for the expert bias (Note [Expert bias]); counted here, in
  // the backward, so that a forward without one (evaluation) counts nothing.
  if (w.expert_load.defined()) ops::router_load_add(w.expert_load, s.counts, w.expert_slot);
  const Tensor d_n2 = post_norm_input_grad(a, w, c);
  // d h1 = d out (residual) + the post-attention norm's input gradient.
  s.d_h1 = work_tensor({n, h}, c.dtype, "d_h1");
  s.d_h1.copy_from(a.d_out);
  a.d_out = Tensor();
  ops::rmsnorm_backward(s.d_h1, g.post_norm, d_n2, s.h1, w.post_norm, s.rstd2, Accumulate::kAdd);
  Tensor d_a = work_tensor({n, cfg.attn_out_width()}, c.dtype, "d_a");
  ops::linear_backward_input(d_a, s.d_h1, w.wo);
  s.d_q = work_tensor({n, cfg.q_width()}, c.dtype, "d_q");
  s.d_k = work_tensor({n, cfg.kv_width()}, c.dtype, "d_k");
  s.d_v = work_tensor(s.v.shape(), c.dtype, "d_v");
  ops::attention_backward(s.d_q, s.d_k, s.d_v, d_a, s.q, s.k, s.v, s.a, s.lse, attention_shape(c));
  const Tensor d_n1 =
      cfg.multi_latent_attention ? mla_backward(s, w, g, c) : gqa_backward(s, w, g, c);
  tp_input_grad_reduce(d_n1, c);
  a.d_x = work_tensor({n, h}, c.dtype, "d_x");
  a.d_x.copy_from(s.d_h1);
  ops::rmsnorm_backward(a.d_x, g.input_norm, d_n1, s.x, w.input_norm, s.rstd1, Accumulate::kAdd);
  // What only the input gradient needed; n1, a and n2 stay for the weight gradients.
  release_storage({&s.x,       &s.rstd1, &s.q,        &s.k,          &s.v,        &s.lse,
                   &s.h1,      &s.rstd2, &s.probs,    &s.topk_w,     &s.topk_idx, &s.counts,
                   &s.perm,    &s.q_raw, &s.k_raw,    &s.rstd_q,     &s.rstd_k,   &s.cq,
                   &s.rstd_cq, &s.ckv,   &s.rstd_ckv, &s.aux_counts, &s.logits});
}

void attention_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext&) {
  AttentionSaved& s = a.attn;
  ops::linear_backward_weight(g.wo, s.d_h1, s.a);
  if (s.ckvn.defined()) {
    mla_backward_weights(s, g);
  } else {
    ops::linear_backward_weight(g.wq, s.d_q, s.n1);
    ops::linear_backward_weight(g.wk, s.d_k, s.n1);
    ops::linear_backward_weight(g.wv, s.d_v, s.n1);
  }
  if (g.bq.defined()) {  // --add-qkv-bias
    ops::bias_backward(g.bq, s.d_q);
    ops::bias_backward(g.bk, s.d_k);
    ops::bias_backward(g.bv, s.d_v);
  }
  if (g.moe()) ops::linear_backward_weight(g.router, s.d_logits, s.n2);
  release_storage({&s.n1, &s.a, &s.n2});
  s = AttentionSaved{};
}

}  // namespace tandem::model
