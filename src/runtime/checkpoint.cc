// Model checkpoint directories (Hugging Face layout) over io/safetensors and io/hf_config.
#include "runtime/checkpoint.h"

#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

namespace tandem::runtime {

namespace fs = std::filesystem;

void save_model_checkpoint(const std::string& dir, const model::Parameters& params) {
  const fs::path final_dir = fs::path(dir).lexically_normal();
  std::string final_str = final_dir.string();
  while (final_str.size() > 1 && final_str.back() == '/') final_str.pop_back();
  const fs::path parent = fs::path(final_str).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const model::ParamEntry& e : params.entries()) tensors.emplace_back(e.name, params.param(e));
  io::AtomicDirWriter writer(final_str);
  io::save_safetensors(writer.file_path("model.safetensors"), tensors, {{"format", "pt"}});
  io::save_hf_config(writer.file_path("config.json"), params.config());
  writer.commit();
}

std::unique_ptr<model::Parameters> load_model_checkpoint(const std::string& dir) {
  TANDEM_CHECK(fs::is_directory(dir), "--load ", dir,
               " is not a directory: pass a directory written by `tandem train --save`");
  const ModelConfig cfg = io::load_hf_config((fs::path(dir) / "config.json").string());
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  std::map<std::string, Tensor> stored = io::load_safetensors(weights, MemCategory::kOther);
  auto params = std::make_unique<model::Parameters>(cfg, model::ChunkSpec::whole(cfg), DType::kF32);
  for (const model::ParamEntry& e : params->entries()) {
    auto it = stored.find(e.name);
    TANDEM_CHECK(it != stored.end(), weights, ": tensor ", e.name, " is missing (the model of ",
                 "config.json needs it)");
    TANDEM_CHECK(it->second.shape() == e.shape, weights, ": tensor ", e.name, " has shape ",
                 shape_str(it->second.shape()), " but config.json implies ", shape_str(e.shape));
    params->param(e).copy_from(io::to_float(it->second, DType::kF32));
    stored.erase(it);
  }
  TANDEM_CHECK(stored.empty(), weights, ": tensor ", stored.empty() ? "" : stored.begin()->first,
               " is not part of the model that config.json describes");
  return params;
}

}  // namespace tandem::runtime
