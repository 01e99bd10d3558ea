// The feed-forward side of a layer: the experts' grouped SwiGLU, a MoE layer's shared expert and
// the dense mlp.
#include <utility>

#include "model/nodes.h"
#include "ops/ops.h"

namespace tandem::model {

// Calls fn(local expert, first row, rows) for each local expert with rows.
template <typename Fn>
static void for_each_expert(const std::vector<int32_t>& rows, Fn fn) {
  int64_t begin = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] > 0) fn(static_cast<int64_t>(e), begin, static_cast<int64_t>(rows[e]));
    begin += rows[e];
  }
}

// for_each_expert with each expert's products one piece of a Lanes (Note [Lanes] in ops.h): the
// experts' products run side by side on the GPU; each touches only its own rows and weights.
template <typename Fn>
static void for_each_expert_in_lanes(const Tensor& on, const std::vector<int32_t>& rows, Fn fn) {
  ops::Lanes lanes(on);
  int64_t piece = 0;
  for_each_expert(rows, [&](int64_t e, int64_t begin, int64_t n) {
    lanes.run(piece++, [&] { fn(e, begin, n); });
  });
  lanes.join();
}

// Note [One elementwise op for all experts]: the experts' rows lie one expert after another, so
// an elementwise op (SwiGLU and its backward) runs once over all rows rather than once per
// expert: the same values, one kernel launch a node instead of one per expert (on the GPU each
// launch costs the host time, and the host is what paces expert parallelism).
//
// Note [Gate and up in one product]: gate_proj and up_proj read the same input, and Parameters
// places each pair one after the other ([F, H] then [F, H]), so the [2F, H] view over both
// (w_gate_up, e_gate_up) forms gate and up in one product, rows (gate | up); SwiGLU reads that
// packed layout. The backward is likewise one product each: d input = d_gate_up @ W_gate_up
// (K = 2F, summed in f32 before rounding once, where two products rounded the first sum to the
// activation dtype) and d W_gate_up = d_gate_up^T @ input. Per expert 6 products a layer and
// micro-batch instead of 9, each twice as wide; the values are gate's and up's as before.

// Whether the node's products of `phase` run as one grouped call (Note [Grouped expert products]
// in ops.h).
static bool grouped(const ExpertsSaved& s, ops::ExpertPhase phase) {
  return ops::grouped_expert_phase(phase, s.x_in.size(0), static_cast<int64_t>(s.rows_host.size()));
}

// gate_up and act of every local expert's rows: the products and SwiGLU of the forward.
static void expert_activations(const ExpertsSaved& s, const LayerWeights& w, const Tensor& gate_up,
                               const Tensor& act) {
  if (grouped(s, ops::ExpertPhase::kForward)) {
    ops::grouped_linear_forward(gate_up, s.x_in, w.e_gate_up, s.rows_host);
  } else {
    for_each_expert_in_lanes(s.x_in, s.rows_host, [&](int64_t e, int64_t begin, int64_t rows) {
      ops::linear_forward(gate_up.narrow_rows(begin, rows), s.x_in.narrow_rows(begin, rows),
                          w.e_gate_up[e]);
    });
  }
  // Every expert's rows in one call (Note [One elementwise op for all experts]).
  if (s.x_in.size(0) > 0) ops::swiglu_forward(act, gate_up);
}

