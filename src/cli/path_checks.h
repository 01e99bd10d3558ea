// The run's files checked before anything is written: inputs readable, outputs writable and
// none of them one of the inputs (Note [Outputs that are inputs]).
#pragma once

#include <string>

#include "cli/options.h"

namespace tandem::cli {

// Throws tandem::Error naming the flag and the path unless `path` can be read.
void check_readable(const std::string& flag, const std::string& path);
// Every path of `o`: the data, --load, --save, the outputs.
void check_paths(const RunOptions& o);

}  // namespace tandem::cli
