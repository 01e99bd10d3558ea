// What `tandem train` writes after a step besides checkpoints: the files of the last step and
// each step's progress record. Every rank calls them (they gather over the world); rank 0 writes.
#pragma once

#include <string>

#include "cli/options.h"
#include "cli/progress.h"
#include "core/allocator.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::cli {

// --tensorboard-dir must be a directory, or one that can be made (its nearest existing
// ancestor a directory this process may write into); creates nothing. Throws tandem::Error
// naming the path and why. Nothing to check for an empty path.
void check_tensorboard_dir(const std::string& dir);

// --profile (Megatron-LM's, onto --trace): the ranks of --profile-ranks (comma-separated world
// ranks; throws naming a bad list), whether the step ending at 1-based `iteration` is one of
// [--profile-step-start, --profile-step-end) as Megatron counts them (the iterations done before
// it), the file of its timeline (--trace's name with ".iterN" before the extension) and its
// writing, a collective of every rank.
std::vector<int64_t> profile_ranks(const RunOptions& o);
bool profiles_step(const RunOptions& o, int64_t iteration);
std::string profile_trace_path(const std::string& trace, int64_t iteration);
void write_profiled_step(const RunOptions& o, runtime::PipelineTrainer& trainer, Allocator& alloc,
                         int64_t iteration);

// After the last step: --trace (every rank's measured timeline and activation memory, the
// allocator tracing since before the step; with --profile, the profiled steps' instead),
// --node-times-out (GPU) and --routing-out (MoE).
void write_last_step_files(const RunOptions& o, runtime::PipelineTrainer& trainer,
                           Allocator& alloc);

// The step's record for the progress output: its losses and rates, and every rank's memory and
// all-to-all seconds, expert rows, a note when experts moved, the measured forward-backward
// (GPU).
IterationRecord gather_record(const RunOptions& o, const runtime::StepResult& r,
                              runtime::PipelineTrainer& trainer);

}  // namespace tandem::cli
