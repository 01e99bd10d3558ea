// Node FLOPs and bytes (forward, one micro-batch of N tokens on one rank), the roofline, and
// the node-times file. Notation: H hidden, T sequence, Q = heads*D, K = kv*D, E experts,
// k top-k, F ffn width, V vocab, R rows the local experts receive, e activation element bytes,
// w weight element bytes.
#include "planner/cost_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_file.h"
#include "planner/node_scaling.h"

namespace tandem::schedule {
namespace {

double dbl(int64_t v) { return static_cast<double>(v); }

}  // namespace

std::string_view cost_model_name(CostModelKind kind) { return enum_name(kind); }

double alltoall_bytes(const ModelConfig& cfg, const FootprintShape& s, int64_t ep) {
  if (!cfg.is_moe() || ep <= 1) return 0;
  return dbl(s.routed(cfg.moe_router_topk) * cfg.hidden_size * s.elem_bytes) * dbl(ep - 1) /
         dbl(ep);
}

int64_t p2p_bytes(const ModelConfig& cfg, const FootprintShape& s) {
  return s.tokens * cfg.hidden_size * s.elem_bytes;
}

static void add_mtp_work(NodeWork& out, const ModelConfig& cfg, const FootprintShape& s, int64_t ep,
                         int64_t w);

// Matrix FLOPs count 2 per multiply-add; the attention core is causal (half of T x T).
// Bytes: the weights once (w each) plus each activation tensor the node produces written once
// and read once, and its input read (e each): an estimate good to a small factor, which is
// what a roofline needs for the memory-bound nodes (embed, norms, small layers).
NodeWork node_forward_work(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s,
                           int64_t ep, int64_t w) {
  const double n = dbl(s.tokens), h = dbl(cfg.hidden_size), t = dbl(cfg.seq_length);
  const double q = dbl(cfg.q_width()), kv = dbl(cfg.kv_width()), e = dbl(s.elem_bytes);
  const double experts = dbl(cfg.num_experts), f = dbl(cfg.ffn_hidden_size);
  const double fe = dbl(cfg.expert_ffn_size()), fs = dbl(cfg.moe_shared_expert_intermediate_size);
  const double v = dbl(cfg.vocab_size), r = dbl(s.expert_rows), wb = dbl(w);
  NodeWork out;
  switch (kind) {
    case NodeKind::kEmbed:
      out.memory_bytes = n * h * (wb + e) + n * 4;
      break;
    case NodeKind::kAttention: {
      // The projections' weights, and the causal core's q.k and p.v (2 n t (q + o) / 2).
      double proj = h * (q + 2 * kv) + q * h, o = q;
      if (cfg.multi_latent_attention) {  // the latents' products; values Dv wide
        const double rq = dbl(cfg.q_lora_rank), rkv = dbl(cfg.kv_lora_rank);
        const double kvb = dbl(cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim));
        o = dbl(cfg.attn_out_width());
        proj = (rq > 0 ? h * rq + rq * q : h * q) + h * (rkv + dbl(cfg.qk_pos_emb_head_dim)) +
               rkv * kvb + o * h;
      }
      out.flops = cfg.multi_latent_attention
                      ? 2 * n * proj + n * t * (q + o)
                      : 2 * n * h * (q + 2 * kv) + 2 * n * q * h + 2 * n * t * q;
      double weights = proj + 2 * h;
      if (cfg.is_moe() && s.moe_layer) {
        out.flops += 2 * n * h * experts;
        weights += h * experts;
      }
      out.memory_bytes = weights * wb + n * (6 * h + 4 * q + 4 * kv) * e;
      if (cfg.qk_layernorm) out.memory_bytes += n * 2 * (q + kv) * e;  // the norms' pass
      if (cfg.add_qkv_bias) out.memory_bytes += n * 2 * (q + 2 * kv) * e;
      break;
    }
    case NodeKind::kDispatch:
    case NodeKind::kCombine:
      out.comm_bytes = alltoall_bytes(cfg, s, ep);
      break;
    case NodeKind::kExperts:
      out.flops = 6 * r * h * fe;
      out.memory_bytes = dbl(s.local_experts) * 3 * h * fe * wb + r * (2 * h + 4 * fe) * e;
      break;
    case NodeKind::kSharedExpert:
      out.flops = 6 * n * h * fs + (cfg.moe_shared_expert_gate ? 2 * n * h : 0);
      out.memory_bytes = 3 * h * fs * wb + n * (2 * h + 4 * fs) * e;
      break;
    case NodeKind::kMlp:
      out.flops = 6 * n * h * f;
      out.memory_bytes = 3 * h * f * wb + n * (2 * h + 4 * f) * e;
      break;
    case NodeKind::kLoss:
      out.flops = 2 * n * h * v;
      out.memory_bytes = (h * v + h) * wb + n * (2 * h + 2 * v) * e;
      add_mtp_work(out, cfg, s, ep, w);
      break;
  }
  return out;
}

