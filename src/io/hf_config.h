// Hugging Face config.json for the model of docs/model.md: MixtralForCausalLM when experts are on,
// LlamaForCausalLM when they are off, so a tandem checkpoint loads unchanged in `transformers`.
// Reading accepts what those classes accept for this model family (keys absent take the HF
// class's default) and rejects any setting the equations of docs/model.md do not cover.
#pragma once

#include <string>

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

}  // namespace tandem::io
