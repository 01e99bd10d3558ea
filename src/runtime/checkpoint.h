// Checkpoints: whole-model named tensors (Hugging Face names and layout) plus optimizer state and
// the training position, written crash-safely, read back with everything validated first.
//
// Note [Checkpoint layout]
//   <save>/iter_NNNNNNN/model.safetensors      weights, HF names (docs/model.md), F32, [out, in];
//                                              above max_shard_bytes, as transformers writes
//                                              them: model-0000k-of-0000n.safetensors shards and
//                                              model.safetensors.index.json
//                                              (Note [Sharded weights] in checkpoint.cc)
//                       config.json            HF config (docs/model.md "Families")
//                       optimizer.safetensors  "<weight name>.exp_avg", "<weight name>.exp_avg_sq"
//                                              (a fully parallel save writes shards and an index
//                                              as for the weights: optimizer-0000k-of-0000n...,
//                                              optimizer.safetensors.index.json)
//                       trainer_state.json     format + version, iteration, optimizer steps,
//                                              samples consumed, seed, the model and train
//                                              configs, the data (path, format, bytes), and the
//                                              size and CRC-32C of every file above
//   <save>/latest                              "iter_NNNNNNN\n": the newest complete checkpoint
// An iteration directory alone loads in `transformers` (from_pretrained). A directory with
// config.json and model.safetensors (or a sharded model.safetensors.index.json) but no
// trainer_state.json is a plain HF checkpoint: weights only (BF16 accepted), no optimizer state.
//
// Note [Checkpoint commit]
// save_checkpoint writes the iteration directory under a temporary sibling name, syncs every file
// and the directory and renames it into place (io::AtomicDirWriter), then replaces `latest` the
// same way (tmp file, fsync, rename, directory fsync), and only then deletes directories beyond
// `keep` (0: none are deleted). A directory is deleted by renaming it to `<name>.deleted-XXXXXX`
// first, so no partly deleted directory ever carries a checkpoint's name. A crash at any point
// leaves `latest` naming a complete checkpoint; the next save into the same root removes the
// leftovers. Retention keeps the directory just written and the `keep - 1` newest others, where
// newest is the highest iteration not above the one just written (directories numbered above it
// were left by an earlier run that got further, and count as older than all of these).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"
#include "io/atomic_dir.h"
#include "model/parameters.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/optimizer.h"

