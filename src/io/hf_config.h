// Hugging Face config.json for the model of docs/model.md: MixtralForCausalLM when experts are on,
// LlamaForCausalLM when they are off, so a tandem checkpoint loads unchanged in `transformers`.
// Reading accepts what those classes accept for this model family (keys absent take the HF
// class's default) and rejects any setting the equations of docs/model.md do not cover.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace tandem::io {

// The config.json text for `model` (validated first); max_position_embeddings = seq_length.
std::string hf_config_json(const ModelConfig& model);
// Writes hf_config_json(model) to `path` atomically.
void save_hf_config(const std::string& path, const ModelConfig& model);

// Parses config.json text; `source` (the file name) is named in every error together with the
// offending key. The result is validated.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);
ModelConfig load_hf_config(const std::string& path);
// Note [Multi-token prediction layers] (runtime/checkpoint.cc): the layers a config.json's
// num_nextn_predict_layers adds after its num_hidden_layers (DeepSeek-V3's key, which tandem
// writes for its modules in every family); when absent, 1 for DeepSeek-V3 (transformers'
// default), 0 for the other families.
int64_t load_hf_mtp_layers(const std::string& path);

// The ModelConfig fields (their checkpoint JSON keys, Note [One table of model fields]) that
// `model`'s config.json does not carry: training settings rather than the model's math (the
// expert bias's update rate, the load-balancing loss of a family whose config has none). Reading
// config.json gives them their defaults; a tandem checkpoint keeps them in trainer_state.json.
std::vector<std::string> hf_config_unwritten_fields(const ModelConfig& model);

}  // namespace tandem::io
