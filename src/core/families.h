// The transformers model classes ("families") tandem's models are saved as and loaded from
// (docs/model.md "Families"), and which of them expresses a model.
#pragma once

#include <cstdint>

#include "core/config.h"

namespace tandem {

// The transformers class a model is saved as (docs/model.md "Families"); its config.json keys
// and weight names are that class's.
enum class ModelFamily : uint8_t { kLlama, kMixtral, kQwen3Moe, kQwen2Moe, kDeepseekV3 };
const char* family_class_name(ModelFamily f);
// The family that expresses `m`; throws tandem::Error naming the setting no family has.
ModelFamily family_of(const ModelConfig& m);

}  // namespace tandem