// The MTP modules the loss node runs (model/mtp.cc): each its embedding rows, three norms, eh_proj
// [N, 2H] x [2H, H], its transformer layer (the model's last layer's kind) and the shared head
// over its rows with a target.
static void add_mtp_work(NodeWork& out, const ModelConfig& cfg, const FootprintShape& s, int64_t ep,
                         int64_t w) {
  const double n = dbl(s.tokens), h = dbl(cfg.hidden_size), v = dbl(cfg.vocab_size);
  const double e = dbl(s.elem_bytes), wb = dbl(w);
  FootprintShape ls = s;
  ls.moe_layer = cfg.is_moe_layer(cfg.num_layers);
  std::vector<NodeKind> kinds = {NodeKind::kAttention};
  if (!ls.moe_layer) {
    kinds.push_back(NodeKind::kMlp);
  } else {
    kinds.insert(kinds.end(), {NodeKind::kDispatch, NodeKind::kExperts, NodeKind::kCombine});
    if (cfg.has_shared_expert()) kinds.push_back(NodeKind::kSharedExpert);
  }
  for (int64_t j = 0; j < cfg.mtp_num_layers; ++j) {
    const double nv = n * dbl(cfg.seq_length - j - 1) / dbl(cfg.seq_length);
    out.flops += 2 * n * 2 * h * h + 2 * nv * h * v;
    out.memory_bytes += (2 * h * h + 3 * h) * wb + n * 12 * h * e + nv * 2 * v * e;
    for (NodeKind k : kinds) {
      const NodeWork part = node_forward_work(k, cfg, ls, ep, w);
      out.flops += part.flops;
      out.memory_bytes += part.memory_bytes;
      out.comm_bytes += part.comm_bytes;
    }
  }
}

NodePhaseTimes node_times(const CostModel& cost, NodeKind kind, const ModelConfig& cfg,
                          const FootprintShape& shape, int64_t ep) {
  if (cost.kind == CostModelKind::kNodeTimes) {
    // Note [Node times at another shape] (node_scaling.cc).
    if (cost.table.measured_at) return scaled_node_times(cost, kind, cfg, shape, ep);
    const auto& entry = cost.table.nodes[static_cast<int>(kind)];
    TANDEM_CHECK(entry.has_value(), "the node-times file has no entry for \"", node_kind_name(kind),
                 "\", which this model needs");
    return *entry;
  }
  TANDEM_ASSERT(cost.kind == CostModelKind::kRoofline, "node_times: uniform costs are per action");
  const DeviceDesc& d = cost.device;
  const NodeWork work = node_forward_work(kind, cfg, shape, ep, d.weight_elem_bytes);
  NodePhaseTimes t;
  if (node_is_communication(kind)) {
    t.forward_s = work.comm_bytes > 0 ? d.link_latency_s + work.comm_bytes / d.link_bytes_per_s : 0;
    t.backward_input_s = t.forward_s;
    return t;
  }
  t.forward_s =
      std::max(work.flops / d.matrix_flops_per_s, work.memory_bytes / d.memory_bytes_per_s);
  t.backward_input_s = kind == NodeKind::kEmbed ? 0 : t.forward_s;
  t.backward_weight_s = t.forward_s;
  return t;
}

double p2p_time(const CostModel& cost, int64_t bytes) {
  switch (cost.kind) {
    case CostModelKind::kUniform:
      return 0;
    case CostModelKind::kNodeTimes:
      if (cost.table.p2p_s) return *cost.table.p2p_s;
      [[fallthrough]];
    case CostModelKind::kRoofline:
      return cost.device.link_latency_s + dbl(bytes) / cost.device.link_bytes_per_s;
  }
  return 0;
}

double all_reduce_time(const CostModel& cost, int64_t bytes, int64_t ranks) {
  if (cost.kind == CostModelKind::kUniform || ranks <= 1 || bytes <= 0) return 0;
  const auto& measured = cost.table.grad_reduce_bus_bytes_per_s;
  const double bus =
      cost.kind == CostModelKind::kNodeTimes && measured ? *measured : cost.device.link_bytes_per_s;
  const double steps = 2.0 * static_cast<double>(ranks - 1);
  return steps * cost.device.link_latency_s + steps / static_cast<double>(ranks) * dbl(bytes) / bus;
}

}  // namespace tandem::schedule
