// Checkpoints on disk (Notes [Checkpoint layout], [Checkpoint commit] in checkpoint.h): the
// trainer_state.json schema, saving, and loading with every file validated before any tensor is
// handed out. The directory layout (names, `latest`, retention) is checkpoint_dir.cc's.
#include "runtime/checkpoint.h"

#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/setting_tables.h"
#include "core/test_faults.h"
#include "io/atomic_dir.h"
#include "io/checksum.h"
#include "io/hf_config.h"
#include "io/json_fields.h"
#include "io/safetensors.h"
#include "runtime/checkpoint_dir.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using io::JsonFields;
using Json = nlohmann::json;

constexpr const char* kFormatName = "tandem";
constexpr int64_t kMaxJsonBytes = int64_t{64} << 20;

// Test hook of save_checkpoint (Note [Test faults]): announce the stage, then wait.
void save_stage(const std::string& name, const char* stage) {
  const TestFaults f = test_faults();
  if (f.save_delay_ms < 0) return;
  std::fprintf(stderr, "tandem-test: save %s stage %s\n", name.c_str(), stage);
  std::fflush(stderr);
  if (!f.save_delay_stage.empty() && f.save_delay_stage != stage) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(f.save_delay_ms));
}

Json read_json_file(const std::string& path) {
  const std::string text = io::read_file(path, kMaxJsonBytes);
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK(!j.is_discarded() && j.is_object(), "checkpoint file '", path,
               "' is not a JSON object (it is truncated or corrupt)");
  return j;
}

// {"bytes": N, "crc32c": "xxxxxxxx"} of a file, as trainer_state.json records it.
Json file_record(const std::string& path) {
  std::error_code ec;
  const auto bytes = static_cast<int64_t>(fs::file_size(path, ec));
  TANDEM_CHECK(!ec, "cannot stat '", path, "': ", ec.message());
  return {{"bytes", bytes}, {"crc32c", io::crc32c_hex(io::file_crc32c(path))}};
}

// Note [Sharded weights]: the weights go in one model.safetensors when their bytes fit in
// max_shard_bytes; else, as transformers' save_pretrained writes them, in shards named
// model-0000k-of-0000n.safetensors, filled in the weights' order with a new shard when the next
// tensor would pass the limit (a tensor larger than the limit is a shard of its own), and
// model.safetensors.index.json, {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}.
// transformers and read_indexed read both forms; trainer_state.json records every file.
std::vector<NamedTensors> split_shards(const NamedTensors& tensors, int64_t max_shard_bytes) {
  TANDEM_ASSERT(max_shard_bytes > 0, "max_shard_bytes ", max_shard_bytes);
  std::vector<NamedTensors> shards;
  int64_t in_shard = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
    if (shards.empty() || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(name, t);
    in_shard += bytes;
  }
  return shards;
}

std::string index_file_name(const std::string& kind) { return kind + ".safetensors.index.json"; }

// "<kind>.safetensors.index.json" mapping every tensor of `files` to its file, as transformers
// writes model.safetensors.index.json; returns its name.
std::string write_index(const io::AtomicDirWriter& writer, const std::string& kind,
                        const std::vector<WrittenFile>& files) {
  int64_t total = 0;
  for (const WrittenFile& f : files) total += f.tensor_bytes;
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (const WrittenFile& f : files) {
    for (const std::string& name : f.tensors) {
      TANDEM_ASSERT(!index["weight_map"].contains(name), name, " is in two ", kind, " files");
      index["weight_map"][name] = f.file;
    }
  }
  const std::string name = index_file_name(kind);
  write_file_atomic(writer.file_path(name), index.dump(2) + "\n");
  return name;
}

