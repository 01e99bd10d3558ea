// The run's files checked before anything is written: inputs readable, outputs writable and
// none of them one of the inputs (Note [Outputs that are inputs]).
#pragma once

#include <string>
#include <vector>

#include "cli/options.h"

namespace tandem::cli {

// A file a command reads or writes, and the option (or argument) that names it.
struct NamedPath {
  std::string flag;
  std::string path;
};

// Throws tandem::Error naming the flag and the path unless `path` can be read.
void check_readable(const std::string& flag, const std::string& path);
// Note [Outputs that are inputs], for any command: each output is a file name whose directory
// exists and can be written, is none of `reads` and no other output. Two paths name one file
// when they resolve to the same path or, both existing, to the same device and inode (a hard
// link, or a symbolic link to it). Empty paths are skipped.
void check_outputs(const std::vector<NamedPath>& reads, const std::vector<NamedPath>& writes);
// Every path of `o`: the data, --load, --save, the outputs.
void check_paths(const RunOptions& o);

}  // namespace tandem::cli
