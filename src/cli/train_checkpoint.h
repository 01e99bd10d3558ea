// `tandem train`'s side of checkpoints: the options a --load checkpoint fixes, resuming the
// trainer from it, and saving under --save.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/options.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::cli {

// For finalize_run_options (Note [Options from a checkpoint]). Fixed: every model option of the
// checkpoint's config (for a plain HF checkpoint all but --seq-length, which HF stores only as a
// limit, max_position_embeddings) and, for a tandem checkpoint, --seed and --global-batch-size,
// which fix the data position. Defaults (tandem checkpoints): the other train options except
// --train-iters and --log-interval (lr, schedule, Adam, clipping, micro-batch size, nan policy).
// `weights_only` (--finetune): a tandem checkpoint is read as a Hugging Face one, its model
// options fixed and its training settings not taken.
nlohmann::json checkpoint_option_values(const std::string& load_dir, bool weights_only = false);

// The data set as trainer_state.json records it: path, format and size in bytes (the built-in
// task: format "addition" and its operand digits).
nlohmann::json describe_data(const RunOptions& o);

// With --load: every rank reads and validates the checkpoint and restores its chunks
// (runtime::restore_pipeline; nothing changes when anything is wrong); an error on any rank
// stops every rank with that rank's message (runtime::run_agreeing). Rank 0 says on `log` what
// was loaded; a checkpoint already at or past --train-iters is an error. --finetune takes the
// weights alone (iteration 0), --no-load-optim the weights and the iteration with a fresh
// optimizer (runtime::RestoreParts). Returns the iteration training continues from (0 without
// --load).
int64_t resume_pipeline_from_checkpoint(runtime::PipelineTrainer& trainer, const RunOptions& o,
                                        std::ostream& log);

// Whether the step that ends at `iteration` is saved: every --save-interval, and the last one.
bool should_save(const RunOptions& o, int64_t iteration);
// Saves under --save, called by every rank: gathered to rank 0, which writes
// (runtime::save_checkpoint_parallel), or with --ckpt-fully-parallel-save every rank writing its
// own tensors (runtime::save_checkpoint_fully_parallel); a failed save stops every rank. Rank 0
// prints the retention warnings and, unless --quiet, the bytes and seconds of the save and of
// each writing rank.
void save_pipeline_checkpoint(runtime::PipelineTrainer& trainer, const RunOptions& o);

}  // namespace tandem::cli
