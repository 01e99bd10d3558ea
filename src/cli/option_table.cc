// The data and output settings of a run, one row each (Note [Every setting declared once] in
// core/settings.h), and all of a run's tables in --help's order.
#include "cli/option_table.h"

#include "core/setting_tables.h"
#include "data/file_dataset.h"

namespace tandem::cli {
Settings data_settings(RunOptions& o) {
  return in_group(
      SettingGroup::kData,
      {
          {.name = "data-path",
           .ref = &o.data_path,
           .help = "training data, as Megatron's --data-path: a token or text file or a Megatron "
                   ".bin/.idx prefix (A); weight and prefix pairs (0.3 A 0.7 B), a blend drawing "
                   "those shares of the samples from each; or prefixes alone (A B), weighted by "
                   "their sizes. --split cuts each into its parts (default: none, the built-in "
                   "addition task)",
           .metavar = "[W] PATH ..."},
          {.name = "data-format",
           .ref = &o.data_format,
           .help = "format of --data-path",
           .choices = enum_name_list<data::DatasetFormat>()},
          {.name = "mock-data",
           .ref = &o.mock_data,
           .help = "train on uniformly random tokens in [0, --vocab-size) instead of a data set, "
                   "as Megatron's --mock-data and torch_peer.py do (for benchmarks: random "
                   "tokens spread over all experts, the addition task's few bytes do not)"},
          {.name = "addition-max-digits",
           .ref = &o.addition_max_digits,
           .help = "operand digits of the built-in addition task (used without --data-path)",
           .bound = FieldBound::kPositive},
          {.name = "split",
           .ref = &o.split,
           .help = "weights of --data-path's training, validation and test parts, as Megatron's "
                   "--split (commas or slashes; quotes and spaces are ignored): 969,30,1 trains "
                   "on the first 96.9% of each file's documents (a Megatron index's; else of its "
                   "tokens), validates on the next 3% and tests on the rest after training "
                   "(default: none, all trains)",
           .metavar = "T,V,S"},
          {.name = "train-data-path",
           .ref = &o.train_data_path,
           .help = "training data of its own, in --data-path's forms, instead of --data-path and "
                   "--split (Megatron's; default: none)",
           .metavar = "[W] PATH ..."},
          {.name = "valid-data-path",
           .ref = &o.valid_data_path,
           .help = "validation data of its own, in --data-path's forms, with --train-data-path "
                   "(default: none; then --split's part, or the built-in task's held-out "
                   "problems)",
           .metavar = "[W] PATH ..."},
          {.name = "test-data-path",
           .ref = &o.test_data_path,
           .help = "test data of its own, in --data-path's forms, with --train-data-path: "
                   "evaluated after training for --eval-iters batches (default: none)",
           .metavar = "[W] PATH ..."},
          {.name = "eval-iters",
           .ref = &o.eval_iters,
           .help = "batches of --global-batch-size samples each validation (and the test after "
                   "training) runs forward, reporting their mean LM loss and its exp (valid "
                   "loss, valid ppl); 0: no validation",
           .bound = FieldBound::kNonNegative,
           .metavar = "N"},
          {.name = "eval-interval",
           .ref = &o.eval_interval,
           .help = "steps between validations (with --eval-iters > 0); the last step's too",
           .bound = FieldBound::kPositive,
           .metavar = "N"},
      });
}

Settings output_settings(RunOptions& o) {
  const Scope process = Scope::kProcess;
  return in_group(
      SettingGroup::kOutput,
      {
          {.name = "config",
           .ref = &o.config_file,
           .help = "TOML file with these options as keys (`num-layers = 4`); the command line "
                   "wins (default: none)",
           .metavar = "FILE",
           .scope = process,
           .in_file = InFile::kForbidden},
          {.name = "save",
           .ref = &o.save_dir,
           .help = "directory to save checkpoints to (default: none, no saving)",
           .metavar = "DIR"},
          {.name = "save-interval",
           .ref = &o.save_interval,
           .help = "steps between checkpoints; 0 saves only at the end when --save is set",
           .bound = FieldBound::kNonNegative},
          {.name = "load",
           .ref = &o.load_dir,
           .help = "checkpoint to start from: a --save directory (its latest), one "
                   "iter_NNNNNNN directory, or a Hugging Face checkpoint directory (weights "
                   "only); model options not given are taken from it (default: none)",
           .metavar = "DIR"},
          {.name = "finetune",
           .ref = &o.finetune,
           .help = "Megatron-LM's: take only the weights of --load; the run starts at iteration 0 "
                   "with a fresh optimizer and learning-rate schedule, and the checkpoint's "
                   "training settings are not taken"},
          {.name = "no-load-optim",
           .ref = &o.no_load_optim,
           .help = "Megatron-LM's: take the weights and the iteration of --load but not its "
                   "optimizer state: the Adam moments and the learning-rate schedule start afresh"},
          {.name = "no-load-rng",
           .ref = &o.no_load_rng,
           .help = "Megatron-LM's; accepted with no effect: tandem keeps no random state (its "
                   "random draws are functions of --seed and the iteration)"},
          {.name = "exit-interval",
           .ref = &o.exit_interval,
           .help = "Megatron-LM's: stop after the first iteration divisible by N, saving a "
                   "checkpoint first with --save; 0: run to --train-iters",
           .bound = FieldBound::kNonNegative,
           .metavar = "N"},
          {.name = "exit-duration-in-mins",
           .ref = &o.exit_duration_in_mins,
           .help = "Megatron-LM's: stop after the first iteration that ends past this many "
                   "minutes of the run on any rank, saving a checkpoint first with --save; 0: no "
                   "limit",
           .bound = FieldBound::kNonNegative,
           .metavar = "MINUTES"},
          {.name = "max-shard-size",
           .ref = &o.max_shard_size,
           .help = "the largest weights file a checkpoint writes: bigger models are saved as "
                   "model-0000k-of-0000n.safetensors shards and model.safetensors.index.json, "
                   "as transformers saves them (SIZE: 5GB, 500MB, 2GiB)",
           .metavar = "SIZE"},
          {.name = "ckpt-fully-parallel-save",
           .ref = &o.ckpt_fully_parallel_save,
           .help = "under mpirun, every rank writes the tensors it owns into its own shards of "
                   "the checkpoint (weights and optimizer state, with indexes) instead of "
                   "sending them to rank 0 to write; --save must be on a file system every rank "
                   "sees"},
          {.name = "keep-checkpoints",
           .ref = &o.keep_checkpoints,
           .help = "newest iteration directories kept under --save, older ones deleted after a "
                   "new one is complete; 0: every one is kept (Megatron-LM deletes none)",
           .bound = FieldBound::kNonNegative},
          {.name = "log-json",
           .ref = &o.log_json,
           .help = "write one JSON object per iteration to FILE (default: none)",
           .metavar = "FILE",
           .scope = process},
          {.name = "log-params-norm",
           .ref = &o.log_params_norm,
           .help = "Megatron-LM's: the L2 norm of all weights after each step's update, in the "
                   "log line, --log-json and TensorBoard (train/params_norm)"},
          {.name = "log-num-zeros-in-grad",
           .ref = &o.log_num_zeros_in_grad,
           .help = "Megatron-LM's: how many gradient elements of each step are zero, in the log "
                   "line, --log-json and TensorBoard (train/num_zeros_in_grad)"},
          {.name = "log-timers-to-tensorboard",
           .ref = &o.log_timers_to_tensorboard,
           .help = "Megatron-LM's: each step's seconds (and, measured on GPUs under mpirun, its "
                   "forward-backward's) to TensorBoard as timers/step_s, "
                   "timers/forward_backward_s"},
          {.name = "log-memory-to-tensorboard",
           .ref = &o.log_memory_to_tensorboard,
           .help = "Megatron-LM's; tandem writes memory/in_use_bytes and memory/peak_bytes to "
                   "TensorBoard with or without it"},
          {.name = "log-validation-ppl-to-tensorboard",
           .ref = &o.log_validation_ppl_to_tensorboard,
           .help = "Megatron-LM's; tandem writes valid/ppl beside valid/loss with or without it"},
          {.name = "log-throughput",
           .ref = &o.log_throughput,
           .help = "Megatron-LM's TFLOP/s per GPU: refused, tandem counts no FLOPs per step; the "
                   "log line's tok/s is its throughput"},
          {.name = "profile",
           .ref = &o.profile,
           .help = "Megatron-LM's, onto --trace: write the measured timeline of each step from "
                   "--profile-step-start to before --profile-step-end (counted as Megatron-LM "
                   "counts iterations, from 0) of the ranks of --profile-ranks, each step to "
                   "--trace's file name with .iterN before its extension (needs --trace)",
           .scope = process},
          {.name = "profile-step-start",
           .ref = &o.profile_step_start,
           .help = "--profile: the first step profiled",
           .bound = FieldBound::kNonNegative,
           .scope = process},
          {.name = "profile-step-end",
           .ref = &o.profile_step_end,
           .help = "--profile: the step profiling stops before",
           .bound = FieldBound::kNonNegative,
           .scope = process},
          {.name = "profile-ranks",
           .ref = &o.profile_ranks,
           .help = "--profile: the world ranks whose timelines the files hold, comma-separated",
           .metavar = "R,R,...",
           .scope = process},
          {.name = "trace",
           .ref = &o.trace_path,
           .help = "write the measured timeline as Chrome trace JSON to FILE (default: none)",
           .metavar = "FILE",
           .scope = process},
          {.name = "node-times-out",
           .ref = &o.node_times_out,
           .help = "write each node kind's measured time (GPU runs, CUDA events; its median over "
                   "the steps after the first, every rank's mean) as the JSON that `tandem plan "
                   "--node-times` reads (default: none)",
           .metavar = "FILE",
           .scope = process},
          {.name = "routing-out",
           .ref = &o.routing_out,
           .help = "MoE: write the rows each experts node received in the last step, for every "
                   "rank's pipeline, as the JSON that `tandem plan --routing` reads (default: "
                   "none)",
           .metavar = "FILE",
           .scope = process},
          {.name = "tensorboard-dir",
           .ref = &o.tensorboard_dir,
           .help = "write TensorBoard event files of every step's figures and validations into "
                   "DIR (made if missing; rank 0 writes) (default: none)",
           .metavar = "DIR"},
          {.name = "memory-available",
           .ref = &o.memory_available,
           .help = "the memory each rank may hold (e.g. 80GiB, 141e9): `tandem train` refuses, "
                   "before it allocates, a run whose planned peak is above it (`tandem plan` "
                   "compares with --memory-limit)",
           .metavar = "SIZE",
           .default_text = "what the device has: the GPU's free memory; on the CPU the "
                           "machine's available memory shared by its ranks, within the "
                           "process's limits"},
          {.name = "quiet",
           .ref = &o.quiet,
           .help = "no progress bar and no log lines",
           .scope = process},
      });
}

Settings run_settings(RunOptions& o) {
  Settings all = model_settings(o.model);
  for (Settings part : {train_settings(o.train), parallel_settings(o.parallel, o.train),
                        data_settings(o), output_settings(o), tuning_settings(o.tuning)}) {
    all.insert(all.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  return all;
}

}  // namespace tandem::cli
