// `tandem train`: one loop for every layout, a process alone included, so every option means the
// same with and without mpirun. It checks the options, makes this rank's groups over the world
// (MPI's under mpirun, else a world of this process alone), generates and validates the
// schedule, builds the data set and the trainer (runtime::PipelineTrainer, whose step() is the
// one training step), restores --load, runs the steps with progress output, and writes
// checkpoints (gathered to rank 0; docs/checkpoints.md) and the files asked for.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/planned_run.h"
#include "cli/progress.h"
#include "cli/train_checkpoint.h"
#include "cli/train_common.h"
#include "cli/train_outputs.h"
#include "comm/mpi_communicator.h"
#include "comm/self_communicator.h"
#include "core/device.h"
#if TANDEM_WITH_CUDA
#include "core/cuda/context.h"
#include "core/cuda/wait.h"
#endif
#include "ops/ops.h"
#include "runtime/checkpoint.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/generators.h"
#include "schedule/pipeline_model.h"
#include "schedule/validator.h"

namespace tandem::cli {
namespace {

// Opens the GPU for --device cuda (one GPU per process: under mpirun, the rank's local index).
void open_device(const RunOptions& o) {
  if (o.train.device == Device::kCPU) return;
#if TANDEM_WITH_CUDA
  const int gpus = cuda::device_count();
  TANDEM_CHECK(gpus > 0, "--device cuda: no GPU is visible on this machine (valid here: "
               "--device cpu)");
  const int local = comm::launched_by_mpirun() ? comm::local_rank() : 0;
  TANDEM_CHECK(local < gpus, "--device cuda: local rank ", local, " needs GPU ", local,
               " but this machine has ", gpus, "; start at most ", gpus, " ranks per machine");
  cuda::initialize(local);
  // Note [Bounded waits on the GPU]: under mpirun a wait for the GPU may wait for a peer.
  if (comm::launched_by_mpirun()) cuda::set_wait_limit(o.comm_timeout_s);
  (void)ops::Lanes::count();  // a bad TANDEM_EXPERT_LANES stops the run here, not mid-step
#else
  TANDEM_CHECK(false, "--device ", o.device,
               " is not available in this build: valid is cpu (built without CUDA)");
#endif
}

std::string device_text(Device device) {
  if (device == Device::kCPU) return "the CPU";
#if TANDEM_WITH_CUDA
  return cuda::device_description();
#else
  return "a GPU";
#endif
}

void check_supported(const RunOptions& o) {
  const ParallelConfig& p = o.parallel;
  TANDEM_CHECK(comm::launched_by_mpirun() ||
                   (p.pipeline_model_parallel_size == 1 && p.expert_model_parallel_size == 1),
               "--pipeline-model-parallel-size ", p.pipeline_model_parallel_size,
               " and --expert-model-parallel-size ", p.expert_model_parallel_size,
               " need one process per rank: start tandem with mpirun -np N (N a multiple of ",
               p.pipeline_model_parallel_size * p.expert_model_parallel_size, ")");
  TANDEM_CHECK(o.node_times_out.empty() || o.train.device != Device::kCPU, "--node-times-out ",
               o.node_times_out,
               ": node times are measured with CUDA events, with or without mpirun; use "
               "--device cuda");
  TANDEM_CHECK(o.routing_out.empty() || o.model.is_moe(), "--routing-out ", o.routing_out,
               ": routing needs experts (--num-experts > 0)");
}

// The world: MPI's under mpirun, else this process alone (no MPI needed).
std::unique_ptr<comm::Communicator> make_world(const RunOptions& o) {
  if (comm::launched_by_mpirun()) return comm::mpi_world(o.comm_timeout_s);
  return comm::self_world();
}

runtime::CommOverlap comm_overlap(const RunOptions& o) {
  if (o.comm_overlap == "off") return runtime::CommOverlap::kOff;
  return o.comm_overlap == "split" ? runtime::CommOverlap::kSplit : runtime::CommOverlap::kOn;
}

// Reads the first step's micro-batches, so that a bad token id stops the run before any output
// file is created (later batches are checked as they are read).
void check_first_step_data(const data::Dataset& data, const RunOptions& o, int64_t iteration) {
  for (int64_t mb = 0; mb < o.train.num_microbatches(); ++mb) {
    runtime::load_micro_batch(data, o.model, o.train, iteration, mb);
  }
}

// The run in one line on rank 0: the model, the data, the batch, the device, the layout and the
// schedule, and the choices that move work within the step.
void print_run(const RunOptions& o, const runtime::Groups& groups, const data::Dataset& data,
               const schedule::Schedule& sched, bool grad_reduce_overlapped) {
  const ModelConfig& m = o.model;
  const comm::ParallelLayout& L = groups.layout;
  const int64_t params =
      schedule::stage_params(m, 0, static_cast<int32_t>(m.num_layers), true, true, 1);
  std::cout << "tandem train: " << params << " parameters, " << m.num_layers << " layers, "
            << (m.is_moe() ? std::to_string(m.num_experts) + " experts top-" +
                                 std::to_string(m.moe_router_topk)
                           : std::string("dense"))
            << ", data: " << data.describe() << ", " << o.train.num_microbatches()
            << " micro-batches of " << o.train.micro_batch_size << " x " << m.seq_length
            << " tokens per step, on " << device_text(o.train.device);
  if (L.world > 1) {
    std::cout << "; " << L.world << " ranks (pipeline " << L.pp << ", data " << L.dp()
              << ", expert " << L.ep << "), " << sched.num_microbatches
              << " micro-batches per data-parallel rank";
  }
  std::cout << "; schedule " << sched.name
            << (o.train.defer_optimizer ? "; each step's update runs in the next step's first "
                                          "forward (--defer-optimizer)"
                                        : "")
            << (grad_reduce_overlapped ? "; gradients all-reduced layer by layer beside the "
                                         "backward (--overlap-grad-reduce)"
                                       : "")
            << std::endl;
}

// The steps from `start` to --train-iters: progress, checkpoints and, after the last, the files
// asked for.
void run_steps(const RunOptions& o, runtime::PipelineTrainer& trainer, const TestFaults& faults,
               int64_t start, const std::optional<schedule::Plan>& plan,
               ProgressReporter& reporter) {
  const runtime::Groups& groups = trainer.groups();
  std::vector<int32_t> pipeline_rank;  // of each world rank
  for (int w = 0; w < groups.layout.world; ++w) pipeline_rank.push_back(groups.layout.pp_rank(w));
  Allocator& alloc = allocator_for(o.train.device);
  reporter.open();
  for (int64_t it = start; it < o.train.train_iters; ++it) {
    faults.before_step(groups.rank, it + 1);
    const bool last = it + 1 == o.train.train_iters;
    if (last && !o.trace_path.empty()) alloc.set_trace(true);  // the last step's timeline
    const runtime::StepResult r = trainer.step();
    if (last) write_last_step_files(o, trainer, alloc);
    IterationRecord rec = gather_record(o, r, trainer);
    if (plan) set_planned_peaks(rec, *plan, pipeline_rank);
    reporter.report(rec);
    if (should_save(o, r.iteration)) save_pipeline_checkpoint(trainer, o);
  }
  reporter.print_summary();
}

void run_train(const CLI::App& app, RunOptions& o) {
  finalize_run_options(app, o, checkpoint_option_values);
  check_supported(o);
  open_device(o);
  std::unique_ptr<comm::Communicator> world = make_world(o);
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
  runtime::PipelineTrainer trainer(o.model, o.train, sched, groups, *data, DType::kF32,
                                   comm_overlap(o));
  const TestFaults faults;
  faults.install(trainer);
  const int64_t start = resume_pipeline_from_checkpoint(trainer, o, std::cout);
  check_first_step_data(*data, o, start);
  std::string unplanned;
  const std::optional<schedule::Plan> plan = plan_of_run(o, p.schedule, shape, L.dp(), unplanned);
  const bool lead = groups.rank == 0;
  ReporterConfig rc = reporter_config(o);
  if (!lead) {
    rc.verbosity = Verbosity::kQuiet;
    rc.log_json_path.clear();
  }
  ProgressReporter reporter(rc);
  if (lead && !o.quiet) {
    print_run(o, groups, *data, sched, trainer.grad_reduce_overlapped());
    std::cout << "tandem train: "
              << (plan ? planned_memory_line(*plan) : "memory not planned: " + unplanned)
              << std::endl;
  }
  if (plan) {
    const std::string prefix =
        L.world > 1 ? "tandem train: rank " + std::to_string(groups.rank) + ": " : "tandem train: ";
    warn_if_planned_memory_exceeds_gpu(*plan, L.pp_rank(groups.rank), o.train.device, prefix);
  }
  run_steps(o, trainer, faults, start, plan, reporter);
  if (lead && !o.save_dir.empty() && !o.quiet) {
    std::cout << "saved checkpoints to " << o.save_dir << " (latest: "
              << runtime::iteration_dir_name(trainer.iteration()) << ")" << std::endl;
  }
}

}  // namespace

void register_train_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("train", "Train the model (the built-in addition task "
                                              "when no --data-path is given)");
  auto opts = std::make_shared<RunOptions>();
  add_run_options(*sub, *opts);
  sub->callback([sub, opts] { run_train(*sub, *opts); });
}

}  // namespace tandem::cli
