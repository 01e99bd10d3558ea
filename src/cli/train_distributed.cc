// `tandem train` on several ranks (under mpirun): the same configuration checked on every rank,
// the parallel layout's groups, the schedule generated and validated, --load restored into every
// rank's chunks, the pipeline trainer's steps, per-rank memory in the log, and checkpoints
// gathered to rank 0 for --save (docs/checkpoints.md, "Several ranks").
#include <chrono>
#include <fstream>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/planned_run.h"
#include "cli/progress.h"
#include "cli/train_checkpoint.h"
#include "comm/mpi_communicator.h"
#include "core/device.h"
#include "runtime/checkpoint.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/generators.h"
#include "schedule/routing_file.h"
#include "schedule/validator.h"
#include "train_common.h"

namespace tandem::cli {
namespace {

// Every setting that must agree across ranks, one "key=value" line each.
std::string canonical_config(const RunOptions& o) {
  const ModelConfig& m = o.model;
  const TrainConfig& t = o.train;
  const ParallelConfig& p = o.parallel;
  std::ostringstream s;
  s.precision(17);
  s << "num-layers=" << m.num_layers << "\nhidden-size=" << m.hidden_size
    << "\nnum-attention-heads=" << m.num_attention_heads << "\nnum-query-groups="
    << m.num_query_groups << "\nffn-hidden-size=" << m.ffn_hidden_size << "\nnum-experts="
    << m.num_experts << "\nmoe-router-topk=" << m.moe_router_topk << "\nmoe-aux-loss-coeff="
    << m.moe_aux_loss_coeff << "\nvocab-size=" << m.vocab_size << "\nseq-length="
    << m.seq_length << "\nrotary-base=" << m.rotary_base << "\nnorm-epsilon=" << m.norm_epsilon
    << "\nmicro-batch-size=" << t.micro_batch_size << "\nglobal-batch-size="
    << t.global_batch_size << "\ntrain-iters=" << t.train_iters << "\nlr=" << t.lr
    << "\nmin-lr=" << t.min_lr << "\nlr-warmup-iters=" << t.lr_warmup_iters
    << "\nlr-decay-iters=" << t.lr_decay_iters << "\nweight-decay=" << t.weight_decay
    << "\nclip-grad=" << t.clip_grad << "\nseed=" << t.seed
    << "\nrecompute-experts=" << t.recompute_experts
    << "\nmoe-router-force-load-balancing=" << t.moe_router_force_balance
    << "\nrebalance-experts=" << t.rebalance_experts
    << "\ndefer-optimizer=" << t.defer_optimizer
    << "\noverlap-grad-reduce=" << t.overlap_grad_reduce
    << "\npipeline-model-parallel-size=" << p.pipeline_model_parallel_size
    << "\nexpert-model-parallel-size=" << p.expert_model_parallel_size
    << "\nvirtual-pipeline-model-parallel-size=" << p.virtual_pipeline_model_parallel_size
    << "\nschedule=" << p.schedule << "\npair-first-forwards=" << p.pair_first_forwards
    << "\ndata-path=" << o.data_path << "\nsave=" << o.save_dir
    << "\nsave-interval=" << o.save_interval << "\nkeep-checkpoints=" << o.keep_checkpoints
    << "\nload=" << o.load_dir << "\nnan-policy=" << o.nan_policy << "\n";
  return s.str();
}

// Throws on every rank when any rank was started with other settings, naming the first key
// that differs and both values.
void check_same_config(comm::Communicator& world, const RunOptions& o) {
  const std::vector<std::string> all = world.all_gather_bytes(canonical_config(o));
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    throw Error(detail::concat("rank ", r, " was started with a different configuration than rank "
                               "0: ", lb, " on rank ", r, " but ", la,
                               " on rank 0; start every rank with the same options"));
  }
}

// Test-only fault injection, TANDEM_FAULT="rank=R,iter=I,mode=exit|hang|nan": rank R dies or
// hangs before step I, so tests can show that the other ranks stop with an error instead of
// hanging; or (nan) the first gradient element of rank R's first stage becomes NaN after step I's
// gradient reduction, a copy the other ranks do not see (Note [Non-finite steps on several
// ranks] in runtime/pipeline_trainer.cc).
struct Fault {
  int rank = -1;
  int64_t iteration = -1;
  std::string mode;
};

Fault test_fault() {
  const char* spec = std::getenv("TANDEM_FAULT");
  if (spec == nullptr) return {};
  int r = -1;
  long long it = -1;
  char mode[16] = {0};
  if (std::sscanf(spec, "rank=%d,iter=%lld,mode=%15s", &r, &it, mode) != 3) return {};
  return {r, static_cast<int64_t>(it), mode};
}

void maybe_inject_fault(const Fault& fault, int rank, int64_t iteration) {
  if (fault.rank != rank || fault.iteration != iteration) return;
  if (fault.mode == "exit") std::_Exit(9);
  if (fault.mode != "hang") return;
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}

void install_nan_fault(const Fault& fault, runtime::PipelineTrainer& trainer) {
  if (fault.mode != "nan" || fault.rank != trainer.groups().rank) return;
  const int64_t at = fault.iteration;
  trainer.set_after_backward_hook([at](std::vector<runtime::StageRuntime>& stages, int64_t it) {
    if (it == at) poison_gradient(stages.front().params->flat_grads());
  });
}

// Every rank's timeline of the last step, written by rank 0 as one trace file. On the GPU the
// spans are CUDA-event times and the memory counter host times of the allocations (the host
// runs ahead of the GPU), both from the step's start.
void write_measured_trace(const std::string& path, runtime::PipelineTrainer& trainer,
                          comm::Communicator& world, Allocator& alloc) {
  const std::string mine = runtime::rank_trace_events(
      world.rank(), trainer.timeline(), alloc.trace(), trainer.step_start_seconds());
  alloc.set_trace(false);
  const std::vector<std::string> all = world.all_gather_bytes(mine);
  if (world.rank() == 0) runtime::write_trace_file(path, all);
}

// The mean over ranks of each node kind's measured times (each rank times its own layers), as
// the JSON of `tandem plan --node-times`; written by rank 0. Throws naming the path when it
// cannot be written.
void write_node_times(const std::string& path, const runtime::PipelineTrainer& trainer,
                      comm::Communicator& world, bool recompute_experts) {
  constexpr int kValues = 4;  // forward, backward_input, backward_weight, 1 when measured
  // The nodes', then (each with 1 when measured) the deferred update's seconds per weight and
  // the gradient all-reduce's bus bandwidth.
  Tensor mine = Tensor::zeros({kNumNodeKinds * kValues + 4}, DType::kF64, MemCategory::kOther,
                              "node_times");
  if (const auto& u = trainer.measured_node_times().update_s_per_weight) {
    mine.data<double>()[kNumNodeKinds * kValues] = *u;
    mine.data<double>()[kNumNodeKinds * kValues + 1] = 1;
  }
  if (const auto& b = trainer.measured_node_times().grad_reduce_bus_bytes_per_s) {
    mine.data<double>()[kNumNodeKinds * kValues + 2] = *b;
    mine.data<double>()[kNumNodeKinds * kValues + 3] = 1;
  }
  // Note [The step's end in the plan]: the least of the ranks' rates, the rank that waited
  // least for the others' forward-backward (a pipeline's ranks end theirs at different times).
  Tensor end_rate = Tensor::empty({1}, DType::kF64, MemCategory::kOther, "step_end");
  end_rate.data<double>()[0] = trainer.measured_node_times().step_end_s_per_weight.value_or(-1);
  Tensor end_rates = Tensor::empty({world.size()}, DType::kF64, MemCategory::kOther, "step_ends");
  world.all_gather(end_rates, end_rate);
  for (int k = 0; k < kNumNodeKinds; ++k) {
    const auto& t = trainer.measured_node_times().nodes[k];
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
        {"forward", v[0] / v[3]}, {"backward_input", v[1] / v[3]},
        {"backward_weight", v[2] / v[3]}};
  }
  nlohmann::json out = {{"nodes", nodes}, {"recompute_experts", recompute_experts}};
  const double* u = mine.data<double>() + kNumNodeKinds * kValues;
  if (u[1] > 0) out["update_per_weight"] = u[0] / u[1];  // Note [Deferred update in the plan]
  // Note [Gradient reduction in the plan] (schedule/simulator.cc)
  if (u[3] > 0) out["grad_reduce_bus_bytes_per_s"] = u[2] / u[3];
  // Note [The step's end in the plan]: with the choice it was measured under.
  double least = -1;
  for (int p = 0; p < world.size(); ++p) {
    const double e = end_rates.data<double>()[p];
    if (e > 0 && (least < 0 || e < least)) least = e;
  }
  if (least > 0) out["step_end_per_weight"] = least;
  out["defer_optimizer"] = trainer.measured_node_times().defer_optimizer;
  std::ofstream f(path);
  f << out.dump(2) << "\n";
  TANDEM_CHECK(f.good(), "--node-times-out ", path, ": cannot write the file");
}