// Checks a kTandem trainer_state.json: format, version, position, configs and file records.
void validate_trainer_state(const Json& state, const std::string& path) {
  const JsonFields f(state, "checkpoint file '" + path + "': ");
  const std::string format = f.string("format");
  TANDEM_CHECK(format == kFormatName, f.where(), "format is \"", format, "\", expected \"",
               kFormatName, "\"");
  const int64_t version = f.integer("format_version");
  TANDEM_CHECK(
      version == kCheckpointFormatVersion, f.where(), "format_version is ", version,
      "; this tandem reads version ", kCheckpointFormatVersion,
      version > kCheckpointFormatVersion ? " (the checkpoint is from a newer tandem)" : "");
  read_training_position(state, f.where());
  const JsonFields files(f.get("files"), f.where() + "'files': ");
  files.get(kConfigFile);
  const Json& all = f.get("files");
  TANDEM_CHECK(all.contains(kModelFile) || all.contains(kModelIndexFile), files.where(),
               "records neither ", kModelFile, " nor ", kModelIndexFile);
  TANDEM_CHECK(all.contains(kOptimizerFile) || all.contains(index_file_name("optimizer")),
               files.where(), "records neither ", kOptimizerFile, " nor ",
               index_file_name("optimizer"));
  for (const auto& [name, value] : all.items()) {
    TANDEM_CHECK(
        !name.empty() && name.find('/') == std::string::npos && name != ".." && name != ".",
        files.where(), "records '", name, "', not a file name in the directory");
    const JsonFields record(value, files.where() + "'" + name + "': ");
    TANDEM_CHECK(record.integer("bytes") >= 0, record.where(), "bytes is negative");
    TANDEM_CHECK(record.string("crc32c").size() == 8, record.where(), "crc32c is not 8 hex digits");
  }
}

// Every file trainer_state.json records must have its recorded size and CRC-32C.
void verify_recorded_files(const std::string& dir, const Json& state) {
  for (const auto& [name, record] : state["files"].items()) {
    const std::string path = dir + "/" + name;
    const auto bytes = record["bytes"].get<int64_t>();
    std::error_code ec;
    const auto size = static_cast<int64_t>(fs::file_size(path, ec));
    TANDEM_CHECK(!ec, "checkpoint ", dir, ": ", name, " is missing or unreadable (", ec.message(),
                 "); trainer_state.json records it");
    TANDEM_CHECK(size == bytes, "checkpoint file '", path, "' is ", size,
                 " bytes but trainer_state.json records ", bytes, ": the file is ",
                 size < bytes ? "truncated" : "longer than written", " or was replaced");
    const std::string crc = io::crc32c_hex(io::file_crc32c(path));
    const std::string recorded = record["crc32c"].get<std::string>();
    TANDEM_CHECK(crc == recorded, "checkpoint file '", path, "' has CRC-32C ", crc,
                 " but trainer_state.json records ", recorded, ": the file is corrupt");
  }
}

NamedTensors read_tensors(const std::string& path) {
  std::map<std::string, Tensor> stored = io::load_safetensors(path, MemCategory::kOther);
  NamedTensors out;
  for (auto& [name, tensor] : stored) {
    const DType t = tensor.dtype();
    TANDEM_CHECK(t == DType::kF32 || t == DType::kF64 || t == DType::kBF16, "safetensors file '",
                 path, "': tensor '", name, "' has dtype ", io::safetensors_dtype_name(t),
                 "; weights and optimizer state must be F32, F64 or BF16");
    out.emplace_back(name, std::move(tensor));
  }
  return out;
}

// The tensors of one kind ("model" or "optimizer") in `dir`: "<kind>.safetensors", or the files
// "<kind>.safetensors.index.json" maps every tensor to (each file's tensors must be exactly the
// ones mapped to it). An HF checkpoint's weights are kind "model".
NamedTensors read_indexed(const std::string& dir, const std::string& kind) {
  const std::string single = dir + "/" + kind + ".safetensors";
  if (path_exists(single)) return read_tensors(single);
  const std::string index_name = index_file_name(kind);
  const std::string index_path = dir + "/" + index_name;
  TANDEM_CHECK(path_exists(index_path), "checkpoint ", dir, " has config.json but neither ", kind,
               ".safetensors nor ", index_name);
  const Json index = read_json_file(index_path);
  const JsonFields f(index, "checkpoint file '" + index_path + "': ");
  const Json& map = f.get("weight_map");
  TANDEM_CHECK(map.is_object(), f.where(), "weight_map is not an object");
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [name, file] : map.items()) {
    const std::string shard = file.is_string() ? file.get<std::string>() : std::string();
    TANDEM_CHECK(
        !shard.empty() && shard.find('/') == std::string::npos && shard != ".." && shard != ".",
        f.where(), "weight_map maps '", name, "' to ", file.dump(),
        "; expected a file name in the same directory");
    by_file[shard].insert(name);
  }
  NamedTensors out;
  for (const auto& [shard, names] : by_file) {
    NamedTensors part = read_tensors(dir + "/" + shard);
    TANDEM_CHECK(part.size() == names.size(), "checkpoint file '", dir, "/", shard, "' holds ",
                 part.size(), " tensors but ", index_name, " maps ", names.size(), " to it");
    for (auto& item : part) {
      TANDEM_CHECK(names.count(item.first) == 1, "checkpoint file '", dir, "/", shard,
                   "' holds tensor '", item.first, "', which ", index_name, " does not map to it");
      out.push_back(std::move(item));
    }
  }
  return out;
}

