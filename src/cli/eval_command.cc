// `tandem eval`: the loss and perplexity of a saved model on held-out data
// (Note [Validation data] in cli/validation.h), through the trainer's forward-only pass on any
// layout (runtime::PipelineTrainer::evaluate, Note [Forward-only evaluation]): the same batches
// and the same arithmetic as `tandem train --eval-iters`, so it reports the loss the run
// reported at the step that was saved. It takes `tandem train`'s options; those the checkpoint
// fixes come from it.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/preflight.h"
#include "cli/train_checkpoint.h"
#include "cli/train_common.h"
#include "cli/train_outputs.h"
#include "cli/validation.h"
#include "core/atomic_file.h"
#include "io/tensorboard.h"
#include "runtime/checkpoint.h"
#include "runtime/checkpoint_parallel.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::cli {
namespace {

// Megatron's default number of validation batches, `tandem eval`'s default too (a training run
// validates only when asked).
constexpr int64_t kDefaultEvalIters = 100;

// Note [Options from a checkpoint], for `tandem eval`: `tandem train`'s, and, for a model trained
// on the built-in task, its operand digits as a default (the held-out problems it was trained
// beside).
nlohmann::json eval_checkpoint_values(const std::string& load_dir) {
  nlohmann::json values = checkpoint_option_values(load_dir);
  const runtime::CheckpointInfo info = runtime::inspect_checkpoint(load_dir);
  if (info.kind != runtime::CheckpointKind::kTandem) return values;
  const nlohmann::json data = info.trainer_state.value("data", nlohmann::json());
  if (data.is_object() && data.value("format", "") == "addition" &&
      data.contains("addition_max_digits")) {
    values["defaults"]["addition-max-digits"] = data["addition_max_digits"];
  }
  return values;
}

// Note [What eval writes]: its result lines on stdout; with --log-json one JSON object of them
// (`iter` the checkpoint's iteration, `valid_loss`, `valid_ppl`, as a training run's validation
// logs them, and the batches and tokens); with --tensorboard-dir the scalars valid/loss and
// valid/ppl at that iteration, beside the training run's. The options of `tandem train` that
// write what only training makes (checkpoints, a step's timeline, node times, routing tables)
// are refused, named, before anything runs.
void check_eval_outputs(const RunOptions& o) {
  const std::pair<const char*, const std::string*> training_only[] = {
      {"--save", &o.save_dir},
      {"--trace", &o.trace_path},
      {"--node-times-out", &o.node_times_out},
      {"--routing-out", &o.routing_out}};
  for (const auto& [flag, value] : training_only) {
    TANDEM_CHECK(value->empty(), flag, " ", *value,
                 ": tandem eval trains nothing, so it writes no checkpoint, timeline, node times "
                 "or routing; it writes its results to stdout, --log-json FILE and "
                 "--tensorboard-dir DIR: leave ",
                 flag, " out");
  }
  check_tensorboard_dir(o.tensorboard_dir);
}

// The results into --log-json and --tensorboard-dir (Note [What eval writes]).
void write_result_files(const RunOptions& o, int64_t iteration, const runtime::EvalResult& r) {
  if (!o.log_json.empty()) {
    const nlohmann::json j = {{"iter", iteration},
                              {"valid_loss", r.lm_loss},
                              {"valid_ppl", std::exp(r.lm_loss)},
                              {"valid_aux_loss", r.aux_loss},
                              {"batches", r.batches},
                              {"tokens", r.tokens}};
    write_file_atomic(o.log_json, j.dump() + "\n");
  }
  if (!o.tensorboard_dir.empty()) {
    io::TensorBoardWriter tb(o.tensorboard_dir);
    tb.add_scalar("valid/loss", r.lm_loss, iteration);
    tb.add_scalar("valid/ppl", std::exp(r.lm_loss), iteration);
    tb.flush();
  }
}

void print_result(const RunOptions& o, const runtime::PipelineTrainer& trainer,
                  const data::Dataset& valid, const runtime::EvalResult& r) {
  if (!o.quiet) {
    std::cout << "tandem eval: the model of " << o.load_dir << " at iteration "
              << trainer.iteration() << ", on " << valid.describe() << ": " << r.batches
              << " batches of " << o.train.global_batch_size << " samples x " << o.model.seq_length
              << " tokens" << std::endl;
  }
  char text[96];
  std::snprintf(text, sizeof text, "valid loss: %.17g\nvalid ppl: %.6g\n", r.lm_loss,
                std::exp(r.lm_loss));
  std::cout << text << std::flush;
}

void run_eval(const CLI::App& app, RunOptions& o) {
  finalize_run_options(app, o, eval_checkpoint_values);
  TANDEM_CHECK(!o.load_dir.empty(),
               "tandem eval needs --load DIR, the model to evaluate: a --save directory, one "
               "iter_NNNNNNN directory or a Hugging Face checkpoint directory");
  TANDEM_CHECK(o.eval_iters > 0, "--eval-iters 0 evaluates nothing: give N >= 1 batches");
  check_supported(o);
  check_eval_outputs(o);
  (void)memory_available_option(o, "eval");
  check_validation_options(o, WholeDataPath::kEvaluated);
  open_device(o);
  std::unique_ptr<comm::Communicator> world = make_world(o);
  check_same_config(*world, o);
  const RunLayout run = make_layout(std::move(world), o);
  const std::unique_ptr<data::Dataset> valid =
      make_validation_dataset(o, WholeDataPath::kEvaluated);
  runtime::PipelineTrainer trainer(o.model, o.train, run.sched, *run.groups, *valid, DType::kF32,
                                   o.parallel.comm_overlap);
  runtime::run_agreeing(*run.groups->world, [&] {
    runtime::restore_pipeline(trainer,
                              runtime::load_checkpoint(o.load_dir, o.model.mtp_num_layers));
  });
  check_first_validation_batch(*valid, o);
  const runtime::EvalResult r = trainer.evaluate(*valid, o.eval_iters);
  if (run.groups->rank == 0) {
    print_result(o, trainer, *valid, r);
    write_result_files(o, trainer.iteration(), r);
  }
}

}  // namespace

void register_eval_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "eval",
      "Print a saved model's loss and perplexity on held-out data: --valid-data-path, "
      "the validation part of --data-path under --split, all of --data-path, or the "
      "built-in task's held-out problems");
  auto opts = std::make_shared<RunOptions>();
  opts->eval_iters = kDefaultEvalIters;
  add_run_options(*sub, *opts);
  sub->callback([sub, opts] { run_eval(*sub, *opts); });
}

}  // namespace tandem::cli
