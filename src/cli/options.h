// The run options shared by `tandem train`, `plan` and `generate`: Megatron-LM's names on the
// command line, the same keys in a TOML file given with --config; the command line wins.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "core/config.h"

namespace tandem::cli {

// How a NaN or Inf in the loss or gradients is handled.
enum class NonFinitePolicy : uint8_t { kStop, kSkip };

struct RunOptions {
  ModelConfig model;
  TrainConfig train;
  ParallelConfig parallel;
  int64_t num_microbatches = 0;  // for `plan`: 0 derives it from the batch sizes
  std::string config_file;       // --config FILE.toml
  std::string data_path;         // --data-path; empty: the built-in addition task
  std::string data_format = "auto";  // auto | megatron | tokens | text
  std::string save_dir;          // --save
  int64_t save_interval = 0;     // --save-interval (0: only at the end when --save is set)
  std::string load_dir;          // --load
  std::string log_json;          // --log-json FILE: one JSON object per iteration
  std::string trace_path;        // --trace FILE.json: the measured timeline
  std::string device = "cpu";    // --device cpu | cuda
  bool quiet = false;            // --quiet: no progress bar, no log lines
};

// Registers every run option on `app`, bound into `opts`, with MODEL.md's demo defaults.
void add_run_options(CLI::App& app, RunOptions& opts);

// After app.parse(): fills in what the --config file sets and the command line did not, then
// validates the whole configuration. Throws tandem::Error naming the bad key or value (and the
// file and line for the config file) and what would be valid.
void finalize_run_options(const CLI::App& app, RunOptions& opts);

}  // namespace tandem::cli
