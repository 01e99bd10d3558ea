// What `tandem train` writes after a step besides checkpoints (train_outputs.h): the measured
// trace, node times and routing of the last step, each step's record gathered from every rank,
// and the check of --tensorboard-dir before any of it.
#include "cli/train_outputs.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/planned_run.h"
#include "cli/train_common.h"
#include "core/device.h"
#include "schedule/node_scaling.h"
#include "schedule/routing_file.h"

namespace tandem::cli {
namespace {

// Every rank's timeline of the last step, written by rank 0 as one trace file. On the GPU the
// spans are CUDA-event times and the memory counter host times of the allocations (the host
// runs ahead of the GPU), both from the step's start.
// `with_me` false: this rank's events are left out (--profile-ranks).
void write_measured_trace(const std::string& path, runtime::PipelineTrainer& trainer,
                          comm::Communicator& world, Allocator& alloc, bool with_me = true) {
  const std::string mine =
      with_me ? runtime::rank_trace_events(world.rank(), trainer.timeline(), alloc.trace(),
                                           trainer.step_start_seconds())
              : std::string();
  alloc.set_trace(false);
  const std::vector<std::string> all = world.all_gather_bytes(mine);
  if (world.rank() == 0) runtime::write_trace_file(path, all);
}

// The mean over ranks of each node kind's measured times (each rank times its own layers), as
// the JSON of `tandem plan --node-times`; written by rank 0. Throws naming the path when it
// cannot be written.
void write_node_times(const std::string& path, const runtime::PipelineTrainer& trainer,
                      comm::Communicator& world, const RunOptions& o) {
  const bool recompute_experts = o.train.recompute_experts;
  constexpr int kValues = 4;  // forward, backward_input, backward_weight, 1 when measured
  // The nodes', then (each with 1 when measured) the deferred update's seconds per weight, the
  // gradient all-reduce's bus bandwidth and the GPU's idle seconds before a node phase.
  const schedule::NodeTimesTable table = trainer.measured_node_times();
  Tensor mine =
      Tensor::zeros({kNumNodeKinds * kValues + 6}, DType::kF64, MemCategory::kOther, "node_times");
  if (const auto& u = table.update_s_per_weight) {
    mine.data<double>()[kNumNodeKinds * kValues] = *u;
    mine.data<double>()[kNumNodeKinds * kValues + 1] = 1;
  }
  if (const auto& b = table.grad_reduce_bus_bytes_per_s) {
    mine.data<double>()[kNumNodeKinds * kValues + 2] = *b;
    mine.data<double>()[kNumNodeKinds * kValues + 3] = 1;
  }
  if (const auto& g = table.node_gap_s) {
    mine.data<double>()[kNumNodeKinds * kValues + 4] = *g;
    mine.data<double>()[kNumNodeKinds * kValues + 5] = 1;
  }
  // Note [The step's end in the plan]: the least of the ranks' rates, the rank that waited
  // least for the others' forward-backward (a pipeline's ranks end theirs at different times).
  Tensor end_rate = Tensor::empty({1}, DType::kF64, MemCategory::kOther, "step_end");
  end_rate.data<double>()[0] = table.step_end_s_per_weight.value_or(-1);
  Tensor end_rates = Tensor::empty({world.size()}, DType::kF64, MemCategory::kOther, "step_ends");
  world.all_gather(end_rates, end_rate);
  for (int k = 0; k < kNumNodeKinds; ++k) {
    const auto& t = table.nodes[k];
    if (!t) continue;
    double* v = mine.data<double>() + k * kValues;
    v[0] = t->forward_s;
    v[1] = t->backward_input_s;
    v[2] = t->backward_weight_s;
    v[3] = 1;
  }
  world.all_reduce_sum(mine);
  if (world.rank() != 0) return;
  nlohmann::json nodes = nlohmann::json::object();
  for (int k = 0; k < kNumNodeKinds; ++k) {
    const double* v = mine.data<double>() + k * kValues;
    if (v[3] == 0) continue;
    nodes[std::string(node_kind_name(static_cast<NodeKind>(k)))] = {
        {"forward", v[0] / v[3]},
        {"backward_input", v[1] / v[3]},
        {"backward_weight", v[2] / v[3]}};
  }
  nlohmann::json out = {{"nodes", nodes},
                        {"recompute_experts", recompute_experts},
                        {"moe_wgrad_merge", o.train.moe_wgrad_merge}};
  const double* u = mine.data<double>() + kNumNodeKinds * kValues;
  if (u[1] > 0) out["update_per_weight"] = u[0] / u[1];  // Note [Deferred update in the plan]
  // Note [Gradient reduction in the plan] (schedule/simulator.cc)
  if (u[3] > 0) out["grad_reduce_bus_bytes_per_s"] = u[2] / u[3];
  if (u[5] > 0) out["node_gap_s"] = u[4] / u[5];  // Note [Gaps between nodes] (pipeline_model.cc)
  // Note [The step's end in the plan]: with the choice it was measured under.
  double least = -1;
  for (int p = 0; p < world.size(); ++p) {
    const double e = end_rates.data<double>()[p];
    if (e > 0 && (least < 0 || e < least)) least = e;
  }
  if (least > 0) out["step_end_per_weight"] = least;
  out["defer_optimizer"] = table.defer_optimizer;
  // Note [Node times at another shape] (schedule/node_scaling.cc): where they were measured.
  schedule::MeasuredShape at;
  at.model = o.model;
  at.micro_batch_size = o.train.micro_batch_size;
  at.expert_parallel_size = o.parallel.expert_model_parallel_size;
  at.activation_elem_bytes = run_inputs(o, 1).activation_elem_bytes;
  out["measured_at"] = schedule::measured_shape_json(at);
  std::ofstream f(path);
  f << out.dump(2) << "\n";
  TANDEM_CHECK(f.good(), "--node-times-out ", path, ": cannot write the file");
}

// Every rank's pipeline routing table of the last step (collective over each pipeline group),
// written by rank 0 in schedule/routing_file.h's format.
void write_routing(const std::string& path, runtime::PipelineTrainer& trainer,
                   comm::Communicator& world) {
  const schedule::RoutingCounts mine = trainer.pipeline_routing_counts();
  const std::vector<std::string> all = world.all_gather_bytes(schedule::routing_file_text({mine}));
  if (world.rank() != 0) return;
  std::vector<schedule::RoutingCounts> tables;
  for (size_t r = 0; r < all.size(); ++r) {
    tables.push_back(schedule::parse_routing_file(all[r], "--routing-out", 0));
  }
  std::ofstream f(path);
  f << schedule::routing_file_text(tables);
  TANDEM_CHECK(f.good(), "--routing-out ", path, ": cannot write the file");
}

// "experts re-placed in 6 of 8 layers: most loaded expert rank 1.18x -> 1.02x the mean rows
// (1.2 GiB of expert weights and Adam moments sent by rank 0)".
std::string rebalance_note(const runtime::Rebalance& r, int64_t layers) {
  return detail::concat("experts re-placed in ", r.layers, " of ", layers,
                        " layers: most loaded expert rank ", format_fixed(r.before, 3), "x -> ",
                        format_fixed(r.after, 3), "x the mean rows (", format_bytes(r.moved_bytes),
                        " of expert weights and Adam moments sent by rank 0)");
}

// The step's routed rows over this rank's expert-parallel group (every rank calls it; each
// group gathers its own), as the most loaded rank's over the mean (schedule::RowsSpread).
void expert_rows_spread(IterationRecord& rec, runtime::PipelineTrainer& trainer) {
  if (trainer.groups().ep->size() < 2) return;
  const std::vector<schedule::RoutingCounts> group = trainer.expert_group_routing_counts();
  if (group.empty()) return;
  const schedule::RowsSpread s = schedule::expert_rows_spread(group);
  rec.expert_rows_step = s.step;
  rec.expert_rows_microbatch_median = s.microbatch_median;
  rec.expert_rows_microbatch_max = s.microbatch_max;
}

// Every rank's all-to-all seconds (busy, exposed, waiting) into the record.
void gather_comm_seconds(IterationRecord& rec, runtime::PipelineTrainer& trainer,
                         comm::Communicator& world) {
  rec.comm_seconds = trainer.comm_busy_seconds();
  rec.exposed_comm_seconds = trainer.comm_exposed_seconds();
  Tensor comm_mine = Tensor::empty({3}, DType::kF64, MemCategory::kOther, "comm");
  comm_mine.data<double>()[0] = rec.comm_seconds;
  comm_mine.data<double>()[1] = rec.exposed_comm_seconds;
  comm_mine.data<double>()[2] = trainer.comm_exposed_waiting_seconds();
  Tensor comm_all = Tensor::empty({3 * world.size()}, DType::kF64, MemCategory::kOther, "comm.all");
  world.all_gather(comm_all, comm_mine);
  bool waiting_known = true;
  std::vector<double> waiting;
  for (int p = 0; p < world.size(); ++p) {
    rec.comm_seconds_by_rank.push_back(comm_all.data<double>()[3 * p]);
    rec.exposed_comm_seconds_by_rank.push_back(comm_all.data<double>()[3 * p + 1]);
    waiting.push_back(comm_all.data<double>()[3 * p + 2]);
    waiting_known = waiting_known && waiting.back() >= 0;
  }
  if (waiting_known) rec.exposed_waiting_seconds_by_rank = std::move(waiting);
}

// Every rank's memory into the record.
// offload: the run offloads activations (its host peak goes into the record too).
void gather_memory(IterationRecord& rec, const runtime::StepResult& r, comm::Communicator& world,
                   bool offload) {
  constexpr int kFields = 4;
  Tensor mine = Tensor::empty({kFields}, DType::kI64, MemCategory::kOther, "mem");
  mine.data<int64_t>()[0] = r.memory.total_in_use;
  mine.data<int64_t>()[1] = r.memory.total_peak;
  mine.data<int64_t>()[2] = r.activation_peak;
  mine.data<int64_t>()[3] = r.offload_host_peak;
  Tensor all = Tensor::empty({kFields * world.size()}, DType::kI64, MemCategory::kOther, "mem.all");
  world.all_gather(all, mine);
  rec.mem_in_use_bytes.clear();
  rec.mem_peak_bytes.clear();
  rec.activation_peak_bytes.clear();
  rec.offload_host_peak_bytes.clear();
  for (int p = 0; p < world.size(); ++p) {
    const int64_t* v = all.data<int64_t>() + kFields * p;
    rec.mem_in_use_bytes.push_back(v[0]);
    rec.mem_peak_bytes.push_back(v[1]);
    rec.activation_peak_bytes.push_back(v[2]);
    if (offload) rec.offload_host_peak_bytes.push_back(v[3]);
  }
}

}  // namespace

void check_tensorboard_dir(const std::string& dir) {
  if (dir.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    TANDEM_CHECK(fs::is_directory(dir, ec), "--tensorboard-dir ", dir,
                 ": exists and is not a directory; give a directory (made if missing)");
    TANDEM_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--tensorboard-dir ", dir,
                 ": cannot write into it (", std::strerror(errno), ")");
    return;
  }
  fs::path up = fs::absolute(dir, ec).parent_path();
  while (!fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
  TANDEM_CHECK(fs::is_directory(up, ec), "--tensorboard-dir ", dir,
               ": cannot be made: ", up.string(), " is not a directory");
  TANDEM_CHECK(::access(up.c_str(), W_OK | X_OK) == 0, "--tensorboard-dir ", dir,
               ": cannot be made in ", up.string(), " (", std::strerror(errno), ")");
}

std::vector<int64_t> profile_ranks(const RunOptions& o) {
  std::vector<int64_t> ranks;
  std::stringstream in(o.profile_ranks);
  std::string item;
  while (std::getline(in, item, ',')) {
    int64_t r = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), r);
    TANDEM_CHECK(ec == std::errc() && end == item.data() + item.size() && r >= 0,
                 "--profile-ranks ", o.profile_ranks,
                 " is invalid: give world ranks >= 0, comma-separated (0,1,3)");
    ranks.push_back(r);
  }
  TANDEM_CHECK(!ranks.empty(), "--profile-ranks is empty: give world ranks, comma-separated");
  return ranks;
}