// Note [Recomputed experts]: with NodeContext::recompute_experts the experts keep only their
// input rows (and row counts) from forward to backward: gate_up and act are temporaries of the
// forward, and the input-gradient backward forms them again from the same rows and weights with
// the same ops, so every value, and so every gradient, is bit for bit the stored run's. act is
// then kept for the weight gradient, as without recomputation (it becomes an activation when
// the input-gradient backward ends, where footprint.h's figures and the planner count it).
// The cost is one more pass of the gate and up product; the saving 3 R F elements per layer
// and micro-batch in flight.
void experts_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const int64_t f = c.cfg.expert_ffn_size(), h = c.cfg.hidden_size;
  ExpertsSaved& s = a.experts;
  s.x_in = std::move(a.expert_in);  // (R, H)
  a.expert_in = Tensor();
  adopt_as_activation(s.x_in);  // Note [Hand-over]
  const int64_t r = s.x_in.size(0);
  s.rows_per_expert = std::exchange(a.expert_rows, Tensor());  // from dispatch
  adopt_as_activation(s.rows_per_expert);
  TANDEM_ASSERT(s.rows_per_expert.numel() == static_cast<int64_t>(w.e_gate_up.size()));
  // Note [Routing counts on the host]: dispatch hands the host copy over with the tensor.
  s.rows_host = a.expert_rows_host.empty() ? host_ints(s.rows_per_expert)
                                           : std::exchange(a.expert_rows_host, {});
  int64_t routed = 0;
  for (const int32_t rows : s.rows_host) routed += rows;
  TANDEM_ASSERT(routed == r);  // every row belongs to one local expert
  // Note [Recomputed experts]: temporaries, or saved for the backward.
  const auto make = c.recompute_experts ? work_tensor : saved_tensor;
  const Tensor gate_up = make({r, 2 * f}, c.dtype, "experts.gate_up");
  const Tensor act = make({r, f}, c.dtype, "experts.act");
  expert_activations(s, w, gate_up, act);
  if (!c.recompute_experts) {
    s.gate_up = gate_up;
    s.act = act;
  }
  a.expert_out = work_tensor({r, h}, c.dtype, "expert_out");  // handed to combine
  if (grouped(s, ops::ExpertPhase::kForward)) {
    ops::grouped_linear_forward(a.expert_out, act, w.e_down, s.rows_host);
    return;
  }
  for_each_expert_in_lanes(s.x_in, s.rows_host, [&](int64_t e, int64_t begin, int64_t rows) {
    ops::linear_forward(a.expert_out.narrow_rows(begin, rows), act.narrow_rows(begin, rows),
                        w.e_down[e]);
  });
}

void experts_backward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const int64_t f = c.cfg.expert_ffn_size(), h = c.cfg.hidden_size;
  ExpertsSaved& s = a.experts;
  s.d_y = std::move(a.d_expert_out);
  a.d_expert_out = Tensor();
  const int64_t r = s.x_in.size(0);
  if (c.recompute_experts) {  // Note [Recomputed experts]
    s.gate_up = work_tensor({r, 2 * f}, c.dtype, "experts.gate_up");
    s.act = work_tensor({r, f}, c.dtype, "experts.act");
    expert_activations(s, w, s.gate_up, s.act);
  }
  Tensor d_act = work_tensor({r, f}, c.dtype, "d_act");
  s.d_gate_up = work_tensor({r, 2 * f}, c.dtype, "d_gate_up");
  // Every row belongs to one local expert (experts_forward), so the products below write all
  // of d_expert_in.
  a.d_expert_in = work_tensor({r, h}, c.dtype, "d_expert_in");
  const bool in_one_call = grouped(s, ops::ExpertPhase::kInput);
  if (in_one_call) {
    ops::grouped_linear_backward_input(d_act, s.d_y, w.e_down, s.rows_host);
  } else {
    for_each_expert_in_lanes(s.x_in, s.rows_host, [&](int64_t e, int64_t begin, int64_t rows) {
      ops::linear_backward_input(d_act.narrow_rows(begin, rows), s.d_y.narrow_rows(begin, rows),
                                 w.e_down[e]);
    });
  }
  // Every expert's rows in one call (Note [One elementwise op for all experts]).
  if (r > 0) ops::swiglu_backward(s.d_gate_up, d_act, s.gate_up);
  if (in_one_call) {
    ops::grouped_linear_backward_input(a.d_expert_in, s.d_gate_up, w.e_gate_up, s.rows_host);
  } else {
    for_each_expert_in_lanes(s.x_in, s.rows_host, [&](int64_t e, int64_t begin, int64_t rows) {
      ops::linear_backward_input(a.d_expert_in.narrow_rows(begin, rows),
                                 s.d_gate_up.narrow_rows(begin, rows), w.e_gate_up[e]);
    });
  }
  release_storage({&s.gate_up});  // x_in and act stay for the weight gradients
  if (c.recompute_experts) adopt_as_activation(s.act);
}

// The weight gradients of rows_host's experts from d_y, act, d_gate_up and x_in (rows of each
// expert one block after another), written by the step's first pass of the layer and added by
// later ones (Note [Expert gradients written first] in model/parameters.h).
static void expert_weight_products(const LayerWeights& g, const std::vector<int32_t>& rows_host,
                                   const Tensor& d_y, const Tensor& act, const Tensor& d_gate_up,
                                   const Tensor& x_in) {
  const bool first = g.experts_grad_fresh != nullptr && *g.experts_grad_fresh;
  if (first) *g.experts_grad_fresh = false;
  const ops::Accumulate acc = first ? ops::Accumulate::kOverwrite : ops::Accumulate::kAdd;
  for_each_expert_in_lanes(x_in, rows_host, [&](int64_t e, int64_t begin, int64_t rows) {
    ops::linear_backward_weight(g.e_down[e], d_y.narrow_rows(begin, rows),
                                act.narrow_rows(begin, rows), acc);
    ops::linear_backward_weight(g.e_gate_up[e], d_gate_up.narrow_rows(begin, rows),
                                x_in.narrow_rows(begin, rows), acc);
  });
  for (size_t e = 0; first && e < rows_host.size(); ++e) {
    if (rows_host[e] > 0) continue;
    g.e_down[e].zero_();
    g.e_gate_up[e].zero_();
  }
}

