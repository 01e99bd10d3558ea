// The cross-rank gathers of a step's measurements (step_report.h).
#include "runtime/step_report.h"

#include <algorithm>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "runtime/timeline.h"

namespace tandem::runtime {

// The routing counts a rank recorded in the step, gathered over its pipeline or expert group.
std::vector<schedule::RoutingCounts> PipelineTrainer::gather_routing(comm::Communicator& group) {
  const auto n = static_cast<int64_t>(routing_.expert_rows.size());
  Tensor mine = Tensor::empty({n}, DType::kI64, MemCategory::kOther, "routing.mine");
  std::copy(routing_.expert_rows.begin(), routing_.expert_rows.end(), mine.data<int64_t>());
  Tensor all = Tensor::empty({group.size() * n}, DType::kI64, MemCategory::kOther, "routing.all");
  group.all_gather(all, mine);
  std::vector<schedule::RoutingCounts> out(static_cast<size_t>(group.size()), routing_);
  for (int r = 0; r < group.size(); ++r) {
    std::copy(all.data<int64_t>() + r * n, all.data<int64_t>() + (r + 1) * n,
              out[static_cast<size_t>(r)].expert_rows.begin());
  }
  return out;
}

schedule::RoutingCounts PipelineTrainer::pipeline_routing_counts() {
  if (routing_.empty()) return routing_;
  // Each layer lives on one pipeline rank; the others report -1 for it.
  schedule::RoutingCounts out = routing_;
  for (const schedule::RoutingCounts& t : gather_routing(*groups_->pp)) {
    for (size_t i = 0; i < out.expert_rows.size(); ++i) {
      out.expert_rows[i] = std::max(out.expert_rows[i], t.expert_rows[i]);
    }
  }
  return out;
}

std::vector<schedule::RoutingCounts> PipelineTrainer::expert_group_routing_counts() {
  if (routing_.empty()) return {};
  return gather_routing(*groups_->ep);
}

StepReport gather_step_report(PipelineTrainer& trainer, const StepResult& r) {
  comm::Communicator& world = *trainer.groups().world;
  constexpr int kFields = 7;
  Tensor mine = Tensor::empty({kFields}, DType::kF64, MemCategory::kOther, "report");
  double* v = mine.data<double>();
  v[0] = trainer.comm_busy_seconds();
  v[1] = trainer.comm_exposed_seconds();
  v[2] = trainer.comm_exposed_waiting_seconds();
  // Byte counts below 2^53 are exact in a double.
  v[3] = static_cast<double>(r.memory.total_in_use);
  v[4] = static_cast<double>(r.memory.total_peak);
  v[5] = static_cast<double>(r.activation_peak);
  v[6] = static_cast<double>(r.offload_host_peak);
  Tensor all =
      Tensor::empty({kFields * world.size()}, DType::kF64, MemCategory::kOther, "report.all");
  world.all_gather(all, mine);
  StepReport out;
  for (int p = 0; p < world.size(); ++p) {
    const double* a = all.data<double>() + kFields * p;
    RankFigures f;
    f.comm_s = a[0];
    f.exposed_comm_s = a[1];
    f.exposed_waiting_s = a[2] >= 0 ? a[2] : -1;
    f.mem_in_use = static_cast<int64_t>(a[3]);
    f.mem_peak = static_cast<int64_t>(a[4]);
    f.activation_peak = static_cast<int64_t>(a[5]);
    f.offload_host_peak = static_cast<int64_t>(a[6]);
    out.ranks.push_back(f);
  }
  if (trainer.groups().ep->size() > 1) {
    const std::vector<schedule::RoutingCounts> group = trainer.expert_group_routing_counts();
    if (!group.empty()) out.expert_rows = schedule::expert_rows_spread(group);
  }
  return out;
}

std::vector<std::string> gather_trace_events(PipelineTrainer& trainer, Allocator& alloc,
                                             bool with_me) {
  comm::Communicator& world = *trainer.groups().world;
  const std::string mine = with_me ? rank_trace_events(world.rank(), trainer.timeline(),
                                                       alloc.trace(), trainer.step_start_seconds())
                                   : std::string();
  alloc.set_trace(false);
  std::vector<std::string> all = world.all_gather_bytes(mine);
  if (world.rank() != 0) all.clear();
  return all;
}

schedule::NodeTimesTable gather_node_times(PipelineTrainer& trainer) {
  comm::Communicator& world = *trainer.groups().world;
  schedule::NodeTimesTable table = trainer.measured_node_times();
  // Per node kind: forward, backward_input, backward_weight and 1 when timed; then three
  // (value, 1 when measured) pairs: the update's rate, the all-reduce's bandwidth, the node gap.
  constexpr int kValues = 4;
  constexpr int kRates = kNumNodeKinds * kValues;
  Tensor sums = Tensor::zeros({kRates + 6}, DType::kF64, MemCategory::kOther, "node_times");
  double* s = sums.data<double>();
  for (int k = 0; k < kNumNodeKinds; ++k) {
    if (const auto& t = table.nodes[k]) {
      double* v = s + k * kValues;
      v[0] = t->forward_s;
      v[1] = t->backward_input_s;
      v[2] = t->backward_weight_s;
      v[3] = 1;
    }
  }
  std::optional<double>* rates[] = {&table.update_s_per_weight, &table.grad_reduce_bus_bytes_per_s,
                                    &table.node_gap_s};
  for (int i = 0; i < 3; ++i) {
    if (*rates[i]) {
      s[kRates + 2 * i] = **rates[i];
      s[kRates + 2 * i + 1] = 1;
    }
  }
  Tensor end_rate = Tensor::empty({1}, DType::kF64, MemCategory::kOther, "step_end");
  end_rate.data<double>()[0] = table.step_end_s_per_weight.value_or(-1);
  Tensor end_rates = Tensor::empty({world.size()}, DType::kF64, MemCategory::kOther, "step_ends");
  world.all_gather(end_rates, end_rate);
  world.all_reduce_sum(sums);
  if (world.rank() != 0) return table;
  for (int k = 0; k < kNumNodeKinds; ++k) {
    const double* v = s + k * kValues;
    if (v[3] == 0) {
      table.nodes[k].reset();
      continue;
    }
    table.nodes[k] = schedule::NodePhaseTimes{v[0] / v[3], v[1] / v[3], v[2] / v[3]};
  }
  for (int i = 0; i < 3; ++i) {
    const double n = s[kRates + 2 * i + 1];
    *rates[i] = n > 0 ? std::optional<double>(s[kRates + 2 * i] / n) : std::nullopt;
  }
  std::optional<double> least;
  for (int p = 0; p < world.size(); ++p) {
    const double e = end_rates.data<double>()[p];
    if (e > 0 && (!least || e < *least)) least = e;
  }
  table.step_end_s_per_weight = least;
  return table;
}

std::vector<schedule::RoutingCounts> gather_routing(PipelineTrainer& trainer) {
  comm::Communicator& world = *trainer.groups().world;
  const std::vector<std::string> all =
      world.all_gather_bytes(schedule::routing_file_text({trainer.pipeline_routing_counts()}));
  std::vector<schedule::RoutingCounts> tables;
  if (world.rank() != 0) return tables;
  for (const std::string& text : all) {
    tables.push_back(schedule::parse_routing_file(text, "--routing-out", 0));
  }
  return tables;
}

}  // namespace tandem::runtime
