// Model checkpoints in Hugging Face layout: a directory with model.safetensors (MODEL.md's names,
// weights [out, in]) and config.json, written to a temporary sibling and renamed into place.
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "model/parameters.h"

namespace tandem::runtime {

// Writes params (a whole model) and its config into `dir` atomically.
void save_model_checkpoint(const std::string& dir, const model::Parameters& params);

// Reads config.json and model.safetensors from `dir` into a new whole-model Parameters (f32).
// Throws tandem::Error naming the file and what is missing or malformed.
std::unique_ptr<model::Parameters> load_model_checkpoint(const std::string& dir);

}  // namespace tandem::runtime
