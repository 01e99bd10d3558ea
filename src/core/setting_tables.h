// The tables of the model's, training's, parallel layout's and performance settings
// (Note [Every setting declared once] in core/settings.h). Each is made for the object whose
// members its rows point into; the program adds its data, output and `plan` tables (src/cli).
#pragma once

#include "core/config.h"
#include "core/settings.h"
#include "core/tuning.h"

namespace tandem {

// The model's settings: model_fields() as rows (Note [One table of model fields] in
// core/model_config.h).
Settings model_settings(ModelConfig& m);
// The optimizer, the schedule of the learning rate, the batch, and what the trainer keeps for
// the backward (recomputation, offload).
Settings train_settings(TrainConfig& t);
// The layout over ranks, the pipeline schedule, and how the ranks' communication overlaps the
// compute (rows point into `p`, and into `t` for the trainer's own).
Settings parallel_settings(ParallelConfig& p, TrainConfig& t);
// Note [Performance settings] (core/tuning.h).
Settings tuning_settings(Tuning& t);

}  // namespace tandem