// Every rank's pipeline routing table of the last step (collective over each pipeline group),
// written by rank 0 in schedule/routing_file.h's format.
void write_routing(const std::string& path, runtime::PipelineTrainer& trainer,
                   comm::Communicator& world) {
  const schedule::RoutingCounts mine = trainer.pipeline_routing_counts();
  const std::vector<std::string> all =
      world.all_gather_bytes(schedule::routing_file_text({mine}));
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

IterationRecord gather_record(const runtime::StepResult& r, runtime::PipelineTrainer& trainer,
                              comm::Communicator& world) {
  IterationRecord rec = to_record(r);
  rec.comm_seconds = trainer.comm_busy_seconds();
  rec.exposed_comm_seconds = trainer.comm_exposed_seconds();
  Tensor comm_mine = Tensor::empty({3}, DType::kF64, MemCategory::kOther, "comm");
  comm_mine.data<double>()[0] = rec.comm_seconds;
  comm_mine.data<double>()[1] = rec.exposed_comm_seconds;
  comm_mine.data<double>()[2] = trainer.comm_exposed_waiting_seconds();
  Tensor comm_all =
      Tensor::empty({3 * world.size()}, DType::kF64, MemCategory::kOther, "comm.all");
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
  expert_rows_spread(rec, trainer);
  Tensor mine = Tensor::empty({3}, DType::kI64, MemCategory::kOther, "mem");
  mine.data<int64_t>()[0] = r.memory.total_in_use;
  mine.data<int64_t>()[1] = r.memory.total_peak;
  mine.data<int64_t>()[2] = r.activation_peak;
  Tensor all = Tensor::empty({3 * world.size()}, DType::kI64, MemCategory::kOther, "mem.all");
  world.all_gather(all, mine);
  rec.mem_in_use_bytes.clear();
  rec.mem_peak_bytes.clear();
  rec.activation_peak_bytes.clear();
  for (int p = 0; p < world.size(); ++p) {
    rec.mem_in_use_bytes.push_back(all.data<int64_t>()[3 * p]);
    rec.mem_peak_bytes.push_back(all.data<int64_t>()[3 * p + 1]);
    rec.activation_peak_bytes.push_back(all.data<int64_t>()[3 * p + 2]);
  }
  return rec;
}

}  // namespace

