// The plan as text: a table per rank and the JSON summary that `tandem plan --json` prints.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "planner/node_scaling.h"
#include "planner/planner.h"

namespace tandem::schedule {
namespace {

std::string format_bytes(int64_t b) {
  char buf[48];
  const double v = static_cast<double>(b);
  if (v >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1024.0 * 1024 * 1024));
  } else if (v >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", v / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024.0);
  }
  return buf;
}

std::string join_stages(const std::vector<int32_t>& stages) {
  std::string out;
  for (int32_t s : stages) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

}  // namespace

std::string format_plan_time(double s, CostModelKind kind) {
  char buf[48];
  if (kind == CostModelKind::kUniform) {
    std::snprintf(buf, sizeof buf, "%.2f u", s);
  } else if (s >= 1) {
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  } else if (s >= 1e-3) {
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  }
  return buf;
}

std::optional<double> planned_tokens_per_s(const Plan& plan) {
  // Note [The step's end in the plan]; uniform units have no tokens per second.
  if (plan.sim.full_step_s <= 0 || plan.inputs.cost.kind == CostModelKind::kUniform) return {};
  const Schedule& s = plan.schedule;
  return static_cast<double>(s.num_microbatches * plan.inputs.micro_batch_size *
                             plan.model.data_parallel_size * plan.inputs.model.seq_length) /
         plan.sim.full_step_s;
}