namespace tandem::runtime {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

inline constexpr int64_t kCheckpointFormatVersion = 1;
inline constexpr int64_t kDefaultKeepCheckpoints = 2;

enum class CheckpointKind : uint8_t {
  kTandem,       // written by save_checkpoint: weights, optimizer state, training position
  kHuggingFace,  // config.json + weights only
};

// A whole-model checkpoint in memory, independent of the parallel layout: a rank saves or
// restores the names it holds, so shards from several ranks can be gathered into one state.
struct CheckpointState {
  CheckpointKind kind = CheckpointKind::kTandem;
  std::string dir;  // the directory it was read from (messages); empty when built
  ModelConfig model_config;
  NamedTensors model;            // HF weight names
  NamedTensors optimizer;        // "<name>.exp_avg" / "<name>.exp_avg_sq"; empty for HF
  nlohmann::json trainer_state;  // Note [Checkpoint layout]; null for kHuggingFace
};

// What one rank wrote of a checkpoint and how long it took.
struct RankWrite {
  int rank = 0;
  int64_t files = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

// What save_checkpoint did.
struct SavedCheckpoint {
  std::string dir;                    // the iteration directory written
  std::vector<std::string> removed;   // older directories deleted by retention
  std::vector<std::string> warnings;  // a failed delete is reported here; the save stands
  std::vector<RankWrite> writes;      // the ranks that wrote tensor files (multi-rank saves)
  double seconds = 0;                 // the whole save, from the first rank's gather to `latest`
};

// The configs as trainer_state.json stores them: an object keyed by the structs' field names
// (which are the command-line options with '_' for '-'; the policy is "nan_policy").
nlohmann::json config_to_json(const ModelConfig& model);
nlohmann::json config_to_json(const TrainConfig& train);
// Back from JSON, every key required and type-checked; errors name `where` and the key.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where);
TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where);

// The training position a kTandem trainer_state.json records, validated.
struct TrainingPosition {
  int64_t iteration = 0;         // steps taken, skipped ones included: the lr schedule's position
  int64_t optimizer_steps = 0;   // AdamW updates applied (its bias correction), <= iteration
  int64_t samples_consumed = 0;  // iteration * global batch size: the data position
  ModelConfig model;
  TrainConfig train;
};
TrainingPosition read_training_position(const nlohmann::json& trainer_state,
                                        const std::string& where);

// Writes `state` as <root>/iter_NNNNNNN, points <root>/latest at it and keeps the newest `keep`
// iteration directories (0: all of them) (Notes [Checkpoint layout], [Checkpoint commit]).
// state.kind must be kTandem and state.trainer_state["iteration"] must equal `iteration`. Creates
// `root` if needed. Test hook: with TANDEM_TEST_SAVE_DELAY_MS=N in the environment, each stage
// prints "tandem-test: save iter_NNNNNNN stage S" to stderr and then sleeps N ms (S: model, config,
// optimizer, trainer_state, commit, latest, prune, done), so a test can kill the process there;
// with TANDEM_TEST_SAVE_DELAY_STAGE=S as well, it sleeps at that stage only.
// The largest model-weights file a checkpoint writes unless told otherwise (transformers'
// max_shard_size default, 5 GB).
constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

SavedCheckpoint save_checkpoint(const std::string& root, int64_t iteration,
                                const CheckpointState& state, int64_t keep,
                                int64_t max_shard_bytes = kDefaultMaxShardBytes);

// ---- One checkpoint written by several processes (Note [Fully parallel save] in
// checkpoint_parallel.cc); save_checkpoint is these pieces in one process ----

// A tensor file written into a checkpoint's staging directory.
struct WrittenFile {
  std::string file;                  // its name in the directory
  int64_t bytes = 0;                 // the file's size
  std::string crc32c;                // 8 hex digits
  int64_t tensor_bytes = 0;          // its tensors' data (an index's total_size)
  std::vector<std::string> tensors;  // the names it holds, in order
};

// How many files write_shards splits `tensors` into under max_shard_bytes (0 for none).
int64_t count_shards(const NamedTensors& tensors, int64_t max_shard_bytes);

// Writes `tensors` into `dir` as the shards first + 1 .. first + count_shards of `total`
// (Note [Sharded weights] in checkpoint.cc), named "<kind>-0000k-of-0000n.safetensors", or
// "<kind>.safetensors" when total is 1. `kind` is "model" or "optimizer".
std::vector<WrittenFile> write_shards(const std::string& dir, const std::string& kind,
                                      const NamedTensors& tensors, int64_t first, int64_t total,
                                      int64_t max_shard_bytes);

// Creates `root` if needed, removes what an interrupted save into it left
// (Note [Checkpoint commit]) and opens the staging directory of `iteration`'s directory.
std::unique_ptr<io::AtomicDirWriter> open_checkpoint(const std::string& root, int64_t iteration);

// Finishes a checkpoint whose tensor files are in `writer`'s staging directory: the indexes
// ("<kind>.safetensors.index.json", when a kind has several files), config.json and
// trainer_state.json (`trainer_state` with format, version and every file's size and CRC-32C),
// then commits the directory, points `latest` at it and keeps the newest `keep`.
SavedCheckpoint commit_checkpoint(io::AtomicDirWriter& writer, const std::string& root,
                                  int64_t iteration, const ModelConfig& model,
                                  const nlohmann::json& trainer_state,
                                  const std::vector<WrittenFile>& model_files,
                                  const std::vector<WrittenFile>& optimizer_files, int64_t keep);

// The cheap part of a checkpoint, read before a run is built (options come from it): its kind,
// the resolved directory, config.json and, for kTandem, trainer_state.json (validated).
struct CheckpointInfo {
  CheckpointKind kind = CheckpointKind::kTandem;
  std::string dir;
  ModelConfig model_config;      // for kTandem: seq_length is the one trained with
  nlohmann::json trainer_state;  // null for kHuggingFace
};
CheckpointInfo inspect_checkpoint(const std::string& dir);

// Resolves `dir` and reads the whole checkpoint, validating before returning: trainer_state.json
// (format, version, fields), every file's size and CRC-32C against it, config.json, every
// safetensors header, dtypes, and the optimizer tensors against the weights (names, shapes).
// Changes nothing on disk except to finish an interrupted directory swap (io::recover_atomic_dir)
// when the directory `latest` names is missing. Throws tandem::Error naming the file and what
// is wrong.
// mtp_layers: the run's --mtp-num-layers, the multi-token prediction modules a Hugging Face
// checkpoint's are kept to (Note [Multi-token prediction layers] in checkpoint.cc; more than it
// holds is refused), which a tandem checkpoint's must equal; -1: the checkpoint's own (a Hugging
// Face checkpoint's modules are then dropped).
CheckpointState load_checkpoint(const std::string& dir, int64_t mtp_layers = -1);

// ---- Glue to the parameters, the optimizer and the trainer (checkpoint_restore.cc) ----

// Views of the parameters by name (no copy), in the registry's order.
NamedTensors model_tensors(const model::Parameters& params);
// Views of Adam's moments, named "<weight name>.exp_avg" and "<weight name>.exp_avg_sq"; the
// optimizer must keep them whole (not sharded).
NamedTensors optimizer_tensors(const model::Parameters& params, const AdamW& optimizer);
// The same of two flat buffers laid out as the weights (a sharded optimizer's, made whole).
NamedTensors moment_tensors(const model::Parameters& params, const Tensor& exp_avg,
                            const Tensor& exp_avg_sq);

// Copies the weights `params` holds (any chunk: a range of layers or experts) from `state`.
// Checks first, changing nothing on failure: the model configs agree (for kHuggingFace except
// seq_length, which HF stores only as a limit), and every weight is present with its shape (for
// a whole model, nothing else is present).
void restore_model(model::Parameters& params, const CheckpointState& state);

// The training position as trainer_state.json records it (without format and files): iteration,
// optimizer steps, samples consumed, seed, the model and train configs and `data` (the run's
// description of its data set). One rank's and several ranks' saves both write this.
nlohmann::json training_position_json(int64_t iteration, int64_t optimizer_steps,
                                      const ModelConfig& model, const TrainConfig& train,
                                      const nlohmann::json& data);

// One chunk of the model on this rank (a range of layers and experts) and its optimizer.
struct ChunkRef {
  model::Parameters* params;
  AdamW* optimizer;
};

// Restores every chunk of a rank from a whole-model `state`: weights, Adam moments (each
// optimizer's own ranges of them: AdamW::owned) and step count
// from a kTandem state (after checking the seed and global batch size of `run`, which fix the data
// position); from a kHuggingFace state the weights only, with zeroed moments and 0 steps. Checks
// every chunk (configs, names, shapes) before copying anything, so a rejected checkpoint leaves
// them all unchanged. Returns the iteration to continue from (0 for kHuggingFace).
// What of a kTandem checkpoint a restore takes (Megatron-LM's --finetune and --no-load-optim):
// everything; the weights and the iteration, the optimizer afresh (zeroed moments, 0 steps, so
// the learning-rate schedule restarts too); or the weights alone, as from a Hugging Face one.
enum class RestoreParts : uint8_t { kAll, kNoOptimizer, kWeightsOnly };
int64_t restore_chunks(const std::vector<ChunkRef>& chunks, const TrainConfig& run,
                       const CheckpointState& state, RestoreParts parts = RestoreParts::kAll);

// ---- Model only (tandem generate) ----

// Writes params (a whole model) as model.safetensors (or shards, Note [Sharded weights] in
// checkpoint.cc) + config.json into `dir` atomically.
void save_model_checkpoint(const std::string& dir, const model::Parameters& params,
                           int64_t max_shard_bytes = kDefaultMaxShardBytes);
// The weights of the checkpoint `dir` designates (resolve_checkpoint_dir) as a new whole-model
// Parameters (f32).
std::unique_ptr<model::Parameters> load_model_checkpoint(const std::string& dir);

}  // namespace tandem::runtime
