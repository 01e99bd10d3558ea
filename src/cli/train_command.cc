// `tandem train`: one loop for every layout, a process alone included, so every option means the
// same with and without mpirun. It checks the options, makes this rank's groups over the world
// (MPI's under mpirun, else a world of this process alone), generates and validates the
// schedule, builds the data sets and the trainer (runtime::PipelineTrainer, whose step() is the
// one training step), restores --load, runs the steps with progress output and validations
// (cli/validation.h), and writes checkpoints (gathered to rank 0; docs/checkpoints.md) and the
// files asked for.
#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/megatron_options.h"
#include "cli/options.h"
#include "cli/planned_run.h"
#include "cli/preflight.h"
#include "cli/progress.h"
#include "cli/train_checkpoint.h"
#include "cli/train_common.h"
#include "cli/train_outputs.h"
#include "cli/validation.h"
#include "core/device.h"
#include "planner/pipeline_model.h"
#include "runtime/checkpoint.h"
#include "runtime/checkpoint_parallel.h"
#include "runtime/pipeline_trainer.h"
#include "runtime/step_figures.h"
#include "schedule/generators.h"

namespace tandem::cli {
namespace {

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
    std::cout << "; " << L.world << " ranks ("
              << (L.tp > 1 ? "tensor " + std::to_string(L.tp) + ", " : "") << "pipeline " << L.pp
              << ", data " << L.dp() << ", expert " << L.ep << "), " << sched.num_microbatches
              << " micro-batches per data-parallel rank";
  }
  std::cout << "; schedule " << sched.name
            << (o.train.defer_optimizer ? "; each step's update runs in the next step's first "
                                          "forward (--defer-optimizer)"
                                        : "")
            << (!grad_reduce_overlapped ? ""
                : o.train.use_distributed_optimizer
                    ? "; gradients reduce-scattered layer by layer beside the backward "
                      "(--overlap-grad-reduce)"
                    : "; gradients all-reduced layer by layer beside the backward "
                      "(--overlap-grad-reduce)");
  if (o.train.use_distributed_optimizer) {  // Note [Distributed optimizer]
    std::cout << "; Adam moments split over the ranks that hold each weight "
                 "(--use-distributed-optimizer), weights gathered "
              << (o.train.overlap_param_gather ? "beside the next forward (--overlap-param-gather)"
                                               : "after the update");
  }
  std::cout << std::endl;
}

// With --eval-iters: where and how often the run validates, on rank 0.
void print_validation(const RunOptions& o, const data::Dataset& valid) {
  std::cout << "tandem train: validation on " << valid.describe() << ": " << o.eval_iters
            << " batches of " << o.train.global_batch_size << " samples every " << o.eval_interval
            << " steps and after the last" << std::endl;
}

// Whether the run stops after the step that ended at `iteration` (Megatron-LM's
// --exit-interval, --exit-duration-in-mins): every rank takes the same decision, the duration's
// from the slowest rank's clock.
bool should_exit(const RunOptions& o, comm::Communicator& world, int64_t iteration,
                 std::chrono::steady_clock::time_point run_start) {
  if (o.exit_interval > 0 && iteration % o.exit_interval == 0) return true;
  if (o.exit_duration_in_mins <= 0) return false;
  const double minutes =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count() / 60.0;
  Tensor past = Tensor::empty({1}, DType::kF64, MemCategory::kOther, "exit.past");
  past.data<double>()[0] = minutes > o.exit_duration_in_mins ? 1.0 : 0.0;
  world.all_reduce_sum(past);
  return past.data<double>()[0] > 0;
}

// The steps from `start` to --train-iters (or an earlier exit): progress, validations (with
// `valid`), checkpoints and, after the last, the files asked for and the test (with `test`).
void run_steps(const RunOptions& o, runtime::PipelineTrainer& trainer, int64_t start,
               const std::optional<schedule::Plan>& plan, ProgressReporter& reporter,
               const data::Dataset* valid, const data::Dataset* test,
               std::chrono::steady_clock::time_point run_start) {
  const runtime::Groups& groups = trainer.groups();
  std::vector<int32_t> pipeline_rank;  // of each world rank
  for (int w = 0; w < groups.layout.world; ++w) pipeline_rank.push_back(groups.layout.pp_rank(w));
  Allocator& alloc = allocator_for(o.train.device);
  reporter.open();
  for (int64_t it = start; it < o.train.train_iters; ++it) {
    test_faults_before_step(groups.rank, it + 1);
    const bool last = it + 1 == o.train.train_iters;
    const bool profiled = profiles_step(o, it + 1);
    // The last step's timeline, or with --profile the profiled steps'.
    if ((last && !o.trace_path.empty()) || profiled) alloc.set_trace(true);
    const runtime::StepResult r = trainer.step();
    if (profiled) write_profiled_step(o, trainer, alloc, r.iteration);
    if (last) write_last_step_files(o, trainer, alloc);
    IterationRecord rec = gather_record(o, r, trainer);
    if (o.log_params_norm) rec.params_norm = runtime::params_norm(trainer);
    if (o.log_num_zeros_in_grad) rec.num_zeros_in_grad = runtime::grad_zeros(trainer);
    if (plan) set_planned_peaks(rec, *plan, pipeline_rank);
    // After the record's figures are gathered: the validation's forwards are no part of them.
    if (valid && should_validate(o, r.iteration)) {
      rec.valid_loss = validate(trainer, *valid, o).lm_loss;
    }
    reporter.report(rec);
    const bool saved = should_save(o, r.iteration);
    if (saved) save_pipeline_checkpoint(trainer, o);
    if (!last && should_exit(o, *groups.world, r.iteration, run_start)) {
      if (!saved && !o.save_dir.empty()) save_pipeline_checkpoint(trainer, o);
      if (groups.rank == 0 && !o.quiet) {
        std::cout << "tandem train: stopped after iteration " << r.iteration << " ("
                  << (o.exit_interval > 0 && r.iteration % o.exit_interval == 0
                          ? "--exit-interval"
                          : "--exit-duration-in-mins")
                  << ")" << std::endl;
      }
      break;
    }
  }
  if (test) reporter.report_test(trainer.iteration(), validate(trainer, *test, o).lm_loss);
  reporter.print_summary();
}

