// Node times at another shape than they were measured at.
//
// Note [Node times at another shape]: a node-times file written by `tandem train
// --node-times-out` records the shape it was measured at ("measured_at": the model options, the
// micro-batch size, the expert-parallel size, the activation element size). A plan of another
// shape takes each node phase's time as a fixed part plus a part proportional to its work:
//
//   t(shape) = o_p + (t_measured - o_p) * w(shape) / w(measured)
//
// w is the node's roofline time (node_forward_work against the device: max(FLOPs / matrix rate,
// bytes / memory bandwidth)), so a matrix-bound node scales by its FLOPs, a memory-bound one
// (embed) by its bytes, and attention's quadratic term (tokens x sequence) by itself. The fixed
// seconds (kernel launches and tails, the host's waits) come from the file alone: a
// least-squares line t = o + s w through every compute node's phases at the measured shape
// (nodes of small work show the fixed part, those of large work the slope), o at least 0. One
// line does not fit every node: a phase below it (attention's weight gradient, the embedding's
// one kernel) has less fixed time than o, not less work than its FLOPs or bytes, so each phase
// keeps its work at the line's rate at least and the line's fixed part at most:
//
//   o_p = clamp(t_measured - s w(measured), 0, min(o, t_measured))
//
// (o_p = min(o, t) would make such a phase all fixed: it would not grow with the rows.) With one
// node, or all of one work, o is 0: plain proportion. A file's "node_overhead_s" replaces the
// fitted o (s is then the slope through it; 0: plain proportion). The GPU's idle time between
// nodes is not in these times (Note [Gaps between nodes] in pipeline_model.cc). The
// all-to-all nodes scale by their bytes; measured without expert parallelism (no bytes: a
// hand-over and the local permutation or weighted sum) they scale by the tokens, and planned
// with it add the link model's time.
//
// What transfers: the rows a node sees (micro-batch size, sequence length, top-k, expert
// parallelism), how many nodes there are (layers, which layers are MoE), and settings that do
// not change a node's work (norm epsilon, RoPE, the aux-loss weight, the routing weights). A
// different width (hidden, heads, head dim, FFN, experts, vocabulary) or element size runs other
// kernels at another efficiency, so a plan of it is refused, naming the setting: measure there.
#include "planner/node_scaling.h"

#include <algorithm>
#include <set>
#include <string>
#include <variant>

#include "core/error.h"

