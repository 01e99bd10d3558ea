// The data options' rules, before anything is opened (Note [Validation data] in validation.h):
// which options may name the run's data together, and every file they name.
#pragma once

#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/path_checks.h"
#include "data/blend.h"

namespace tandem::cli {

// As Megatron: --mock-data, --data-path and the per-part paths (--train-data-path,
// --valid-data-path, --test-data-path) are three sources of data, of which a run names one;
// --split cuts --data-path only. Each list is read as a blend (data::parse_blend). Throws
// tandem::Error naming the options and what to give instead.
void check_data_sources(const RunOptions& o);

// Every file prefix the data options name, each with its option, in the options' order.
std::vector<NamedPath> data_paths(const RunOptions& o);

}  // namespace tandem::cli