void run_train(const CLI::App& app, RunOptions& o) {
  const auto run_start = std::chrono::steady_clock::now();
  o.load_may_start_fresh = true;
  // --finetune reads the checkpoint for its weights and model alone.
  finalize_run_options(
      app, o, [&o](const std::string& dir) { return checkpoint_option_values(dir, o.finetune); });
  check_supported(o);
  check_validation_options(o, WholeDataPath::kRefused);
  check_tensorboard_dir(o.tensorboard_dir);
  (void)memory_available_option(o);  // a bad size stops the run before anything runs
  open_device(o);
  std::unique_ptr<comm::Communicator> world = make_world(o);
  check_same_config(*world, o);
  const RunLayout run = make_layout(std::move(world), o);
  runtime::Groups& groups = *run.groups;
  const comm::ParallelLayout& L = groups.layout;
  std::string unplanned;
  const std::optional<schedule::Plan> plan =
      plan_of_run(o, o.parallel.schedule, run.shape, L.dp(), unplanned);
  if (plan) {  // Note [Pre-flight memory check], before anything of the run is allocated
    runtime::run_agreeing(*groups.world, [&] {
      check_planned_memory_fits(o, run_request(o, o.parallel.schedule, run.shape, L.dp()), *plan,
                                L.pp_rank(groups.rank), L.world);
    });
  }
  std::unique_ptr<data::Dataset> data = make_dataset(o);
  std::unique_ptr<data::Dataset> valid =
      o.eval_iters > 0 ? make_validation_dataset(o, WholeDataPath::kRefused) : nullptr;
  std::unique_ptr<data::Dataset> test = o.eval_iters > 0 ? make_test_dataset(o) : nullptr;
  runtime::PipelineTrainer trainer(o.model, o.train, run.sched, groups, *data, DType::kF32,
                                   o.parallel.comm_overlap);
  install_test_faults(trainer);
  const int64_t start = resume_pipeline_from_checkpoint(trainer, o, std::cout);
  check_first_step_data(*data, o, start);
  if (valid) check_first_validation_batch(*valid, o);
  if (test) check_first_validation_batch(*test, o);
  const bool lead = groups.rank == 0;
  ReporterConfig rc = reporter_config(o);
  if (!lead) {  // rank 0 reports for every rank
    rc.verbosity = Verbosity::kQuiet;
    rc.log_json_path.clear();
    rc.tensorboard_dir.clear();
  }
  ProgressReporter reporter(rc);
  if (lead && !o.quiet) {
    print_run(o, groups, *data, run.sched, trainer.grad_reduce_overlapped());
    std::cout << "tandem train: "
              << (plan ? planned_memory_line(*plan) : "memory not planned: " + unplanned)
              << std::endl;
    if (valid) print_validation(o, *valid);
    if (!o.started_fresh.empty()) {
      std::cout << "tandem train: --load " << o.started_fresh
                << " holds no checkpoint yet: the run starts from the initialisation"
                << (o.save_dir.empty() ? "" : ", and --save writes to " + o.save_dir) << std::endl;
    }
    for (const std::string& note :
         {megatron_model_note(o.megatron), megatron_recompute_note(o.megatron)}) {
      if (!note.empty()) std::cout << "tandem train: " << note << std::endl;
    }
    if (test) {
      std::cout << "tandem train: test on " << test->describe() << ": " << o.eval_iters
                << " batches after the last step" << std::endl;
    }
  }
  run_steps(o, trainer, start, plan, reporter, valid.get(), test.get(), run_start);
  if (lead && !o.save_dir.empty() && !o.quiet) {
    std::cout << "saved checkpoints to " << o.save_dir
              << " (latest: " << runtime::iteration_dir_name(trainer.iteration()) << ")"
              << std::endl;
  }
}

}  // namespace

void register_train_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("train",
                                     "Train the model (the built-in addition task "
                                     "when no --data-path is given)");
  sub->footer(
      "Environment: TANDEM_TOKENIZE names the tandem-tokenize program that reads a sentencepiece "
      "--tokenizer-model's vocabulary (default: the one beside tandem, else on PATH); "
      "OPENBLAS_NUM_THREADS and OPENBLAS_CORETYPE are OpenBLAS's own (without the latter tandem "
      "picks the kernels for this CPU where OpenBLAS's detection falls back to generic ones); "
      "mpirun's OMPI_COMM_WORLD_* (or PMI's) make each process one rank, and its local rank "
      "picks the process's GPU.");
  auto opts = std::make_shared<RunOptions>();
  add_run_options(*sub, *opts);
  sub->callback([sub, opts] { run_train(*sub, *opts); });
}

}  // namespace tandem::cli