// Optimizer tensors must be exactly "<w>.exp_avg" and "<w>.exp_avg_sq" for each weight w, with
// w's shape.
void check_optimizer_tensors(const CheckpointState& st) {
  const std::string where = "checkpoint file '" + st.dir + "/" + kOptimizerFile + "': ";
  std::map<std::string, const Tensor*> weights;
  for (const auto& [name, t] : st.model) weights[name] = &t;
  std::set<std::string> seen;
  for (const auto& [name, t] : st.optimizer) {
    const size_t dot = name.rfind('.');
    const std::string suffix = dot == std::string::npos ? "" : name.substr(dot + 1);
    const auto it = weights.find(name.substr(0, dot == std::string::npos ? 0 : dot));
    TANDEM_CHECK((suffix == "exp_avg" || suffix == "exp_avg_sq") && it != weights.end(), where,
                 "tensor '", name,
                 "' is not <weight>.exp_avg or <weight>.exp_avg_sq of a weight "
                 "in model.safetensors");
    TANDEM_CHECK(t.shape() == it->second->shape(), where, "tensor '", name, "' has shape ",
                 shape_str(t.shape()), " but the weight has ", shape_str(it->second->shape()));
    seen.insert(name);
  }
  for (const auto& [name, t] : weights) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      TANDEM_CHECK(seen.count(name + suffix) == 1, where, "tensor '", name, suffix, "' is missing");
    }
  }
}

CheckpointKind detect_kind(const std::string& dir) {
  if (path_exists(dir + "/" + kStateFile)) return CheckpointKind::kTandem;
  TANDEM_CHECK(path_exists(dir + "/" + kConfigFile), "--load ", dir,
               ": not a checkpoint: it has no `latest` (a --save directory), no ", kStateFile,
               " (a tandem iteration directory) and no ", kConfigFile,
               " (a Hugging Face checkpoint)");
  return CheckpointKind::kHuggingFace;
}

}  // namespace

int64_t count_shards(const NamedTensors& tensors, int64_t max_shard_bytes) {
  return static_cast<int64_t>(split_shards(tensors, max_shard_bytes).size());
}

std::vector<WrittenFile> write_shards(const std::string& dir, const std::string& kind,
                                      const NamedTensors& tensors, int64_t first, int64_t total,
                                      int64_t max_shard_bytes) {
  const std::vector<NamedTensors> shards = split_shards(tensors, max_shard_bytes);
  TANDEM_ASSERT(first >= 0 && first + static_cast<int64_t>(shards.size()) <= total, kind,
                " shards ", first, " + ", shards.size(), " of ", total);
  std::vector<WrittenFile> out;
  for (size_t i = 0; i < shards.size(); ++i) {
    WrittenFile f;
    if (total == 1) {
      f.file = kind + ".safetensors";
    } else {
      char name[96];
      std::snprintf(name, sizeof name, "%s-%05lld-of-%05lld.safetensors", kind.c_str(),
                    static_cast<long long>(first + static_cast<int64_t>(i) + 1),
                    static_cast<long long>(total));
      f.file = name;
    }
    const std::string path = dir + "/" + f.file;
    io::save_safetensors(path, shards[i], {{"format", "pt"}});
    for (const auto& [name, t] : shards[i]) {
      f.tensors.push_back(name);
      f.tensor_bytes += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
    }
    const Json record = file_record(path);
    f.bytes = record["bytes"].get<int64_t>();
    f.crc32c = record["crc32c"].get<std::string>();
    out.push_back(std::move(f));
  }
  return out;
}

