// Builds the stages (nodes, times, saved bytes) and each rank's static memory for a schedule.
#include "planner/pipeline_model.h"

#include <algorithm>

#include "core/error.h"
#include "planner/node_scaling.h"

namespace tandem::schedule {
namespace {

constexpr int64_t kFp32 = 4;
constexpr int64_t kI32 = 4;  // token ids and targets

int64_t layer_params(const ModelConfig& cfg, int64_t ep, int64_t l);

// The MTP modules' weights (model/parameters.cc): each its enorm, hnorm and final norm, eh_proj
// [H, 2H] and a layer of the model's last layer's kind.
static int64_t mtp_params(const ModelConfig& cfg, int64_t ep) {
  const int64_t h = cfg.hidden_size;
  return cfg.mtp_num_layers * (3 * h + 2 * h * h + layer_params(cfg, ep, cfg.num_layers));
}

// Note [Tied embeddings] (model/parameters.h): the LM head's weights that a stage holding the
// embedding too reads from the table (which the embed node reads first), so the head adds none.
static int64_t head_read_from_embed(const ModelConfig& cfg, bool first) {
  return first && cfg.tied_embeddings() ? cfg.vocab_size * cfg.hidden_size : 0;
}

// The weights a node is the first to read (StageNode::params), in Parameters::build_entries'
// order: a layer's attention side (norms, projections, router) then its experts' or mlp's.
int64_t node_params(NodeKind kind, const ModelConfig& cfg, int64_t ep, bool moe_layer) {
  const int64_t h = cfg.hidden_size, f = cfg.ffn_hidden_size;
  switch (kind) {
    case NodeKind::kEmbed:
      return cfg.vocab_size * h;
    case NodeKind::kAttention: {
      const int64_t router =
          moe_layer
              ? h * cfg.num_experts + (cfg.moe_router_enable_expert_bias ? cfg.num_experts : 0)
              : 0;
      if (cfg.multi_latent_attention) {  // the latents, their norms, the products out of them
        const int64_t rq = cfg.q_lora_rank, rkv = cfg.kv_lora_rank;
        return 2 * h + (rq > 0 ? h * rq + rq + rq * cfg.q_width() : h * cfg.q_width()) +
               h * (rkv + cfg.qk_pos_emb_head_dim) + rkv +
               rkv * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) +
               cfg.attn_out_width() * h + router;
      }
      return 2 * h + h * cfg.q_width() + 2 * h * cfg.kv_width() + cfg.q_width() * h +
             (cfg.add_qkv_bias ? cfg.q_width() + 2 * cfg.kv_width() : 0) +
             (cfg.qk_layernorm ? 2 * cfg.head_dim() : 0) + router;
    }
    case NodeKind::kExperts:
      return (cfg.num_experts / ep) * 3 * h * cfg.expert_ffn_size();
    case NodeKind::kSharedExpert:
      return 3 * h * cfg.moe_shared_expert_intermediate_size + (cfg.moe_shared_expert_gate ? h : 0);
    case NodeKind::kMlp:
      return 3 * h * f;
    case NodeKind::kLoss:  // the final norm, the LM head and the MTP modules
      return h + h * cfg.vocab_size + mtp_params(cfg, ep);
    default:
      return 0;  // dispatch and combine read no weights
  }
}

// The schedule nodes of layer l, in forward order (model/chunk.cc builds the same).
std::vector<NodeKind> layer_nodes(const ModelConfig& cfg, int64_t l) {
  if (!cfg.is_moe_layer(l)) return {NodeKind::kAttention, NodeKind::kMlp};
  if (cfg.has_shared_expert()) {
    return {NodeKind::kAttention, NodeKind::kDispatch, NodeKind::kSharedExpert, NodeKind::kExperts,
            NodeKind::kCombine};
  }
  return {NodeKind::kAttention, NodeKind::kDispatch, NodeKind::kExperts, NodeKind::kCombine};
}

int64_t layer_params(const ModelConfig& cfg, int64_t ep, int64_t l) {
  int64_t n = 0;
  for (NodeKind k : layer_nodes(cfg, l)) n += node_params(k, cfg, ep, cfg.is_moe_layer(l));
  return n;
}

FootprintShape rank_shape(const PlanInputs& in) {
  const ModelConfig& cfg = in.model;
  FootprintShape s;
  s.tokens = in.micro_batch_size * cfg.seq_length;
  // Balanced routing: each rank sends S rows (N k, or C E padded: Note [Expert capacity] in
  // core/footprint.h) and, on average, receives as many; padded, exactly as many.
  s.routed_rows = moe_routed_rows(cfg, s.tokens);
  s.expert_rows = s.routed_rows;
  s.local_experts = cfg.is_moe() ? cfg.num_experts / in.expert_parallel_size : 0;
  s.ep_size = in.expert_parallel_size;
  s.elem_bytes = in.activation_elem_bytes;
  if (in.gpu) {
    s.stat_bytes = kFp32;
    s.fused_lm_head = true;
  }
  s.recompute_experts = in.recompute_experts;
  s.recompute = in.recompute;
  s.loss_mask = in.eod_mask_loss;
  return s;
}

// Note [Measured routing] in schedule/routing_file.h: the table must cover every (micro-batch,
// layer).
void check_routing(const Schedule& sch, const PlanInputs& in) {
  const RoutingCounts& r = in.routing;
  if (r.empty()) return;
  TANDEM_CHECK(in.model.is_moe(), "routing counts were given for a dense model (--num-experts 0)");
  TANDEM_CHECK(r.num_microbatches == sch.num_microbatches && r.num_layers == in.model.num_layers &&
                   r.expert_rows.size() == static_cast<size_t>(r.num_microbatches) * r.num_layers,
               "routing counts cover ", r.num_microbatches, " micro-batches x ", r.num_layers,
               " layers (", r.expert_rows.size(), " entries) but the plan has ",
               sch.num_microbatches, " micro-batches x ", in.model.num_layers, " layers");
  const int64_t most = moe_routed_rows(in.model, in.micro_batch_size * in.model.seq_length) *
                       in.expert_parallel_size;
  for (int32_t mb = 0; mb < r.num_microbatches; ++mb) {
    for (int32_t l = 0; l < r.num_layers; ++l) {
      TANDEM_CHECK(r.at(mb, l) >= 0 && r.at(mb, l) <= most, "routing counts: micro-batch ", mb,
                   " layer ", l, " has ", r.at(mb, l), " expert rows; valid: 0 to ", most,
                   " (the rows a rank sends x expert ranks), every entry measured");
    }
  }
}

void check_inputs(const Schedule& sch, const PlanInputs& in) {
  const ModelConfig& cfg = in.model;
  cfg.validate();
  TANDEM_CHECK(in.micro_batch_size >= 1, "--micro-batch-size ", in.micro_batch_size,
               " is invalid: need at least 1");
  TANDEM_CHECK(in.expert_parallel_size >= 1, "--expert-model-parallel-size ",
               in.expert_parallel_size, " is invalid: need at least 1");
  check_expert_split(cfg, in.expert_parallel_size);  // Note [Layout rules] in core/config.h
  check_mtp_layout(cfg, sch.num_stages);
  bool paired = false;
  for (const std::vector<Action>& rank : sch.ranks) {
    for (const Action& a : rank) {
      paired =
          paired || a.kind == ActionKind::kForwardBackward || a.kind == ActionKind::kForwardForward;
    }
  }
  check_mtp_overlap(cfg, in.expert_parallel_size, paired);
  TANDEM_CHECK(in.moe_wgrad_merge >= 1, "--moe-wgrad-merge ", in.moe_wgrad_merge,
               " is invalid: need at least 1 (micro-batches per expert weight-gradient product)");
  (void)resolved_data_parallel_size(in);  // checks it
  TANDEM_CHECK(in.activation_elem_bytes == 2 || in.activation_elem_bytes == 4 ||
                   in.activation_elem_bytes == 8,
               "--activation-bytes ", in.activation_elem_bytes, " is invalid: use 2, 4 or 8");
  TANDEM_CHECK(cfg.num_layers >= sch.num_stages, "--num-layers ", cfg.num_layers,
               " is fewer than the schedule's ", sch.num_stages, " stages (", sch.num_ranks,
               " ranks x ", sch.num_stages / std::max(sch.num_ranks, 1),
               " stages each): every stage needs at least one layer");
  // The same split as the pipeline trainer (Note [Uneven stages] in core/config.h).
  (void)stage_layer_counts(cfg.num_layers, sch.num_stages, in.first_stage_layers,
                           in.last_stage_layers);
  check_routing(sch, in);
  // The experts' weight-gradient time of a node-times file is the mean of its passes under the
  // merge it was measured with (Note [Merged expert weight gradients in the plan]).
  if (in.cost.kind == CostModelKind::kNodeTimes && cfg.is_moe()) {
    const int64_t measured = in.cost.table.moe_wgrad_merge.value_or(1);
    TANDEM_CHECK(measured == in.moe_wgrad_merge,
                 "--node-times: the times were measured with "
                 "--moe-wgrad-merge ",
                 measured, " but the plan has --moe-wgrad-merge ", in.moe_wgrad_merge,
                 ": the experts' weight gradients take another time; plan with "
                 "--moe-wgrad-merge ",
                 measured, " or measure with ", in.moe_wgrad_merge);
  }
  TANDEM_CHECK(in.tensor_parallel_size >= 1, "--tensor-model-parallel-size ",
               in.tensor_parallel_size, " is invalid: need at least 1");
  // Note [Node times at another shape] (node_scaling.cc).
  if (in.cost.kind == CostModelKind::kNodeTimes && in.cost.table.measured_at) {
    check_transferable(*in.cost.table.measured_at, cfg, in.activation_elem_bytes);
    // Note [Tensor-parallel all-reduces in the plan]: times measured at a TP above 1 hold that
    // TP's all-reduces.
    const int64_t measured = in.cost.table.measured_at->tensor_parallel_size;
    TANDEM_CHECK(measured == 1 || measured == in.tensor_parallel_size,
                 "--node-times: the times were measured at --tensor-model-parallel-size ", measured,
                 " (their attention and mlp times hold its all-reduces) but the plan has ",
                 in.tensor_parallel_size, ": plan at ", measured, ", or measure at ",
                 in.tensor_parallel_size, " or at 1");
  }
}

constexpr double kRecomputeShare = 2.0 / 3.0;  // Note [Recompute in the plan]

// A node's times under the cost model, at balanced routing's rows.
NodePhaseTimes balanced_times(NodeKind kind, const PlanInputs& in, const FootprintShape& s) {
  NodePhaseTimes t = node_times(in.cost, kind, in.model, s, in.expert_parallel_size);
  // Note [Recompute in the plan]: with --recompute-experts the experts' input-gradient half
  // first forms gate, up and act again: two of the forward's three products (the SwiGLU is
  // elementwise, noise beside them), so it gains 2/3 of the forward's time, unless the table's
  // times were measured with recomputation and hold it already.
  const bool measured_with =
      in.cost.kind == CostModelKind::kNodeTimes && in.cost.table.recompute_experts;
  if (kind == NodeKind::kExperts && in.recompute_experts && !measured_with) {
    t.backward_input_s += kRecomputeShare * t.forward_s;
  }
  // Note [Recomputed modules] (model/ffn_nodes.cc) likewise: the mlp forms gate, up and act
  // again, the shared expert too, gated also its down and gate products (all its forward).
  const uint32_t measured =
      in.cost.kind == CostModelKind::kNodeTimes ? parse_recompute(in.cost.table.recompute) : 0;
  const uint32_t added = in.recompute & ~measured;
  if (kind == NodeKind::kMlp && recomputes(added, Recompute::kMlp)) {
    t.backward_input_s += kRecomputeShare * t.forward_s;
  }
  if (kind == NodeKind::kSharedExpert && recomputes(added, Recompute::kSharedExperts)) {
    t.backward_input_s += (in.model.moe_shared_expert_gate ? 1.0 : kRecomputeShare) * t.forward_s;
  }
  return t;
}

// Note [Gaps between nodes]: a node-times file's times are the GPU's spans of each node phase;
// between two of them the GPU idles while the host is still issuing the next one (its launches,
// the allocator, the host's reads of routing counts). `tandem train --node-times-out` measures
// that as "node_gap_s" (runtime/device_streams.cc): the mean, over every two node phases issued
// one after the other on a compute stream within one action with no wait for another stream
// between them, of the time from the first's end to the second's start. A plan adds it to each
// phase of a node on the compute stream (each of them follows such a gap, bar an action's first)
// and keeps it at every shape: it is the host's time, not the node's work. A larger micro-batch
// gives the GPU longer nodes, behind which the host may get ahead, so there it is an upper bound,
// and at a smaller one a lower bound. A file without it (written by hand, or by a run that did
// not measure it) plans no gaps.
void add_node_gap(NodePhaseTimes& t, const PlanInputs& in) {
  if (in.cost.kind != CostModelKind::kNodeTimes || !in.cost.table.node_gap_s) return;
  const double gap = *in.cost.table.node_gap_s;
  for (double* phase : {&t.forward_s, &t.backward_input_s, &t.backward_weight_s}) {
    if (*phase > 0) *phase += gap;  // a phase of no time issues nothing
  }
}

// Note [Tensor-parallel all-reduces in the plan]: at a tensor-parallel size TP > 1 each layer's
// attention and mlp node all-reduce one [N, H] tensor over the TP ranks in their forward (the
// row-parallel product's output) and one in their input-gradient half (the gradient at the norm's
// output), on the compute thread in the node's own time (Note [Tensor parallelism] in
// core/config_tp.cc). The plan adds a ring all-reduce of N H activation elements (all_reduce_time)
// to both phases, unless the times come from a node-times file measured at a TP above 1, whose
// attention and mlp times hold them already (only at the same TP: check_inputs).
void add_tensor_parallel_all_reduces(NodePhaseTimes& t, NodeKind kind, const PlanInputs& in,
                                     const FootprintShape& s) {
  if (in.tensor_parallel_size <= 1 || (kind != NodeKind::kAttention && kind != NodeKind::kMlp)) {
    return;
  }
  const bool measured = in.cost.kind == CostModelKind::kNodeTimes && in.cost.table.measured_at &&
                        in.cost.table.measured_at->tensor_parallel_size > 1;
  if (measured) return;
  const double ar = all_reduce_time(
      in.cost, s.tokens * in.model.hidden_size * in.activation_elem_bytes, in.tensor_parallel_size);
  t.forward_s += ar;
  t.backward_input_s += ar;
}

StageNode make_node(NodeKind kind, int32_t layer, const PlanInputs& in, const FootprintShape& s) {
  StageNode node;
  node.kind = kind;
  node.layer = layer;
  // Without expert parallelism dispatch and combine are a local permutation and weighted sum,
  // which the runtime issues on the compute stream in order with the rest: its executor
  // (runtime/stream_executor.cc) moves only an all-to-all to the communication stream.
  node.stream =
      node_is_communication(kind) && in.expert_parallel_size > 1 ? Stream::kComm : Stream::kCompute;
  node.saved_bytes = node_saved_bytes(kind, in.model, s);
  node.weight_saved_bytes = node_weight_saved_bytes(kind, in.model, s);
  node.workspace = node_workspace_bytes(kind, in.model, s);  // balanced routing's rows
  if (kind == NodeKind::kExperts && in.moe_wgrad_merge > 1) {
    node.merge = expert_merge_bytes(in.model, s);
  }
  node.offloaded = layer >= 0 && offloads(in.offload_kinds, kind);
  if (in.cost.kind != CostModelKind::kUniform) {
    node.times = balanced_times(kind, in, s);
    add_tensor_parallel_all_reduces(node.times, kind, in, s);
    // Note [Slowest expert rank] (routing_file.h): the experts at this rank's pace, and the
    // all-to-all after them waiting for the slowest rank's.
    if (static_cast<size_t>(layer) < in.expert_pace.size()) {
      const ExpertPace& p = in.expert_pace[static_cast<size_t>(layer)];
      if (kind == NodeKind::kExperts) {
        node.times.forward_s *= p.own;
        node.times.backward_input_s *= p.own;
        node.times.backward_weight_s *= p.own;
      } else if (kind == NodeKind::kCombine) {
        node.wait.forward_s = p.wait * balanced_times(NodeKind::kExperts, in, s).forward_s;
        node.times.forward_s += node.wait.forward_s;
      } else if (kind == NodeKind::kDispatch) {
        node.wait.backward_input_s =
            p.wait * balanced_times(NodeKind::kExperts, in, s).backward_input_s;
        node.times.backward_input_s += node.wait.backward_input_s;
      }
    }
    if (node.stream == Stream::kCompute) add_node_gap(node.times, in);
  }
  // Note [Measured routing]: the experts' rows, which with EP = 1 combine keeps too.
  const bool by_rows = kind == NodeKind::kExperts || (kind == NodeKind::kCombine && s.ep_size == 1);
  if (by_rows && !in.routing.empty()) {
    for (int32_t mb = 0; mb < in.routing.num_microbatches; ++mb) {
      FootprintShape measured = s;
      measured.expert_rows = in.routing.at(mb, layer);
      node.saved_bytes_by_mb.push_back(node_saved_bytes(kind, in.model, measured));
      node.weight_saved_bytes_by_mb.push_back(node_weight_saved_bytes(kind, in.model, measured));
      if (in.moe_wgrad_merge > 1 && kind == NodeKind::kExperts)
        node.merge_by_mb.push_back(expert_merge_bytes(in.model, measured));
    }
  }
  return node;
}

// Note [Gradient reduction in the plan] (simulator.cc): the stage's units, as the runtime's
// gradient_units (runtime/grad_reduce.cc) cut them, each with its all-reduce: the experts'
// gradients over the expert-data-parallel group (DP / EP ranks), the rest over the
// data-parallel group (DP ranks), in f32.
void add_grad_units(Stage& st, const PlanInputs& in) {
  const int64_t dp = resolved_data_parallel_size(in), edp = dp / in.expert_parallel_size;
  for (const StageNode& n : st.nodes) {
    const int32_t layer = n.kind == NodeKind::kEmbed || n.kind == NodeKind::kLoss ? -1 : n.layer;
    const bool same = !st.grad_units.empty() && st.grad_units.back().layer == layer &&
                      n.kind != NodeKind::kLoss;  // the head is a unit of its own
    if (!same) st.grad_units.push_back(GradUnit{layer, 0, 0, 0});
    GradUnit& u = st.grad_units.back();
    st.node_unit.push_back(static_cast<int32_t>(st.grad_units.size()) - 1);
    if (!node_has_weights(n.kind)) continue;
    ++u.weighted_nodes;
    const int64_t ranks = n.kind == NodeKind::kExperts ? edp : dp;
    if (ranks <= 1) continue;
    u.bytes += n.params * kFp32;
    u.reduce_s += all_reduce_time(in.cost, n.params * kFp32, ranks);
  }
}

// Uniform costs: an action costs 1 per half, spread evenly over the stage's compute nodes.
// The all-to-all nodes cost nothing, on whichever stream they run.
void spread_uniform(Stage& stage) {
  int compute = 0;
  for (const StageNode& n : stage.nodes) compute += node_is_communication(n.kind) ? 0 : 1;
  for (StageNode& n : stage.nodes) {
    const double share = node_is_communication(n.kind) ? 0.0 : 1.0 / compute;
    n.times = {share, share, share};
  }
}

Stage build_stage(int32_t index, int32_t num_stages, int32_t first_layer, int32_t num_layers,
                  const PlanInputs& in, const FootprintShape& s) {
  const ModelConfig& cfg = in.model;
  Stage st;
  st.index = index;
  st.first_layer = first_layer;
  st.num_layers = num_layers;
  if (index == 0) st.nodes.push_back(make_node(NodeKind::kEmbed, -1, in, s));
  for (int32_t l = first_layer; l < first_layer + num_layers; ++l) {
    st.layer_node.push_back(static_cast<int32_t>(st.nodes.size()));
    FootprintShape layer = s;
    layer.moe_layer = cfg.is_moe_layer(l);
    for (NodeKind k : layer_nodes(cfg, l)) st.nodes.push_back(make_node(k, l, in, layer));
  }
  st.layer_node.push_back(static_cast<int32_t>(st.nodes.size()));
  const bool last = index == num_stages - 1;
  if (last) st.nodes.push_back(make_node(NodeKind::kLoss, -1, in, s));
  if (in.cost.kind == CostModelKind::kUniform) spread_uniform(st);
  for (const StageNode& n : st.nodes) st.activation_bytes += n.saved_bytes;
  st.num_params =
      stage_params(cfg, first_layer, num_layers, index == 0, last, in.expert_parallel_size);
  int64_t by_node = 0;
  for (StageNode& n : st.nodes) {
    n.params = node_params(n.kind, cfg, in.expert_parallel_size,
                           n.layer >= 0 && cfg.is_moe_layer(n.layer));
    if (n.kind == NodeKind::kLoss) n.params -= head_read_from_embed(cfg, index == 0);
    by_node += n.params;
  }
  if (last && index > 0 && cfg.tied_embeddings()) {
    st.tied_copy_params = cfg.vocab_size * cfg.hidden_size;
  }
  TANDEM_ASSERT(by_node == st.num_params, "stage ", index, ": nodes read ", by_node,
                " weights, the stage holds ", st.num_params);
  st.message_bytes = p2p_bytes(cfg, s);
  st.message_s = p2p_time(in.cost, st.message_bytes);
  // Note [Tokens in the plan] (simulator_state.cc): with document masks every stage loads them.
  if (!in.gpu && (index == 0 || last || in.document_masks > 0)) {
    st.tokens_loaded_bytes = 2 * s.tokens * kI32;
    st.tokens_held_bytes = ((index == 0 ? 1 : 0) + (last ? 1 : 0)) * s.tokens * kI32;
  }
  // Note [Document masks in the plan] (simulator_state.cc).
  st.document_mask_bytes = in.document_masks * 4 * s.tokens;
  add_grad_units(st, in);
  if (num_stages > 1 && cfg.tied_embeddings() && (index == 0 || last)) {
    // Note [The embedding group] (runtime/grad_reduce.cc): the table's gradient summed with the
    // other end's, on the unit that holds it (first on the first stage, last on the last).
    GradUnit& u = index == 0 ? st.grad_units.front() : st.grad_units.back();
    u.reduce_s += all_reduce_time(in.cost, cfg.vocab_size * cfg.hidden_size * kFp32, 2);
  }
  return st;
}

}  // namespace

