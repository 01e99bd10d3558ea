// `tandem train`: validates the options, builds the data set and the trainer, runs the steps with
// progress output, and saves the model when asked.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/planned_run.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "cli/train_checkpoint.h"
#include "comm/mpi_communicator.h"
#include "core/device.h"
#if TANDEM_WITH_CUDA
#include "core/cuda/context.h"
#include "core/cuda/wait.h"
#endif
#include "data/addition.h"
#include "data/file_dataset.h"
#include "data/mock.h"
#include "ops/ops.h"
#include "runtime/checkpoint.h"
#include "runtime/reference_trainer.h"
#include "train_common.h"

namespace tandem::cli {

std::unique_ptr<data::Dataset> make_dataset(const RunOptions& o) {
  if (o.mock_data) return std::make_unique<data::MockDataset>(o.train.seed, o.model.vocab_size);
  if (o.data_path.empty()) {
    TANDEM_CHECK(o.addition_max_digits <= data::kAdditionMaxDigitsLimit, "--addition-max-digits ",
                 o.addition_max_digits, " is invalid: it must be between 1 and ",
                 data::kAdditionMaxDigitsLimit);
    return std::make_unique<data::AdditionDataset>(o.train.seed,
                                                   static_cast<int>(o.addition_max_digits));
  }
  return data::open_dataset(o.data_path, o.data_format, o.model.vocab_size, o.train.seed,
                            o.model.seq_length + 1);
}

ReporterConfig reporter_config(const RunOptions& o) {
  ReporterConfig rc;
  rc.total_iters = o.train.train_iters;
  rc.log_interval = o.train.log_interval;
  rc.log_json_path = o.log_json;
  rc.verbosity = o.quiet ? Verbosity::kQuiet : Verbosity::kNormal;
  return rc;
}

IterationRecord to_record(const runtime::StepResult& r) {
  IterationRecord rec;
  rec.iter = r.iteration;
  rec.status =
      r.status == runtime::StepStatus::kSkipped ? UpdateStatus::kSkipped : UpdateStatus::kApplied;
  rec.loss = r.loss;
  rec.lm_loss = r.lm_loss;
  rec.aux_loss = r.aux_loss;
  rec.lr = r.lr;
  rec.grad_norm = r.grad_norm;
  rec.step_seconds = r.seconds;
  rec.tokens_per_s = r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0;
  rec.mem_in_use_bytes = {r.memory.total_in_use};
  rec.mem_peak_bytes = {r.memory.total_peak};
  rec.activation_peak_bytes = {r.activation_peak};
  return rec;
}

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

void check_supported(const RunOptions& o) {
  const ParallelConfig& p = o.parallel;
  TANDEM_CHECK(comm::launched_by_mpirun() ||
                   (p.pipeline_model_parallel_size == 1 && p.expert_model_parallel_size == 1),
               "--pipeline-model-parallel-size ", p.pipeline_model_parallel_size,
               " and --expert-model-parallel-size ", p.expert_model_parallel_size,
               " need one process per rank: start tandem with mpirun -np N (N a multiple of ",
               p.pipeline_model_parallel_size * p.expert_model_parallel_size, ")");
}

// Reads the first step's micro-batches, so that a bad token id stops the run before any output
// file is created (later batches are checked as they are read).
void check_first_step_data(const data::Dataset& data, const RunOptions& o, int64_t iteration) {
  for (int64_t mb = 0; mb < o.train.num_microbatches(); ++mb) {
    runtime::load_micro_batch(data, o.model, o.train, iteration, mb);
  }
}

void run_train(const CLI::App& app, RunOptions& o) {
  finalize_run_options(app, o, checkpoint_option_values);
  check_supported(o);
  open_device(o);
  if (comm::launched_by_mpirun()) {
    run_train_distributed(o);
    return;
  }
  TANDEM_CHECK(o.node_times_out.empty(), "--node-times-out ", o.node_times_out,
               ": node times are measured by the pipeline trainer: start tandem under mpirun "
               "(mpirun -np 1 for one GPU) with --device cuda");
  TANDEM_CHECK(o.routing_out.empty(), "--routing-out ", o.routing_out,
               ": routing tables come from the pipeline trainer: start tandem under mpirun "
               "(mpirun -np 1 for one rank)");
  TANDEM_CHECK(!o.train.defer_optimizer,
               "--defer-optimizer moves each step's update into the next step's first forward "
               "in the pipeline trainer: start tandem under mpirun (mpirun -np 1 for one rank), "
               "or leave it out");
  std::unique_ptr<data::Dataset> data = make_dataset(o);
  runtime::ReferenceTrainer trainer(o.model, o.train, *data);
  install_test_fault_hooks(trainer);
  const int64_t start = resume_from_checkpoint(trainer, o, std::cout);
  check_first_step_data(*data, o, start);
  // One process runs each micro-batch's forward, then its backward: 1f1b on one stage.
  std::string unplanned;
  const std::optional<schedule::Plan> plan = plan_of_run(
      o, "1f1b", {1, 1, static_cast<int32_t>(o.train.num_microbatches()), false}, 1, unplanned);
  ProgressReporter reporter(reporter_config(o));
  if (!o.quiet) {
    std::cout << "tandem train: " << trainer.params().numel() << " parameters, "
              << o.model.num_layers << " layers, "
              << (o.model.is_moe() ? std::to_string(o.model.num_experts) + " experts top-" +
                                         std::to_string(o.model.moe_router_topk)
                                   : std::string("dense"))
              << ", data: " << data->describe() << ", "
              << o.train.num_microbatches() << " micro-batches of " << o.train.micro_batch_size
              << " x " << o.model.seq_length << " tokens per step, on "
              << (o.train.device == Device::kCPU ? std::string("the CPU")
#if TANDEM_WITH_CUDA
                                                 : cuda::device_description())
#else
                                                 : std::string("a GPU"))
#endif
              << std::endl;
    std::cout << "tandem train: "
              << (plan ? planned_memory_line(*plan) : "memory not planned: " + unplanned)
              << std::endl;
  }
  if (plan) warn_if_planned_memory_exceeds_gpu(*plan, 0, o.train.device, "tandem train: ");
  reporter.open();
  for (int64_t it = start; it < o.train.train_iters; ++it) {
    const bool trace_this = !o.trace_path.empty() && it + 1 == o.train.train_iters;
    Allocator& alloc = allocator_for(o.train.device);
    if (trace_this) alloc.set_trace(true);
    const runtime::StepResult r = trainer.step();
    if (trace_this) {  // the measured timeline of the last step
      runtime::write_trace_file(
          o.trace_path, {runtime::rank_trace_events(0, trainer.timeline(), alloc.trace(),
                                                    trainer.step_start_seconds())});
      alloc.set_trace(false);
    }
    IterationRecord rec = to_record(r);
    if (plan) set_planned_peaks(rec, *plan, {0});
    reporter.report(rec);
    if (should_save(o, r.iteration)) save_training_checkpoint(trainer, o);
  }
  reporter.print_summary();
  if (!o.save_dir.empty() && !o.quiet) {
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