std::unique_ptr<io::AtomicDirWriter> open_checkpoint(const std::string& root_in,
                                                     int64_t iteration) {
  const std::string root = strip_trailing_slashes(root_in);
  std::error_code ec;
  fs::create_directories(root, ec);
  TANDEM_CHECK(!ec && fs::is_directory(root, ec), "--save ", root,
               ": cannot create the directory (", ec.message(), ")");
  recover_save_root(root);
  return std::make_unique<io::AtomicDirWriter>(root + "/" + iteration_dir_name(iteration));
}

SavedCheckpoint commit_checkpoint(io::AtomicDirWriter& writer, const std::string& root_in,
                                  int64_t iteration, const ModelConfig& model,
                                  const Json& trainer_state_in,
                                  const std::vector<WrittenFile>& model_files,
                                  const std::vector<WrittenFile>& optimizer_files, int64_t keep) {
  const std::string root = strip_trailing_slashes(root_in);
  const std::string name = iteration_dir_name(iteration);
  Json trainer_state = trainer_state_in;
  trainer_state["format"] = kFormatName;
  trainer_state["format_version"] = kCheckpointFormatVersion;
  trainer_state["files"] = Json::object();
  for (const std::vector<WrittenFile>* kind : {&model_files, &optimizer_files}) {
    for (const WrittenFile& f : *kind) {
      trainer_state["files"][f.file] = {{"bytes", f.bytes}, {"crc32c", f.crc32c}};
    }
  }
  std::vector<std::string> written;  // files this process writes
  save_stage(name, "config");
  io::save_hf_config(writer.file_path(kConfigFile), model);
  written.push_back(kConfigFile);
  if (model_files.size() > 1) written.push_back(write_index(writer, "model", model_files));
  if (optimizer_files.size() > 1) {
    written.push_back(write_index(writer, "optimizer", optimizer_files));
  }
  save_stage(name, "trainer_state");
  for (const std::string& file : written) {
    trainer_state["files"][file] = file_record(writer.file_path(file));
  }
  write_file_atomic(writer.file_path(kStateFile), trainer_state.dump(2) + "\n");
  save_stage(name, "commit");
  writer.commit();
  SavedCheckpoint out;
  out.dir = root + "/" + name;
  save_stage(name, "latest");
  write_file_atomic(root + "/" + kLatestFile, name + "\n");
  save_stage(name, "prune");
  apply_retention(root, iteration, keep, out.removed, out.warnings);
  save_stage(name, "done");
  return out;
}

SavedCheckpoint save_checkpoint(const std::string& root, int64_t iteration,
                                const CheckpointState& state, int64_t keep,
                                int64_t max_shard_bytes) {
  TANDEM_CHECK(keep >= 0, "--keep-checkpoints ", keep,
               " is invalid: it must be >= 0 (0 keeps every checkpoint)");
  TANDEM_ASSERT(state.kind == CheckpointKind::kTandem && state.trainer_state.is_object() &&
                    state.trainer_state.value("iteration", int64_t{-1}) == iteration,
                "save_checkpoint needs a trainer state of iteration ", iteration);
  const std::unique_ptr<io::AtomicDirWriter> writer = open_checkpoint(root, iteration);
  const std::string name = iteration_dir_name(iteration);
  save_stage(name, "model");
  const int64_t shards = count_shards(state.model, max_shard_bytes);
  const std::vector<WrittenFile> model =
      write_shards(writer->tmp_dir(), "model", state.model, 0, shards, max_shard_bytes);
  save_stage(name, "optimizer");
  // One rank writes the optimizer state as one file, whatever its size.
  const std::vector<WrittenFile> optimizer =
      write_shards(writer->tmp_dir(), "optimizer", state.optimizer, 0, 1, INT64_MAX);
  return commit_checkpoint(*writer, root, iteration, state.model_config, state.trainer_state, model,
                           optimizer, keep);
}