int64_t resolved_data_parallel_size(const PlanInputs& in) {
  // comm::ParallelLayout: expert parallelism is carved out of data parallelism.
  const int64_t dp = in.data_parallel_size;
  TANDEM_CHECK(dp == 0 || (dp >= 1 && dp % in.expert_parallel_size == 0), "--data-parallel-size ",
               dp,
               " is invalid: the expert ranks are carved out of the data-parallel ones, so "
               "use a multiple of --expert-model-parallel-size ",
               in.expert_parallel_size);
  return dp > 0 ? dp : in.expert_parallel_size;
}

int64_t stage_params(const ModelConfig& cfg, int32_t first_layer, int32_t num_layers, bool first,
                     bool last, int64_t ep) {
  int64_t n = 0;
  for (int32_t l = first_layer; l < first_layer + num_layers; ++l) n += layer_params(cfg, ep, l);
  if (first) n += cfg.vocab_size * cfg.hidden_size;
  if (last) n += node_params(NodeKind::kLoss, cfg, ep, false) - head_read_from_embed(cfg, first);
  return n;
}

int64_t sharded_optimizer_params(const Stage& st, int64_t dp, int64_t ep) {
  std::vector<int64_t> dense(st.grad_units.size(), 0), experts(st.grad_units.size(), 0);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const StageNode& n = st.nodes[i];
    const auto u = static_cast<size_t>(st.node_unit[i]);
    (ep > 1 && n.kind == NodeKind::kExperts ? experts : dense)[u] += n.params;
  }
  // Note [The embedding group] (runtime/grad_reduce.cc): a last stage's copy of the tied table
  // is a piece of its own.
  if (st.tied_copy_params > 0) dense.back() -= st.tied_copy_params;
  const int64_t edp = dp / ep;
  int64_t total = (st.tied_copy_params + dp - 1) / dp;
  for (size_t u = 0; u < dense.size(); ++u) {
    total += (dense[u] + dp - 1) / dp + (experts[u] + edp - 1) / edp;
  }
  return total;
}

