// The run options shared by `tandem train`, `eval` and `plan`: Megatron-LM's names on the command
// line, the same keys in a TOML file given with --config; the command line wins. Each is a row of
// one table (Note [Every setting declared once] in core/settings.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cli/cli_fwd.h"
#include "core/config.h"
#include "core/enum_names.h"
#include "core/settings.h"
#include "core/tuning.h"
#include "schedule/generators.h"

namespace tandem::cli {

// Note [String options of an enumeration]: --nan-policy, --device and --comm-overlap are stored
// as their enums (train.non_finite_policy, train.device, parallel.comm_overlap). --schedule and
// --data-format stay strings whose valid values are their enum's table
// (schedule::kScheduleKindNames, data::kDatasetFormatNames): ParallelConfig lives in core, below
// the schedule's enum, and the data set is opened by its format's name; code that branches on
// them parses the name (schedule_kind below), never compares it to a literal.
struct RunOptions {
  ModelConfig model;
  TrainConfig train;
  ParallelConfig parallel;
  Tuning tuning;            // Note [Performance settings] in core/tuning.h
  std::string config_file;  // --config FILE.toml
  // --data-path: one prefix, or a blend (data/blend.h); empty: the built-in addition task
  StringList data_path;
  std::string data_format = "auto";  // auto | megatron | tokens | text
  std::string split;                 // --split "969,30,1"; empty: all of --data-path trains
  // --train-data-path, --valid-data-path, --test-data-path: each part's data of its own, in
  // --data-path's forms, instead of --data-path and --split (Note [Validation data]).
  StringList train_data_path, valid_data_path, test_data_path;
  int64_t eval_interval = 1000;  // --eval-interval: steps between validations
  int64_t eval_iters = 0;        // --eval-iters: batches per validation; 0: none
  std::string tensorboard_dir;   // --tensorboard-dir: event files for TensorBoard (rank 0)
  bool mock_data = false;        // --mock-data: uniformly random tokens (benchmarks)
  std::string save_dir;          // --save
  int64_t save_interval = 0;     // --save-interval (0: only at the end when --save is set)
  std::string load_dir;          // --load
  // --ckpt-fully-parallel-save: under mpirun every rank writes its own tensors' shards
  bool ckpt_fully_parallel_save = false;
  int64_t keep_checkpoints = 0;  // --keep-checkpoints: iteration directories kept; 0: all
  // --finetune: --load's weights only, from iteration 0 with a fresh optimizer (Megatron-LM's)
  bool finetune = false;
  bool no_load_optim = false;  // --no-load-optim: --load's weights and iteration, fresh optimizer
  bool no_load_rng = false;    // --no-load-rng: no effect (tandem keeps no RNG state)
  int64_t exit_interval = 0;   // --exit-interval N: stop after an iteration divisible by N
  double exit_duration_in_mins = 0;  // --exit-duration-in-mins: stop after this long
  // Megatron-LM's logging switches (docs/training.md "Megatron-LM's logging and profiling
  // options").
  bool log_params_norm = false;        // the weights' norm in the log line and TensorBoard
  bool log_num_zeros_in_grad = false;  // the gradients' zero elements, likewise
  bool log_timers_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;          // written whatever it says
  bool log_validation_ppl_to_tensorboard = false;  // written whatever it says
  bool log_throughput = false;                     // refused: no FLOP count per step
  // --profile (Megatron-LM's): the measured timeline (--trace) of the steps
  // [profile_step_start, profile_step_end) of the ranks in profile_ranks.
  bool profile = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::string profile_ranks = "0";
  std::string max_shard_size = "5GB";  // --max-shard-size (parsed into max_shard_bytes)
  int64_t max_shard_bytes = 5'000'000'000;
  std::string log_json;             // --log-json FILE: one JSON object per iteration
  std::string trace_path;           // --trace FILE.json: the measured timeline
  std::string node_times_out;       // --node-times-out FILE.json: measured node times (GPU)
  std::string routing_out;          // --routing-out FILE.json: the last step's routing tables
  bool quiet = false;               // --quiet: no progress bar, no log lines
  int64_t addition_max_digits = 3;  // --addition-max-digits: the built-in task's operand digits
  // --memory-available SIZE: what a rank may hold, for the pre-flight check (cli/preflight.h);
  // empty: what the device has.
  std::string memory_available;
  // Megatron-LM's rule for `train`: a --load directory that does not exist yet, or is empty,
  // holds no checkpoint, and the run starts fresh (its scripts --load and --save one directory).
  // Set by the command before finalize_run_options; that directory is then in started_fresh and
  // load_dir is empty.
  bool load_may_start_fresh = false;
  std::string started_fresh;
  // Megatron-LM's options without a setting of their own, as given (cli/megatron_options.h).
  std::map<std::string, std::string> megatron;
};

// An option whose value is one of `names`, handed to `store` once parsed; any other value is a
// parse error naming the valid ones (exit 2, Note [Exit codes] in options.cc).
CLI::Option* add_named_option(CLI::App& app, const std::string& flag, const std::string& help,
                              const std::vector<std::string>& names,
                              std::function<void(const std::string&)> store);

// An option parsed straight into `target` by the names of `names` (E's table or a part of it;
// Note [One name table per enumeration] in core/enum_names.h).
template <class E>
CLI::Option* add_enum_option(
    CLI::App& app, const std::string& flag, E& target, const std::string& help,
    std::type_identity_t<std::span<const EnumName<E>>> names = enum_names(E{})) {
  std::vector<std::string> list;
  for (const EnumName<E>& n : names) list.emplace_back(n.name);
  return add_named_option(app, flag, help, list, [&target, names](const std::string& s) {
    for (const EnumName<E>& n : names)
      if (s == n.name) target = n.value;
  });
}

// The run's schedule (a name of the table: finalize_run_options has checked it).
schedule::ScheduleKind schedule_kind(const ParallelConfig& p);

// Registers each setting of `table` on `app` as --name, in --help's section of its kind, with its
// default; a repeated option takes its last value (Note [Repeated options] in options.cc).
void add_settings(CLI::App& app, const Settings& table);
// add_settings of every run setting (cli/option_table.h's run_settings), bound into `opts`, with
// its default (the model's: docs/model.md "Hyper-parameters").
void add_run_options(CLI::App& app, RunOptions& opts);

// After app.parse(): fills in what the --config file sets and the command line did not, then
// validates the whole configuration. Throws tandem::Error naming the bad key or value (and the
// file and line for the config file) and what would be valid.
//
// Note [Options from a checkpoint]: with --load, `read_checkpoint(load_dir)` returns what the
// checkpoint says about the run as {"fixed": {...}, "defaults": {...}}, each mapping option names
// to values (e.g. {"fixed": {"num-layers": 4, "seed": 1234}, "defaults": {"lr": 0.003}}). An
// option that neither the command line nor the config file gives takes the checkpoint's value;
// a given one wins over a "defaults" value, and must equal a "fixed" one (otherwise an error
// names the option and both values). (`tandem train` passes cli::checkpoint_option_values.)
// `own`: the command's settings beside the run's (`plan`'s), read from the command line and the
// config file the same way.
using CheckpointOptionsReader = std::function<nlohmann::json(const std::string& load_dir)>;
void finalize_run_options(const CLI::App& app, RunOptions& opts,
                          const CheckpointOptionsReader& read_checkpoint = {}, Settings own = {});

// The checks across settings, in one place: the model's and training's own (validate), the
// layout's rules (validate_layout in core/config.h), the data options' and the performance
// settings'. Throws tandem::Error naming the options and values.
void validate_run_options(const RunOptions& o);

// Note [Deferred update by default] (options.cc): --defer-optimizer's value when no option or
// file sets it, for these options' device, model, expert-parallel size, schedule and overlap.
bool defer_optimizer_by_default(const RunOptions& o);

// Every option's value as "name=value" lines, in the table's order, but for the settings of
// Scope::kProcess (--log-json, --trace, --quiet, ...): what every rank of a run must agree on
// (cli/train_common.cc's check).
std::string canonical_options(const RunOptions& opts);

// CLI11 checks for a subcommand's own numeric options, by the run options' rules: a float must be
// finite (CLI11's PositiveNumber and NonNegativeNumber let nan and inf through) and within
// `bound`; an integer is plain decimal, within its type and `bound`. The message names the value
// and what is valid.
CLI::Validator finite_number(FieldBound bound);
CLI::Validator decimal_number(FieldBound bound, bool is_unsigned);

// The model options of `model` as {"num-layers": 4, ...}, keyed by the option names of --help.
nlohmann::json model_option_values(const ModelConfig& model);

}  // namespace tandem::cli