CheckpointInfo inspect_checkpoint(const std::string& dir) {
  CheckpointInfo info;
  info.dir = resolve_checkpoint_dir(dir);
  info.kind = detect_kind(info.dir);
  info.model_config = io::load_hf_config(info.dir + "/" + kConfigFile);
  if (info.kind == CheckpointKind::kHuggingFace) return info;
  const std::string state_path = info.dir + "/" + kStateFile;
  info.trainer_state = read_json_file(state_path);
  validate_trainer_state(info.trainer_state, state_path);
  // Through ModelConfig, so that fields older checkpoints lack compare as their defaults.
  const Json recorded = config_to_json(
      model_config_from_json(info.trainer_state["model"], state_path + ": 'model': "));
  // What config.json does not carry, training settings rather than the model's math, is the
  // trainer state's.
  Json model = config_to_json(info.model_config);
  for (const std::string& key : io::hf_config_unwritten_fields(info.model_config)) {
    model[key] = recorded[key];
  }
  // A YaRN model's max_position_embeddings is the span YaRN stretches to (factor times the
  // original positions, as transformers reads it), not the length the run trained at.
  if (info.model_config.rope_type == "yarn") model["seq_length"] = recorded["seq_length"];
  info.model_config = model_config_from_json(model, state_path + ": 'model': ");
  const Json in_config = config_to_json(info.model_config);
  for (const auto& [key, value] : in_config.items()) {
    TANDEM_CHECK(recorded[key] == value, "checkpoint ", info.dir, ": ", kConfigFile, " and ",
                 kStateFile, " disagree on ", key, " (", value.dump(), " vs ", recorded[key].dump(),
                 ")");
  }
  return info;
}