void run_train_distributed(RunOptions& o) {
  auto world = comm::mpi_world(o.comm_timeout_s);
  check_same_config(*world, o);
  const ParallelConfig& p = o.parallel;
  runtime::Groups groups = runtime::Groups::make(
      std::move(world), static_cast<int>(p.pipeline_model_parallel_size),
      static_cast<int>(p.expert_model_parallel_size), o.train.device,
      /*second_expert_group=*/o.comm_overlap == "split", o.comm_timeout_s);
  const comm::ParallelLayout& L = groups.layout;
  o.train.validate(L.dp());
  const schedule::ScheduleShape shape{
      static_cast<int32_t>(L.pp), static_cast<int32_t>(p.virtual_pipeline_model_parallel_size),
      static_cast<int32_t>(o.train.num_microbatches(L.dp())), p.pair_first_forwards};
  const schedule::Schedule sched =
      schedule::generate_schedule(schedule::parse_schedule_kind(p.schedule), shape);
  schedule::validate_schedule(sched);
  std::unique_ptr<data::Dataset> data = make_dataset(o);
  TANDEM_CHECK(o.node_times_out.empty() || o.train.device != Device::kCPU,
               "--node-times-out ", o.node_times_out,
               ": node times are measured with CUDA events; use --device cuda");
  runtime::PipelineTrainer trainer(
      o.model, o.train, sched, groups, *data, DType::kF32,
      o.comm_overlap == "off"     ? runtime::CommOverlap::kOff
      : o.comm_overlap == "split" ? runtime::CommOverlap::kSplit
                                  : runtime::CommOverlap::kOn);
  Allocator& alloc = allocator_for(o.train.device);
  TANDEM_CHECK(o.routing_out.empty() || o.model.is_moe(), "--routing-out ", o.routing_out,
               ": routing needs experts (--num-experts > 0)");
  const Fault fault = test_fault();
  install_nan_fault(fault, trainer);
  const bool lead = groups.rank == 0;
  const int64_t start = resume_pipeline_from_checkpoint(trainer, o, std::cout);
  ReporterConfig rc = reporter_config(o);
  std::string unplanned;
  const std::optional<schedule::Plan> plan = plan_of_run(o, p.schedule, shape, L.dp(), unplanned);
  std::vector<int32_t> pipeline_rank;  // of each world rank
  for (int w = 0; w < L.world; ++w) pipeline_rank.push_back(L.pp_rank(w));
  if (!lead) {
    rc.verbosity = Verbosity::kQuiet;
    rc.log_json_path.clear();
  }
  ProgressReporter reporter(rc);
  if (lead && !o.quiet) {
    std::cout << "tandem train: " << L.world << " ranks (pipeline " << L.pp << ", data "
              << L.dp() << ", expert " << L.ep << "), schedule " << sched.name << ", "
              << shape.num_microbatches << " micro-batches per data-parallel rank, data: "
              << data->describe()
              << (o.train.defer_optimizer
                      ? "; each step's update runs in the next step's first forward "
                        "(--defer-optimizer)"
                      : "")
              << (trainer.grad_reduce_overlapped()
                      ? "; gradients all-reduced layer by layer beside the backward "
                        "(--overlap-grad-reduce)"
                      : "")
              << std::endl;
    std::cout << "tandem train: "
              << (plan ? planned_memory_line(*plan) : "memory not planned: " + unplanned)
              << std::endl;
  }
  if (plan) {
    warn_if_planned_memory_exceeds_gpu(*plan, L.pp_rank(groups.rank), o.train.device,
                                       "tandem train: rank " + std::to_string(groups.rank) + ": ");
  }
  reporter.open();
  for (int64_t it = start; it < o.train.train_iters; ++it) {
    maybe_inject_fault(fault, groups.rank, it + 1);
    const bool trace_this = !o.trace_path.empty() && it + 1 == o.train.train_iters;
    if (trace_this) alloc.set_trace(true);
    const runtime::StepResult r = trainer.step();
    if (trace_this) write_measured_trace(o.trace_path, trainer, *groups.world, alloc);
    if (!o.node_times_out.empty() && it + 1 == o.train.train_iters) {
      write_node_times(o.node_times_out, trainer, *groups.world, o.train.recompute_experts);
    }
    if (!o.routing_out.empty() && it + 1 == o.train.train_iters) {
      write_routing(o.routing_out, trainer, *groups.world);
    }
    IterationRecord rec = gather_record(r, trainer, *groups.world);
    if (const auto& moved = trainer.last_rebalance()) {
      rec.note = rebalance_note(*moved, o.model.num_layers);
    }
    if (o.train.device != Device::kCPU) {
      rec.forward_backward_seconds = trainer.measured_forward_backward_seconds();
    }
    if (plan) set_planned_peaks(rec, *plan, pipeline_rank);
    reporter.report(rec);
    if (should_save(o, r.iteration)) save_pipeline_checkpoint(trainer, o);
  }
  reporter.print_summary();
  if (lead && !o.save_dir.empty() && !o.quiet) {
    std::cout << "saved checkpoints to " << o.save_dir << " (latest: "
              << runtime::iteration_dir_name(trainer.iteration()) << ")" << std::endl;
  }
}

}  // namespace tandem::cli
