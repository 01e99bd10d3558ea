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
#include <sstream>
#include <string>
#include <vector>

#include "cli/planned_run.h"
#include "cli/train_common.h"
#include "core/device.h"
#include "runtime/step_report.h"
#include "runtime/timeline.h"

namespace tandem::cli {
namespace {

// Every rank's timeline of the last step, written by rank 0 as one trace file. On the GPU the
// spans are CUDA-event times and the memory counter host times of the allocations (the host
// runs ahead of the GPU), both from the step's start.
// `with_me` false: this rank's events are left out (--profile-ranks).
void write_measured_trace(const std::string& path, runtime::PipelineTrainer& trainer,
                          Allocator& alloc, bool with_me = true) {
  const std::vector<std::string> all = runtime::gather_trace_events(trainer, alloc, with_me);
  if (trainer.groups().world->rank() == 0) runtime::write_trace_file(path, all);
}

// The node times of the last step as the JSON of `tandem plan --node-times`, with the shape and
// the choices they were measured under; written by rank 0. Throws naming the path when it cannot
// be written.
void write_node_times(const std::string& path, runtime::PipelineTrainer& trainer,
                      const RunOptions& o) {
  schedule::NodeTimesTable table = runtime::gather_node_times(trainer);
  if (trainer.groups().world->rank() != 0) return;
  table.recompute_experts = o.train.recompute_experts;
  table.recompute = o.train.recompute;
  table.moe_wgrad_merge = o.train.moe_wgrad_merge;
  // Note [Node times at another shape] (planner/node_scaling.cc): where they were measured.
  const schedule::PlanInputs in = run_inputs(o, 1);
  schedule::MeasuredShape at;
  at.model = in.model;  // at TP > 1 the shard each rank computed
  at.micro_batch_size = o.train.micro_batch_size;
  at.expert_parallel_size = o.parallel.expert_model_parallel_size;
  at.tensor_parallel_size = o.parallel.tensor_model_parallel_size;
  at.activation_elem_bytes = in.activation_elem_bytes;
  table.measured_at = at;
  std::ofstream f(path);
  f << schedule::node_times_json(table).dump(2) << "\n";
  TANDEM_CHECK(f.good(), "--node-times-out ", path, ": cannot write the file");
}

// Every rank's pipeline routing table of the last step, written by rank 0 in
// schedule/routing_file.h's format.
void write_routing(const std::string& path, runtime::PipelineTrainer& trainer) {
  const std::vector<schedule::RoutingCounts> tables = runtime::gather_routing(trainer);
  if (trainer.groups().world->rank() != 0) return;
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

// The gathered figures into the record.
void add_report(IterationRecord& rec, const runtime::StepReport& report, int me, bool offload) {
  rec.comm_seconds = report.ranks[me].comm_s;
  rec.exposed_comm_seconds = report.ranks[me].exposed_comm_s;
  bool waiting_known = true;
  std::vector<double> waiting;
  // to_record put this rank's memory alone; the report has every rank's.
  rec.mem_in_use_bytes.clear();
  rec.mem_peak_bytes.clear();
  rec.activation_peak_bytes.clear();
  rec.offload_host_peak_bytes.clear();
  for (const runtime::RankFigures& f : report.ranks) {
    rec.comm_seconds_by_rank.push_back(f.comm_s);
    rec.exposed_comm_seconds_by_rank.push_back(f.exposed_comm_s);
    waiting.push_back(f.exposed_waiting_s);
    waiting_known = waiting_known && f.exposed_waiting_s >= 0;
    rec.mem_in_use_bytes.push_back(f.mem_in_use);
    rec.mem_peak_bytes.push_back(f.mem_peak);
    rec.activation_peak_bytes.push_back(f.activation_peak);
    if (offload) rec.offload_host_peak_bytes.push_back(f.offload_host_peak);
  }
  if (waiting_known) rec.exposed_waiting_seconds_by_rank = std::move(waiting);
  if (const auto& s = report.expert_rows) {
    rec.expert_rows_step = s->step;
    rec.expert_rows_microbatch_median = s->microbatch_median;
    rec.expert_rows_microbatch_max = s->microbatch_max;
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
  const std::vector<int64_t> ranks = profile_ranks(o);
  const bool with_me =
      std::find(ranks.begin(), ranks.end(), trainer.groups().world->rank()) != ranks.end();
  write_measured_trace(profile_trace_path(o.trace_path, iteration), trainer, alloc, with_me);
}

void write_last_step_files(const RunOptions& o, runtime::PipelineTrainer& trainer,
                           Allocator& alloc) {
  if (!o.trace_path.empty() && !o.profile) write_measured_trace(o.trace_path, trainer, alloc);
  if (!o.node_times_out.empty()) write_node_times(o.node_times_out, trainer, o);
  if (!o.routing_out.empty()) write_routing(o.routing_out, trainer);
}

IterationRecord gather_record(const RunOptions& o, const runtime::StepResult& r,
                              runtime::PipelineTrainer& trainer) {
  IterationRecord rec = to_record(r);
  if (o.train.decoupled_lr >= 0) rec.decoupled_lr = r.decoupled_lr;
  add_report(rec, runtime::gather_step_report(trainer, r), trainer.groups().world->rank(),
             !o.train.offload_activations.empty());
  if (const auto& moved = trainer.last_rebalance()) {
    rec.note = rebalance_note(*moved, o.model.num_layers);
  }
  if (o.train.device != Device::kCPU) {
    rec.forward_backward_seconds = trainer.measured_forward_backward_seconds();
  }
  return rec;
}

}  // namespace tandem::cli