namespace {

const Tensor* find_tensor(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor x = io::to_float(a, DType::kF64), y = io::to_float(b, DType::kF64);
  return std::equal(x.data<double>(), x.data<double>() + x.numel(), y.data<double>());
}

// Note [Tied embeddings] (model/parameters.h): a Hugging Face checkpoint of a model whose
// config.json says tie_word_embeddings true has no lm_head.weight (transformers' save_pretrained
// leaves it out), or one equal to the embedding table; tandem reads the table only.
void drop_tied_head(NamedTensors& tensors, const std::string& dir) {
  const Tensor* head = find_tensor(tensors, "lm_head.weight");
  if (head == nullptr) return;
  const Tensor* table = find_tensor(tensors, "model.embed_tokens.weight");
  TANDEM_CHECK(table == nullptr || same_values(*head, *table), "checkpoint ", dir,
               ": lm_head.weight differs from model.embed_tokens.weight, but config.json ties "
               "them (tie_word_embeddings true)");
  std::erase_if(tensors, [](const auto& named) { return named.first == "lm_head.weight"; });
}

// Note [Multi-token prediction layers]: a DeepSeek-V3 checkpoint of num_hidden_layers L with
// num_nextn_predict_layers M holds M more layers, model.layers.{L} to model.layers.{L + M - 1}
// (DeepSeek-V3's published one: layer 61), the multi-token prediction modules, each with copies
// of the shared embedding (embed_tokens) and LM head (shared_head.head). transformers' model has
// no use for them and its loader skips them. tandem keeps the first `keep` modules
// (--mtp-num-layers; the rest are dropped here, so no layout sees them) without the copies: its
// modules share the main model's tensors, so a copy that differs from them is refused. Any other
// tensor the model lacks is refused (check_no_unknown_tensors in checkpoint_restore.cc). tandem
// writes its modules under the same names, without the copies (docs/model.md).
// head: the LM head's name, model.embed_tokens.weight when the model ties it
// (Note [Tied embeddings] in model/parameters.h).
void drop_mtp_layers(NamedTensors& tensors, int64_t num_layers, int64_t keep, int64_t have,
                     const char* head, const std::string& dir) {
  if (have <= 0) return;
  const std::string prefix = "model.layers.";
  const auto layer_of = [&](const std::string& name) -> int64_t {
    if (name.rfind(prefix, 0) != 0) return -1;
    const size_t dot = name.find('.', prefix.size());
    const std::string digits = name.substr(prefix.size(), dot - prefix.size());
    if (dot == std::string::npos || digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return -1;
    return std::stoll(digits);
  };
  const auto shared_copy = [&](const std::string& name, int64_t layer) -> const char* {
    const std::string p = prefix + std::to_string(layer) + ".";
    if (name == p + "embed_tokens.weight") return "model.embed_tokens.weight";
    if (name == p + "shared_head.head.weight") return head;
    return nullptr;
  };
  for (const auto& [name, t] : tensors) {
    const int64_t layer = layer_of(name);
    if (layer < num_layers || layer >= num_layers + keep) continue;
    const char* main = shared_copy(name, layer);
    if (main == nullptr) continue;
    const Tensor* m = find_tensor(tensors, main);
    TANDEM_CHECK(m == nullptr || same_values(t, *m), "checkpoint ", dir, ": ", name,
                 " differs from ", main,
                 "; tandem's multi-token prediction modules share the embedding and the LM head "
                 "with the model, so it cannot hold this checkpoint's modules (load it with "
                 "--mtp-num-layers 0)");
  }
  std::erase_if(tensors, [&](const auto& named) {
    const int64_t layer = layer_of(named.first);
    if (layer < num_layers || layer >= num_layers + have) return false;
    return layer >= num_layers + keep || shared_copy(named.first, layer) != nullptr;
  });
}

}  // namespace

CheckpointState load_checkpoint(const std::string& dir, int64_t mtp_layers) {
  const CheckpointInfo info = inspect_checkpoint(dir);
  CheckpointState st;
  st.kind = info.kind;
  st.dir = info.dir;
  st.model_config = info.model_config;
  st.trainer_state = info.trainer_state;
  if (st.kind == CheckpointKind::kHuggingFace) {
    const int64_t have = io::load_hf_mtp_layers(st.dir + "/" + kConfigFile);
    const int64_t keep = std::max<int64_t>(mtp_layers, 0);
    TANDEM_CHECK(keep <= have, "--mtp-num-layers ", keep,
                 " asks for more multi-token prediction "
                 "modules than checkpoint ",
                 st.dir, " holds (num_nextn_predict_layers ", have,
                 " in its config.json): use at most ", have);
    st.model = read_indexed(st.dir, "model");
    const bool tied = st.model_config.tied_embeddings();
    if (tied) drop_tied_head(st.model, st.dir);
    drop_mtp_layers(st.model, st.model_config.num_layers, keep, have,
                    tied ? "model.embed_tokens.weight" : "lm_head.weight", st.dir);
    return st;
  }
  TANDEM_CHECK(mtp_layers < 0 || mtp_layers == st.model_config.mtp_num_layers, "--mtp-num-layers ",
               mtp_layers, " differs from checkpoint ", st.dir, "'s ",
               st.model_config.mtp_num_layers,
               ": a tandem checkpoint continues with its own modules; pass --mtp-num-layers ",
               st.model_config.mtp_num_layers, " (or leave it out)");
  verify_recorded_files(st.dir, st.trainer_state);
  st.model = read_indexed(st.dir, "model");
  st.optimizer = read_indexed(st.dir, "optimizer");
  check_optimizer_tensors(st);
  return st;
}

void save_model_checkpoint(const std::string& dir, const model::Parameters& params,
                           int64_t max_shard_bytes) {
  const std::string final_dir = strip_trailing_slashes(fs::path(dir).lexically_normal().string());
  const fs::path parent = fs::path(final_dir).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  io::AtomicDirWriter writer(final_dir);
  const NamedTensors model = model_tensors(params);
  const int64_t shards = count_shards(model, max_shard_bytes);
  const std::vector<WrittenFile> files =
      write_shards(writer.tmp_dir(), "model", model, 0, shards, max_shard_bytes);
  if (files.size() > 1) write_index(writer, "model", files);
  io::save_hf_config(writer.file_path(kConfigFile), params.config());
  writer.commit();
}

std::unique_ptr<model::Parameters> load_model_checkpoint(const std::string& dir) {
  const CheckpointState st = load_checkpoint(dir);
  auto params = std::make_unique<model::Parameters>(
      st.model_config, model::ChunkSpec::whole(st.model_config), DType::kF32);
  restore_model(*params, st);
  return params;
}

}  // namespace tandem::runtime