void MergedExpertGrads::begin_step(int64_t layers, int64_t step_microbatches) {
  TANDEM_ASSERT(idle(), "a micro-batch's expert weight gradient still waits from the last step");
  microbatches = step_microbatches;
  waiting.assign(static_cast<size_t>(layers), {});
  passes.assign(static_cast<size_t>(layers), 0);
}

bool MergedExpertGrads::idle() const {
  for (const std::vector<ExpertsSaved>& w : waiting) {
    if (!w.empty()) return false;
  }
  return true;
}

// Note [Merged expert weight gradients]: the waiting micro-batches' rows gathered expert-major
// (expert e's rows of each, in the order they came), then one product per expert.
static void merged_expert_products(std::vector<ExpertsSaved>& group, const LayerWeights& g,
                                   const NodeContext& c) {
  const size_t experts = group.front().rows_host.size();
  std::vector<int32_t> rows(experts, 0);
  for (const ExpertsSaved& s : group) {
    for (size_t e = 0; e < experts; ++e) rows[e] += s.rows_host[e];
  }
  int64_t total = 0;
  std::vector<int64_t> begin(experts);
  for (size_t e = 0; e < experts; ++e) {
    begin[e] = total;
    total += rows[e];
  }
  const int64_t f = c.cfg.expert_ffn_size(), h = c.cfg.hidden_size;
  const Tensor x_in = work_tensor({total, h}, c.dtype, "experts.merged_x_in");
  const Tensor act = work_tensor({total, f}, c.dtype, "experts.merged_act");
  const Tensor d_y = work_tensor({total, h}, c.dtype, "experts.merged_d_y");
  const Tensor d_gate_up = work_tensor({total, 2 * f}, c.dtype, "experts.merged_d_gate_up");
  std::vector<int64_t> fill = begin;
  for (ExpertsSaved& s : group) {
    std::vector<ops::RowBlock> blocks;
    int64_t from = 0;
    for (size_t e = 0; e < experts; ++e) {
      const int64_t n = s.rows_host[e];
      if (n > 0) blocks.push_back({from, fill[e], n});
      from += n;
      fill[e] += n;
    }
    if (!blocks.empty()) {
      ops::copy_row_blocks(x_in, s.x_in, blocks);
      ops::copy_row_blocks(act, s.act, blocks);
      ops::copy_row_blocks(d_y, s.d_y, blocks);
      ops::copy_row_blocks(d_gate_up, s.d_gate_up, blocks);
    }
    release_storage({&s.x_in, &s.act, &s.rows_per_expert, &s.d_y, &s.d_gate_up});
  }
  group.clear();
  expert_weight_products(g, rows, d_y, act, d_gate_up, x_in);
}

void experts_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext& c,
                              int64_t layer) {
  ExpertsSaved& s = a.experts;
  MergedExpertGrads* m = c.merged_expert_grads;
  if (m == nullptr || m->merge <= 1) {
    expert_weight_products(g, s.rows_host, s.d_y, s.act, s.d_gate_up, s.x_in);
    release_storage({&s.x_in, &s.act, &s.rows_per_expert});
    s = ExpertsSaved{};
    return;
  }
  const auto l = static_cast<size_t>(layer);
  TANDEM_ASSERT(l < m->waiting.size() && m->passes[l] < m->microbatches, "layer ", layer,
                "'s expert weight gradient passes exceed the step's ", m->microbatches,
                " micro-batches");
  std::vector<ExpertsSaved>& group = m->waiting[l];
  const bool last =
      ++m->passes[l] == m->microbatches || static_cast<int64_t>(group.size()) + 1 == m->merge;
  if (group.empty() && last) {  // a group of one: its own products
    expert_weight_products(g, s.rows_host, s.d_y, s.act, s.d_gate_up, s.x_in);
    release_storage({&s.x_in, &s.act, &s.rows_per_expert});
    s = ExpertsSaved{};
    return;
  }
  if (!last) {  // Note [Hand-over]: what waits is the planner's activation memory
    adopt_as_activation(s.d_y);
    adopt_as_activation(s.d_gate_up);
  }
  group.push_back(std::move(s));
  s = ExpertsSaved{};
  if (last) merged_expert_products(group, g, c);
}

