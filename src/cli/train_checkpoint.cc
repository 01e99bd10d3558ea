// --load / --save for `tandem train` over runtime/checkpoint_parallel.h.
#include "cli/train_checkpoint.h"

#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "core/setting_tables.h"
#include "data/blend.h"
#include "data/file_dataset.h"
#include "data/mapped_file.h"
#include "io/hf_config.h"
#include "runtime/checkpoint.h"
#include "runtime/checkpoint_parallel.h"

namespace tandem::cli {
namespace {

// Size of the data file, or of a Megatron prefix's .bin and .idx together; -1 when unreadable.
int64_t data_bytes(const std::string& path) {
  const int64_t size = data::regular_file_size(path);
  if (size >= 0) return size;
  const int64_t bin = data::regular_file_size(path + ".bin");
  const int64_t idx = data::regular_file_size(path + ".idx");
  return bin >= 0 && idx >= 0 ? bin + idx : -1;
}

// A note when the checkpoint was trained on other data than this run reads: the run continues
// by sample index, which then selects other samples than an uninterrupted run would have.
void warn_if_data_differs(const nlohmann::json& recorded, const nlohmann::json& now,
                          std::ostream& log) {
  if (!recorded.is_object()) return;
  for (const char* key : {"format", "bytes", "addition_max_digits"}) {
    if (recorded.value(key, nlohmann::json()) != now.value(key, nlohmann::json())) {
      log << "tandem train: note: the checkpoint was trained on " << recorded.dump()
          << " but this run reads " << now.dump()
          << "; training continues by sample index, so it is not an exact resume" << std::endl;
      return;
    }
  }
}

}  // namespace

nlohmann::json checkpoint_option_values(const std::string& load_dir, bool weights_only) {
  const runtime::CheckpointInfo info = runtime::inspect_checkpoint(load_dir);
  nlohmann::json fixed = model_option_values(info.model_config);
  // What config.json does not carry is a training setting like the learning rate: the command
  // line may set it; otherwise a Hugging Face checkpoint gives what its reader says (DeepSeek-V3:
  // no aux loss) and a run resumed from tandem's keeps its own.
  nlohmann::json unwritten = nlohmann::json::object();
  for (std::string key : io::hf_config_unwritten_fields(info.model_config)) {
    for (char& c : key) c = c == '_' ? '-' : c;
    unwritten[key] = fixed[key];
    fixed.erase(key);
  }
  if (info.kind == runtime::CheckpointKind::kHuggingFace || weights_only) {
    fixed.erase("seq-length");
    return {{"fixed", fixed}, {"defaults", unwritten}};
  }
  // The training settings a checkpoint keeps (their Saved column, core/setting_tables.cc): the
  // optimizer and schedule settings, so that `--load DIR --train-iters N` alone continues the run
  // exactly; the length of the run and the log interval stay the command line's.
  runtime::TrainingPosition pos =
      runtime::read_training_position(info.trainer_state, "checkpoint " + info.dir + ": ");
  nlohmann::json defaults = nlohmann::json::object();
  for (const Setting& s : train_settings(pos.train)) {
    if (s.saved == Saved::kFixed) fixed[s.name] = setting_to_json(s);
    if (s.saved == Saved::kDefault) defaults[s.name] = setting_to_json(s);
  }
  for (const auto& [key, value] : unwritten.items()) defaults[key] = value;
  return {{"fixed", fixed}, {"defaults", defaults}};
}

nlohmann::json describe_data(const RunOptions& o) {
  if (o.mock_data) return {{"format", "mock"}, {"vocab_size", o.model.vocab_size}};
  const StringList& words = o.data_path.empty() ? o.train_data_path : o.data_path;
  if (words.empty()) {
    return {{"format", "addition"}, {"addition_max_digits", o.addition_max_digits}};
  }
  // One file as it always was; a blend by its words and its files' bytes together.
  int64_t bytes = 0;
  for (const std::string& path : data::parse_blend("--data-path", words).paths) {
    const int64_t b = data_bytes(path);
    bytes = b < 0 || bytes < 0 ? -1 : bytes + b;
  }
  return {{"path", value_text(words)}, {"format", o.data_format}, {"bytes", bytes}};
}

namespace {

// --load read and validated; a checkpoint already at or past --train-iters is an error.
runtime::CheckpointState load_for_resume(const RunOptions& o) {
  runtime::CheckpointState st = runtime::load_checkpoint(o.load_dir, o.model.mtp_num_layers);
  if (st.kind == runtime::CheckpointKind::kTandem && !o.finetune) {
    const runtime::TrainingPosition pos =
        runtime::read_training_position(st.trainer_state, "checkpoint " + st.dir + ": ");
    TANDEM_CHECK(pos.iteration < o.train.train_iters, "--load ", st.dir, " is at iteration ",
                 pos.iteration, " but --train-iters is ", o.train.train_iters,
                 ": nothing is left to train; raise --train-iters above ", pos.iteration);
  }
  return st;
}

// What was loaded, on `log`; a note on stderr when the data set differs.
void report_resume(const runtime::CheckpointState& st, int64_t iteration, int64_t optimizer_steps,
                   const RunOptions& o, std::ostream& log) {
  if (st.kind == runtime::CheckpointKind::kTandem && o.finetune) {
    if (!o.quiet) {
      log << "tandem train: loaded the weights of " << st.dir
          << " (--finetune): training starts at iteration 0 with a fresh optimizer" << std::endl;
    }
    return;
  }
  if (st.kind == runtime::CheckpointKind::kHuggingFace) {
    if (!o.quiet) {
      log << "tandem train: loaded the weights of the Hugging Face checkpoint " << st.dir
          << "; it holds no optimizer state or training position, so training starts at "
             "iteration 0 with fresh optimizer state"
          << std::endl;
    }
    return;
  }
  if (!o.quiet) {
    log << "tandem train: resumed from " << st.dir << " at iteration " << iteration
        << (o.no_load_optim ? " with a fresh optimizer and learning-rate schedule (--no-load-optim)"
                            : " (" + std::to_string(optimizer_steps) + " optimizer steps)")
        << std::endl;
  }
  warn_if_data_differs(st.trainer_state.value("data", nlohmann::json()), describe_data(o),
                       std::cerr);
}

// What a save wrote: the whole save's bytes and seconds, then each writing rank's.
void print_save_times(const runtime::SavedCheckpoint& saved, std::ostream& log) {
  int64_t bytes = 0;
  for (const runtime::RankWrite& w : saved.writes) bytes += w.bytes;
  char line[256];
  std::snprintf(line, sizeof line, "tandem train: saved %s: %.3f GB in %.2f s (%.3f GB/s)\n",
                saved.dir.c_str(), static_cast<double>(bytes) / 1e9, saved.seconds,
                saved.seconds > 0 ? static_cast<double>(bytes) / 1e9 / saved.seconds : 0.0);
  log << line;
  for (const runtime::RankWrite& w : saved.writes) {
    std::snprintf(line, sizeof line,
                  "tandem train:   rank %d wrote %lld files, %.3f GB in %.2f s (%.3f GB/s)\n",
                  w.rank, static_cast<long long>(w.files), static_cast<double>(w.bytes) / 1e9,
                  w.seconds, w.seconds > 0 ? static_cast<double>(w.bytes) / 1e9 / w.seconds : 0.0);
    log << line;
  }
  log << std::flush;
}

}  // namespace

int64_t resume_pipeline_from_checkpoint(runtime::PipelineTrainer& trainer, const RunOptions& o,
                                        std::ostream& log) {
  if (o.load_dir.empty()) return 0;
  runtime::CheckpointState st;
  runtime::run_agreeing(*trainer.groups().world, [&] {
    st = load_for_resume(o);
    runtime::restore_pipeline(trainer, st,
                              o.finetune        ? runtime::RestoreParts::kWeightsOnly
                              : o.no_load_optim ? runtime::RestoreParts::kNoOptimizer
                                                : runtime::RestoreParts::kAll);
  });
  if (trainer.groups().rank == 0) {
    report_resume(st, trainer.iteration(), trainer.stages().front().optimizer->steps(), o, log);
  }
  return trainer.iteration();
}

bool should_save(const RunOptions& o, int64_t iteration) {
  if (o.save_dir.empty()) return false;
  return iteration == o.train.train_iters ||
         (o.save_interval > 0 && iteration % o.save_interval == 0);
}

void save_pipeline_checkpoint(runtime::PipelineTrainer& trainer, const RunOptions& o) {
  // Heartbeats well inside --comm-timeout (Note [Saving on rank 0]).
  const auto save = o.ckpt_fully_parallel_save ? runtime::save_checkpoint_fully_parallel
                                               : runtime::save_checkpoint_parallel;
  const runtime::SavedCheckpoint saved =
      save(o.save_dir, trainer, describe_data(o), o.keep_checkpoints, o.parallel.comm_timeout_s / 4,
           o.max_shard_bytes);
  for (const std::string& warning : saved.warnings) {
    std::cerr << "tandem: warning: " << warning << std::endl;
  }
  if (trainer.groups().rank == 0 && !o.quiet) print_save_times(saved, std::cout);
}

}  // namespace tandem::cli