bool profiles_step(const RunOptions& o, int64_t iteration) {
  // Megatron-LM counts the iterations done before the step: step k (1-based) is k - 1.
  return o.profile && iteration - 1 >= o.profile_step_start && iteration - 1 < o.profile_step_end;
}

std::string profile_trace_path(const std::string& trace, int64_t iteration) {
  const std::string tag = ".iter" + std::to_string(iteration);
  const size_t slash = trace.find_last_of('/');
  const size_t dot = trace.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return trace + tag;
  return trace.substr(0, dot) + tag + trace.substr(dot);
}

void write_profiled_step(const RunOptions& o, runtime::PipelineTrainer& trainer, Allocator& alloc,
                         int64_t iteration) {
  comm::Communicator& world = *trainer.groups().world;
  const std::vector<int64_t> ranks = profile_ranks(o);
  const bool with_me = std::find(ranks.begin(), ranks.end(), world.rank()) != ranks.end();
  write_measured_trace(profile_trace_path(o.trace_path, iteration), trainer, world, alloc, with_me);
}

void write_last_step_files(const RunOptions& o, runtime::PipelineTrainer& trainer,
                           Allocator& alloc) {
  comm::Communicator& world = *trainer.groups().world;
  if (!o.trace_path.empty() && !o.profile) {
    write_measured_trace(o.trace_path, trainer, world, alloc);
  }
  if (!o.node_times_out.empty()) {
    write_node_times(o.node_times_out, trainer, world, o);
  }
  if (!o.routing_out.empty()) write_routing(o.routing_out, trainer, world);
}

IterationRecord gather_record(const RunOptions& o, const runtime::StepResult& r,
                              runtime::PipelineTrainer& trainer) {
  comm::Communicator& world = *trainer.groups().world;
  IterationRecord rec = to_record(r);
  if (o.train.decoupled_lr >= 0) rec.decoupled_lr = r.decoupled_lr;
  gather_comm_seconds(rec, trainer, world);
  expert_rows_spread(rec, trainer);
  gather_memory(rec, r, world, !o.train.offload_activations.empty());
  if (const auto& moved = trainer.last_rebalance()) {
    rec.note = rebalance_note(*moved, o.model.num_layers);
  }
  if (o.train.device != Device::kCPU) {
    rec.forward_backward_seconds = trainer.measured_forward_backward_seconds();
  }
  return rec;
}

}  // namespace tandem::cli