// Note [Recomputed modules]: with --recompute mlp (shared_experts) the dense mlp (the shared
// expert) keeps nothing from forward to backward: its input n2 is held by attention anyway, and
// its gate_up and act (the shared expert's z and gate too) are temporaries of the forward that
// its input-gradient backward forms again from the same n2 and weights with the same ops, so
// every value, and so every gradient, is bit for bit the stored run's (Megatron-LM's
// --recompute-modules mlp, shared_experts). act is then kept for the weight gradient, as
// without recomputation (adopted as an activation when the input-gradient backward ends, where
// footprint.h's figures count it). The cost is one more pass of the gate and up product (and the
// shared expert's down and gate products when gated); the saving 3 N F elements a layer and
// micro-batch in flight (the shared expert's gated z [N,H] and gate [N] besides).

// The shared expert: y = (silu(n2 Wg) * n2 Wu) Wd, scaled by sigmoid(n2 . w) when gated, over
// every token of the layer; combine adds y to the layer's output. Forms s's gate_up, act, and
// gated z and gate (allocated with `make`), and out when given (the forward's; the recomputing
// backward needs none).
template <typename Make>
static void shared_expert_activations(SharedExpertSaved& s, const Tensor& out, const Tensor& n2,
                                      const LayerWeights& w, const NodeContext& c, Make make) {
  const int64_t n = c.tokens(), f = c.cfg.moe_shared_expert_intermediate_size;
  const int64_t h = c.cfg.hidden_size;
  s.gate_up = make({n, 2 * f}, c.dtype, "shared.gate_up");
  s.act = make({n, f}, c.dtype, "shared.act");
  ops::linear_forward(s.gate_up, n2, w.shared_gate_up);  // Note [Gate and up in one product]
  ops::swiglu_forward(s.act, s.gate_up);
  if (!w.shared_gate.defined()) {
    if (out.defined()) ops::linear_forward(out, s.act, w.shared_down);
    return;
  }
  s.z = make({n, h}, c.dtype, "shared.z");
  ops::linear_forward(s.z, s.act, w.shared_down);
  Tensor logit = work_tensor({n, 1}, c.stat_dtype(), "shared.logit");
  ops::linear_forward(logit, n2, w.shared_gate);
  s.gate = make({n}, c.stat_dtype(), "shared.gate");
  // The output is formed either way: the gate comes with it (one op). In the backward it is a
  // temporary freed at once.
  const Tensor y = out.defined() ? out : work_tensor({n, h}, c.dtype, "shared.out_again");
  ops::sigmoid_gate_forward(y, s.gate, s.z, logit.reshape({n}));
}

void shared_expert_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const int64_t n = c.tokens(), h = c.cfg.hidden_size;
  const bool again = recomputes(c.recompute, Recompute::kSharedExperts);
  SharedExpertSaved& s = a.shared;
  a.shared_out = work_tensor({n, h}, c.dtype, "shared_out");  // handed to combine
  // Note [Recomputed modules]: temporaries, or saved for the backward.
  shared_expert_activations(s, a.shared_out, a.attn.n2, w, c, again ? work_tensor : saved_tensor);
  if (again) s = SharedExpertSaved{};
}

