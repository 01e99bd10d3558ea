// `tandem train`: validates the options, builds the data set and the trainer, runs the steps with
// progress output, and saves the model when asked.
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "data/addition.h"
#include "data/file_dataset.h"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"

namespace tandem::cli {
namespace {

std::unique_ptr<data::Dataset> make_dataset(const RunOptions& o) {
  if (o.data_path.empty()) return std::make_unique<data::AdditionDataset>(o.train.seed);
  return data::open_dataset(o.data_path, o.data_format, o.model.vocab_size, o.train.seed,
                            o.model.seq_length + 1);
}

void check_supported(const RunOptions& o) {
  TANDEM_CHECK(o.device == "cpu", "--device ", o.device,
               " is not available in this build: valid is cpu (the CUDA backend is not built)");
  const ParallelConfig& p = o.parallel;
  TANDEM_CHECK(p.pipeline_model_parallel_size == 1 && p.expert_model_parallel_size == 1 &&
                   p.virtual_pipeline_model_parallel_size == 1,
               "--pipeline-model-parallel-size ", p.pipeline_model_parallel_size,
               ", --expert-model-parallel-size ", p.expert_model_parallel_size,
               " and --virtual-pipeline-model-parallel-size ",
               p.virtual_pipeline_model_parallel_size,
               ": this build trains on one rank only, so each must be 1 (use `tandem plan` to "
               "plan a parallel layout)");
}

IterationRecord to_record(const runtime::StepResult& r) {
  IterationRecord rec;
  rec.iter = r.iteration;
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

void run_train(const CLI::App& app, RunOptions& o) {
  finalize_run_options(app, o);
  check_supported(o);
  std::unique_ptr<data::Dataset> data = make_dataset(o);
  runtime::Trainer trainer(o.model, o.train, *data);
  ReporterConfig rc;
  rc.total_iters = o.train.train_iters;
  rc.log_interval = o.train.log_interval;
  rc.log_json_path = o.log_json;
  rc.verbosity = o.quiet ? Verbosity::kQuiet : Verbosity::kNormal;
  ProgressReporter reporter(rc);
  if (!o.quiet) {
    std::cout << "tandem train: " << trainer.params().numel() << " parameters, "
              << o.model.num_layers << " layers, "
              << (o.model.is_moe() ? std::to_string(o.model.num_experts) + " experts top-" +
                                         std::to_string(o.model.moe_router_topk)
                                   : std::string("dense"))
              << ", data: " << data->describe() << ", "
              << o.train.num_microbatches() << " micro-batches of " << o.train.micro_batch_size
              << " x " << o.model.seq_length << " tokens per step" << std::endl;
  }
  reporter.open();
  for (int64_t it = 0; it < o.train.train_iters; ++it) {
    const runtime::StepResult r = trainer.step();
    reporter.report(to_record(r));
    const bool last = r.iteration == o.train.train_iters;
    if (!o.save_dir.empty() &&
        (last || (o.save_interval > 0 && r.iteration % o.save_interval == 0))) {
      runtime::save_model_checkpoint(o.save_dir, trainer.params());
    }
  }
  reporter.finish();
  if (!o.save_dir.empty() && !o.quiet) std::cout << "saved model to " << o.save_dir << std::endl;
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