namespace tandem::schedule {
namespace {

// Model options a plan may change and still use the file's times (scaled, or not affecting them).
const std::set<std::string> kTransferable = {"num-layers",
                                             "seq-length",
                                             "moe-layer-freq",
                                             "moe-router-topk",
                                             "moe-aux-loss-coeff",
                                             "rotary-base",
                                             "use-rope-scaling",
                                             "rope-scaling-factor",
                                             "rotary-scaling-factor",
                                             "rope-low-freq-factor",
                                             "rope-high-freq-factor",
                                             "rope-original-max-position-embeddings",
                                             "norm-epsilon",
                                             "moe-router-pre-softmax"};

// The measured run's micro-batch on one rank, with the planned shape's layout flags.
FootprintShape measured_shape(const MeasuredShape& at, const FootprintShape& planned) {
  const ModelConfig& m = at.model;
  FootprintShape s = planned;
  s.tokens = at.micro_batch_size * m.seq_length;
  s.routed_rows = moe_routed_rows(m, s.tokens);
  s.expert_rows = s.routed_rows;
  s.local_experts = m.is_moe() ? m.num_experts / at.expert_parallel_size : 0;
  s.ep_size = at.expert_parallel_size;
  s.elem_bytes = at.activation_elem_bytes;
  return s;
}

// A node's work as seconds of the roofline.
double work_s(const DeviceDesc& d, NodeKind kind, const ModelConfig& cfg, const FootprintShape& s,
              int64_t ep) {
  const NodeWork w = node_forward_work(kind, cfg, s, ep, d.weight_elem_bytes);
  return std::max(w.flops / d.matrix_flops_per_s, w.memory_bytes / d.memory_bytes_per_s);
}

double phase(const NodePhaseTimes& t, int p) {
  return p == 0 ? t.forward_s : p == 1 ? t.backward_input_s : t.backward_weight_s;
}
double& phase(NodePhaseTimes& t, int p) {
  return p == 0 ? t.forward_s : p == 1 ? t.backward_input_s : t.backward_weight_s;
}

}  // namespace

void check_transferable(const MeasuredShape& at, const ModelConfig& model,
                        int64_t activation_elem_bytes) {
  const char* why =
      ": node times transfer across micro-batch size, sequence length, layers, top-k and expert "
      "parallelism, not to another width or element size (other kernels, another efficiency); "
      "measure node times at this setting (tandem train --node-times-out)";
  for (const ModelField& f : model_fields()) {
    if (kTransferable.count(f.name)) continue;
    std::visit(
        [&](auto member) {
          const nlohmann::json was = nlohmann::json(at.model.*member),
                               is = nlohmann::json(model.*member);
          TANDEM_CHECK(was == is, "--node-times ", at.source, " was measured with --", f.name, " ",
                       was.dump(), "; this plan has --", f.name, " ", is.dump(), why);
        },
        f.member);
  }
  TANDEM_CHECK(at.activation_elem_bytes == activation_elem_bytes, "--node-times ", at.source,
               " was measured with ", at.activation_elem_bytes, "-byte activations; this plan has ",
               activation_elem_bytes,
               "-byte ones (--device cuda plans 2, cpu 4, unless --activation-bytes says)", why);
}

NodeLine node_line(const CostModel& cost, const FootprintShape& planned) {
  const MeasuredShape& at = cost.table.measured_at.value();
  const FootprintShape s0 = measured_shape(at, planned);
  double n = 0, sum_w = 0, sum_t = 0, sum_ww = 0, sum_wt = 0;
  for (int k = 0; k < kNumNodeKinds; ++k) {
    const auto kind = static_cast<NodeKind>(k);
    const auto& t = cost.table.nodes[static_cast<size_t>(k)];
    if (!t || node_is_communication(kind)) continue;
    const double w = work_s(cost.device, kind, at.model, s0, at.expert_parallel_size);
    if (w <= 0) continue;
    for (int p = 0; p < 3; ++p) {
      const double time = phase(*t, p);
      if (time <= 0) continue;
      n += 1, sum_w += w, sum_t += time, sum_ww += w * w, sum_wt += w * time;
    }
  }
  if (sum_ww <= 0) return {};
  // Through a given fixed part, the least-squares slope of what is left.
  const auto slope_after = [&](double fixed) {
    return NodeLine{fixed, std::max(0.0, (sum_wt - fixed * sum_w) / sum_ww)};
  };
  if (cost.table.node_overhead_s) return slope_after(*cost.table.node_overhead_s);  // the file's
  const double var = n * sum_ww - sum_w * sum_w;
  if (n < 2 || var <= 1e-12 * n * sum_ww) return slope_after(0);  // one work: plain proportion
  const double slope = (n * sum_wt - sum_w * sum_t) / var;
  if (slope <= 0) return slope_after(0);
  return slope_after(std::max(0.0, (sum_t - slope * sum_w) / n));
}

double node_overhead_s(const CostModel& cost, const FootprintShape& planned) {
  return node_line(cost, planned).fixed_s;
}

NodePhaseTimes scaled_node_times(const CostModel& cost, NodeKind kind, const ModelConfig& cfg,
                                 const FootprintShape& shape, int64_t ep) {
  const MeasuredShape& at = cost.table.measured_at.value();
  const auto& entry = cost.table.nodes[static_cast<size_t>(kind)];
  TANDEM_CHECK(entry.has_value(), "the node-times file has no entry for \"", node_kind_name(kind),
               "\", which this model needs");
  const FootprintShape s0 = measured_shape(at, shape);
  NodePhaseTimes out = *entry;
  if (node_is_communication(kind)) {
    const double was = alltoall_bytes(at.model, s0, at.expert_parallel_size);
    const double is = alltoall_bytes(cfg, shape, ep);
    // Without expert parallelism the node's own work (the permutation, the weighted sum) is
    // memory-bound on its rows: it scales by the tokens.
    const double rows = static_cast<double>(shape.tokens) / static_cast<double>(s0.tokens);
    for (int p = 0; p < 2; ++p) {
      double& t = phase(out, p);
      if (was > 0) {
        t *= is / was;
      } else {
        t *= rows;
        if (is > 0) t += cost.device.link_latency_s + is / cost.device.link_bytes_per_s;
      }
    }
    return out;
  }
  const double w0 = work_s(cost.device, kind, at.model, s0, at.expert_parallel_size);
  const double w1 = work_s(cost.device, kind, cfg, shape, ep);
  if (w0 <= 0) return out;
  const NodeLine line = node_line(cost, shape);
  for (int p = 0; p < 3; ++p) {
    double& t = phase(out, p);
    if (t <= 0) continue;
    // Its work at the line's rate at least; the line's fixed part at most.
    const double o = std::clamp(t - line.slope * w0, 0.0, std::min(line.fixed_s, t));
    t = o + (t - o) * w1 / w0;
  }
  return out;
}

}  // namespace tandem::schedule