// d_n2 (the shared expert's part of n2's gradient, which attention's backward adds to) from the
// layer's output gradient d_out.
void shared_expert_backward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const int64_t n = c.tokens(), f = c.cfg.moe_shared_expert_intermediate_size;
  const int64_t h = c.cfg.hidden_size;
  SharedExpertSaved& s = a.shared;
  const bool again = recomputes(c.recompute, Recompute::kSharedExperts);
  if (again) {  // Note [Recomputed modules]
    shared_expert_activations(s, Tensor(), a.attn.n2, w, c, work_tensor);
  }
  if (w.shared_gate.defined()) {
    s.d_z = work_tensor({n, h}, c.dtype, "shared.d_z");
    s.d_logit = work_tensor({n, 1}, c.dtype, "shared.d_logit");
    ops::sigmoid_gate_backward(s.d_z, s.d_logit.reshape({n}), a.d_out, s.z, s.gate);
  } else {
    s.d_z = a.d_out;  // attention reads it too (the residual), then drops it
  }
  Tensor d_act = work_tensor({n, f}, c.dtype, "shared.d_act");
  ops::linear_backward_input(d_act, s.d_z, w.shared_down);
  s.d_gate_up = work_tensor({n, 2 * f}, c.dtype, "shared.d_gate_up");
  ops::swiglu_backward(s.d_gate_up, d_act, s.gate_up);
  a.d_n2 = work_tensor({n, h}, c.dtype, "d_n2");
  ops::linear_backward_input(a.d_n2, s.d_gate_up, w.shared_gate_up);
  if (w.shared_gate.defined()) {
    ops::linear_backward_input(a.d_n2, s.d_logit, w.shared_gate, ops::Accumulate::kAdd);
  }
  release_storage({&s.gate_up, &s.z, &s.gate});  // act stays for the weight gradient
  if (again) adopt_as_activation(s.act);
}

void shared_expert_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext&) {
  SharedExpertSaved& s = a.shared;
  const Tensor& n2 = a.attn.n2;
  ops::linear_backward_weight(g.shared_down, s.d_z, s.act);
  ops::linear_backward_weight(g.shared_gate_up, s.d_gate_up, n2);
  if (g.shared_gate.defined()) ops::linear_backward_weight(g.shared_gate, s.d_logit, n2);
  release_storage({&s.act});
  s = SharedExpertSaved{};
}

// The dense SwiGLU's gate_up and act from n2 (allocated with `make`).
template <typename Make>
static void mlp_activations(MlpSaved& s, const Tensor& n2, const LayerWeights& w,
                            const NodeContext& c, Make make) {
  const int64_t n = c.tokens(), f = c.cfg.ffn_hidden_size;
  s.gate_up = make({n, 2 * f}, c.dtype, "mlp.gate_up");
  s.act = make({n, f}, c.dtype, "mlp.act");
  ops::linear_forward(s.gate_up, n2, w.w_gate_up);  // Note [Gate and up in one product]
  ops::swiglu_forward(s.act, s.gate_up);
}

void mlp_forward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const int64_t n = c.tokens(), h = c.cfg.hidden_size;
  const bool again = recomputes(c.recompute, Recompute::kMlp);
  MlpSaved& s = a.mlp;
  // Note [Recomputed modules]: temporaries, or saved for the backward.
  mlp_activations(s, a.attn.n2, w, c, again ? work_tensor : saved_tensor);
  // Handed to the next layer or the loss; + the residual h1.
  a.out = work_tensor({n, h}, c.dtype, "layer.out");
  tp_row_parallel_forward(a.out, s.act, w.w_down, a.h1, c);
  a.h1 = Tensor();
  if (again) s = MlpSaved{};
}

void mlp_backward(LayerActs& a, const LayerWeights& w, const NodeContext& c) {
  const int64_t n = c.tokens(), f = c.cfg.ffn_hidden_size, h = c.cfg.hidden_size;
  MlpSaved& s = a.mlp;
  const bool again = recomputes(c.recompute, Recompute::kMlp);
  if (again) mlp_activations(s, a.attn.n2, w, c, work_tensor);  // Note [Recomputed modules]
  s.d_out = a.d_out;  // attention reads it too (the residual), then drops it
  Tensor d_act = work_tensor({n, f}, c.dtype, "d_act");
  ops::linear_backward_input(d_act, s.d_out, w.w_down);
  s.d_gate_up = work_tensor({n, 2 * f}, c.dtype, "d_gate_up");
  ops::swiglu_backward(s.d_gate_up, d_act, s.gate_up);
  a.d_n2 = work_tensor({n, h}, c.dtype, "d_n2");
  ops::linear_backward_input(a.d_n2, s.d_gate_up, w.w_gate_up);
  tp_input_grad_reduce(a.d_n2, c);
  release_storage({&s.gate_up});  // act stays for the weight gradient
  if (again) adopt_as_activation(s.act);
}

void mlp_backward_weights(LayerActs& a, const LayerWeights& g, const NodeContext&) {
  MlpSaved& s = a.mlp;
  const Tensor& n2 = a.attn.n2;
  ops::linear_backward_weight(g.w_down, s.d_out, s.act);
  ops::linear_backward_weight(g.w_gate_up, s.d_gate_up, n2);
  release_storage({&s.act});
  s = MlpSaved{};
}

}  // namespace tandem::model
