// Pieces shared by the single-rank and the multi-rank `tandem train`.
#pragma once

#include <memory>

#include "cli/options.h"
#include "cli/progress.h"
#include "data/dataset.h"
#include "runtime/reference_trainer.h"

namespace tandem::cli {

// The built-in addition task without --data-path, else the file in its format.
std::unique_ptr<data::Dataset> make_dataset(const RunOptions& o);
// The progress reporter's settings from the options.
ReporterConfig reporter_config(const RunOptions& o);
// One step's figures for the progress output (memory as a one-rank list).
IterationRecord to_record(const runtime::StepResult& r);
// The multi-rank path of `tandem train` (train_distributed.cc).
void run_train_distributed(RunOptions& o);

}  // namespace tandem::cli