std::string format_plan_table(const Plan& plan) {
  const Schedule& s = plan.schedule;
  const CostModelKind cm = plan.inputs.cost.kind;
  std::ostringstream out;
  out << "schedule " << s.name << ": " << s.num_ranks << " ranks, " << s.num_stages << " stages, "
      << s.num_microbatches << " micro-batches, EP " << plan.inputs.expert_parallel_size;
  // Note [Tensor parallelism] (core/config_tp.cc): each pipeline rank is TP ranks, planned as one.
  if (plan.inputs.tensor_parallel_size > 1) out << ", TP " << plan.inputs.tensor_parallel_size;
  out << ", cost model " << cost_model_name(cm) << "\n";
  char line[320];
  std::snprintf(line, sizeof line, "step time %s, bubble %.1f%%\n",
                format_plan_time(plan.sim.step_time_s, cm).c_str(), 100 * plan.sim.bubble_fraction);
  out << line;
  if (const std::optional<double> tokens = planned_tokens_per_s(plan)) {
    std::snprintf(line, sizeof line,
                  "whole step %s (with the gradient all-reduce, norm and update): %.0f tokens/s "
                  "on %lld ranks\n",
                  format_plan_time(plan.sim.full_step_s, cm).c_str(), *tokens,
                  static_cast<long long>(s.num_ranks * plan.model.data_parallel_size *
                                         plan.inputs.tensor_parallel_size));
    out << line;
  }
  const int64_t dp = plan.model.data_parallel_size;
  if (dp > 1) {  // Note [Gradient reduction in the plan]
    double tail = 0, busy = 0;
    for (const RankResult& r : plan.sim.ranks) {
      tail = std::max(tail, r.grad_reduce_tail_s);
      busy = std::max(busy, r.grad_reduce_s);
    }
    std::snprintf(
        line, sizeof line,
        "data-parallel size %lld: gradient all-reduce %s a rank, %s of it after the "
        "backward (%s); step with it %s\n",
        static_cast<long long>(dp), format_plan_time(busy, cm).c_str(),
        format_plan_time(tail, cm).c_str(),
        plan.model.overlap_grad_reduce ? "each unit beside the backward" : "all at the step's end",
        format_plan_time(plan.sim.step_with_reduce_s, cm).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "%4s  %-10s %6s %8s %13s %13s %14s %14s %14s %14s %14s %6s\n",
                "rank", "stages", "busy%", "bubble%", "exposed comm", "exposed a2a", "params+grads",
                "optimizer", "activations", "in flight", "workspace", "peak");
  out << line;
  for (const RankResult& r : plan.sim.ranks) {
    std::snprintf(
        line, sizeof line, "%4d  %-10s %6.1f %8.1f %13s %13s %14s %14s %14s %14s %14s %s\n", r.rank,
        join_stages(r.stages).c_str(), 100 * r.busy_fraction, 100 * r.bubble_fraction,
        format_plan_time(r.exposed_comm_s, cm).c_str(),
        format_plan_time(r.exposed_alltoall_s, cm).c_str(),
        format_bytes(r.static_memory.param_bytes + r.static_memory.grad_bytes +
                     r.static_memory.compute_copy_bytes)
            .c_str(),
        format_bytes(r.static_memory.optimizer_bytes).c_str(),
        format_bytes(r.activation_peak_bytes).c_str(), format_bytes(r.in_flight_peak_bytes).c_str(),
        format_bytes(r.workspace_peak_bytes).c_str(), format_bytes(r.peak_bytes).c_str());
    out << line;
  }
  if (plan.inputs.offload_kinds != 0) {  // Note [Offload in the plan]
    out << "offloaded activations in host memory at their peak:";
    for (const RankResult& r : plan.sim.ranks) {
      out << " rank " << r.rank << " " << format_bytes(r.offload_host_peak_bytes);
    }
    out << "\n";
  }
  bool waits = false;
  for (const RankResult& r : plan.sim.ranks) waits = waits || r.exposed_alltoall_waiting_s > 0;
  if (waits) {
    out << "of the exposed a2a, waiting for the slowest expert rank:";
    for (const RankResult& r : plan.sim.ranks) {
      out << " rank " << r.rank << " " << format_plan_time(r.exposed_alltoall_waiting_s, cm);
    }
    out << "\n";
  }
  out << "(activations, in flight and workspace: each at its own peak; peak: static + "
         "activations + in flight + workspace at the rank's highest point";
  if (plan.inputs.gpu) out << "; params+grads includes the weights' bf16 copy";
  out << "; workspace: the nodes' op temporaries";
  out << ")\n";
  return out.str();
}

nlohmann::json plan_summary_json(const Plan& plan) {
  const Schedule& s = plan.schedule;
  nlohmann::json j;
  j["schedule"] = s.name;
  j["pipeline_size"] = s.num_ranks;
  j["num_stages"] = s.num_stages;
  j["virtual_stages"] = s.num_ranks > 0 ? s.num_stages / s.num_ranks : 0;
  j["num_microbatches"] = s.num_microbatches;
  j["expert_parallel_size"] = plan.inputs.expert_parallel_size;
  j["tensor_parallel_size"] = plan.inputs.tensor_parallel_size;
  j["data_parallel_size"] = plan.model.data_parallel_size;  // Note [Gradient reduction in the plan]
  j["overlap_grad_reduce"] = plan.model.overlap_grad_reduce;
  j["cost_model"] = std::string(cost_model_name(plan.inputs.cost.kind));
  j["time_unit"] = plan.inputs.cost.kind == CostModelKind::kUniform ? "uniform" : "s";
  j["step_time_s"] = plan.sim.step_time_s;
  j["bubble_fraction"] = plan.sim.bubble_fraction;
  j["step_with_reduce_s"] = plan.sim.step_with_reduce_s;
  j["full_step_s"] = plan.sim.full_step_s;  // Note [The step's end in the plan]
  if (const std::optional<double> tokens = planned_tokens_per_s(plan)) j["tokens_per_s"] = *tokens;
  // Note [Node times at another shape]: the fixed part of a node the scaling took.
  if (plan.inputs.cost.kind == CostModelKind::kNodeTimes && plan.inputs.cost.table.measured_at) {
    j["node_overhead_s"] = node_overhead_s(plan.inputs.cost, plan.model.shape);
  }
  // Note [Gaps between nodes] (pipeline_model.cc): what the plan added before each node phase.
  if (plan.inputs.cost.kind == CostModelKind::kNodeTimes && plan.inputs.cost.table.node_gap_s) {
    j["node_gap_s"] = *plan.inputs.cost.table.node_gap_s;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankResult& r : plan.sim.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"stages", r.stages},
                     {"busy_fraction", r.busy_fraction},
                     {"bubble_fraction", r.bubble_fraction},
                     {"compute_busy_s", r.compute_busy_s},
                     {"comm_busy_s", r.comm_busy_s},
                     {"exposed_comm_s", r.exposed_comm_s},
                     {"exposed_alltoall_s", r.exposed_alltoall_s},
                     {"exposed_alltoall_waiting_s", r.exposed_alltoall_waiting_s},
                     {"grad_reduce_s", r.grad_reduce_s},
                     {"grad_reduce_tail_s", r.grad_reduce_tail_s},
                     {"step_end_work_s", r.step_end_work_s},
                     {"param_bytes", r.static_memory.param_bytes},
                     {"grad_bytes", r.static_memory.grad_bytes},
                     {"optimizer_bytes", r.static_memory.optimizer_bytes},
                     {"compute_copy_bytes", r.static_memory.compute_copy_bytes},
                     {"activation_peak_bytes", r.activation_peak_bytes},
                     {"in_flight_peak_bytes", r.in_flight_peak_bytes},
                     {"workspace_peak_bytes", r.workspace_peak_bytes},
                     {"peak_bytes", r.peak_bytes},
                     {"offload_host_peak_bytes", r.offload_host_peak_bytes},
                     {"peak_time_s", r.peak_time_s},
                     {"peak_live_microbatches", r.peak_live_microbatches}});
  }
  for (size_t i = 0; i < plan.sim.ranks.size(); ++i) {
    nlohmann::json by_node = nlohmann::json::object();
    const auto& at_peak = plan.sim.ranks[i].activation_at_peak_by_node;
    for (int k = 0; k < kNumNodeKinds; ++k) {
      if (at_peak[k] != 0)
        by_node[std::string(node_kind_name(static_cast<NodeKind>(k)))] = at_peak[k];
    }
    ranks[i]["activation_bytes_at_peak_by_node"] = std::move(by_node);
  }
  j["ranks"] = std::move(ranks);
  return j;
}

}  // namespace tandem::schedule