void check_planned_node_runs(const ModelConfig& cfg, int64_t microbatches) {
  int64_t nodes = 2;  // embed, loss
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    nodes += static_cast<int64_t>(layer_nodes(cfg, l).size());
  }
  // The simulation runs every node for every micro-batch, keeping each run's spans and memory.
  TANDEM_CHECK(microbatches * nodes <= kMaxPlannedNodeRuns, "the plan would run ", microbatches,
               " micro-batches through the model's ", nodes, " nodes, ", microbatches * nodes,
               " node runs: more than the ", kMaxPlannedNodeRuns,
               " a plan simulates; plan fewer micro-batches (a larger --micro-batch-size)");
}

PipelineModel build_pipeline_model(const Schedule& sch, const PlanInputs& in) {
  check_inputs(sch, in);
  PipelineModel pm;
  pm.shape = rank_shape(in);
  pm.cost_kind = in.cost.kind;
  pm.expert_parallel_size = in.expert_parallel_size;
  pm.moe_wgrad_merge = in.moe_wgrad_merge;
  pm.data_parallel_size = resolved_data_parallel_size(in);
  pm.overlap_grad_reduce = in.overlap_grad_reduce;
  pm.host_copy_bytes_per_s = in.cost.device.host_copy_bytes_per_s;
  pm.cpu_trainer = !in.gpu;
  // Note [Deferred update in the plan]: AdamW reads weight, gradient and two moments (f32) and
  // writes weight and moments, and on the GPU the bf16 copy: 28 or 30 bytes a weight at the
  // memory bandwidth. That is a lower bound; a node-times file's measured seconds per weight
  // replace it.
  pm.defer_optimizer = in.defer_optimizer;
  if (in.cost.kind != CostModelKind::kUniform) {
    const bool measured = in.cost.kind == CostModelKind::kNodeTimes;
    const NodeTimesTable& t = in.cost.table;
    // Measured (--node-times-out of a --defer-optimizer run): the table's rate.
    const double update = measured && t.update_s_per_weight
                              ? *t.update_s_per_weight
                              : (in.gpu ? 30.0 : 28.0) / in.cost.device.memory_bytes_per_s;
    if (in.defer_optimizer) pm.update_s_per_param = update;
    // Note [The step's end in the plan] (simulator.cc): the norm reads each f32 gradient once;
    // the update at the step's end costs what a deferred one does. Measured by a run that made
    // the same choice (--node-times-out): its rate, host waits too.
    pm.step_end_s_per_param =
        measured && t.step_end_s_per_weight && t.defer_optimizer == in.defer_optimizer
            ? *t.step_end_s_per_weight
            : kFp32 / in.cost.device.memory_bytes_per_s + (in.defer_optimizer ? 0.0 : update);
  }
  const int32_t stages = sch.num_stages;
  const std::vector<int64_t> counts =
      stage_layer_counts(in.model.num_layers, stages, in.first_stage_layers, in.last_stage_layers);
  check_planned_node_runs(in.model, sch.num_microbatches);
  int32_t next_layer = 0;
  for (int32_t st = 0; st < stages; ++st) {
    const auto count = static_cast<int32_t>(counts[static_cast<size_t>(st)]);
    pm.stages.push_back(build_stage(st, stages, next_layer, count, in, pm.shape));
    pm.stages.back().rank = sch.stage_rank[st];
    next_layer += count;
  }
  pm.ranks.resize(sch.num_ranks);
  for (const Stage& st : pm.stages) {
    RankMemory& m = pm.ranks[st.rank];
    m.param_bytes += st.num_params * kFp32;
    m.grad_bytes += st.num_params * kFp32;
    const int64_t kept =
        in.distributed_optimizer
            ? sharded_optimizer_params(st, pm.data_parallel_size, in.expert_parallel_size)
            : st.num_params;
    m.optimizer_bytes += 2 * kept * kFp32;
    if (in.gpu) m.compute_copy_bytes += st.num_params * 2;
    // The expert bias's load tally, f32 [layers, E] a chunk (Note [Expert bias] in
    // runtime/expert_bias.h), beside the weights; its layers are the MTP modules' too on the last
    // stage (ChunkSpec::held_layers in model/parameters.h).
    const int64_t held = st.num_layers + (st.has_loss() ? in.model.mtp_num_layers : 0);
    if (in.model.moe_router_enable_expert_bias)
      m.param_bytes += held * in.model.num_experts * kFp32;
    // global_aux_loss's running totals, f64 [layers, E + 1] a chunk (model/parameters.h).
    if (in.model.has_global_balance_loss()) m.param_bytes += held * (in.model.num_experts + 1) * 8;
  }
  return pm;
}

}  // namespace tandem::schedule
