// The run's files, checked before anything is written (path_checks.h).
#include "cli/path_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/file_dataset.h"

namespace tandem::cli {
namespace {

std::string os_reason() { return std::strerror(errno); }

}  // namespace

void check_readable(const std::string& flag, const std::string& path) {
  TANDEM_CHECK(::access(path.c_str(), R_OK) == 0, flag, " ", path, ": cannot read it (",
               os_reason(), ")");
}

namespace {

void check_data_path(const RunOptions& o) {
  if (o.data_path.empty()) return;
  const std::string& path = o.data_path;
  const data::DatasetFormat format = parse_enum<data::DatasetFormat>(o.data_format).value();
  const bool megatron_ok =
      format == data::DatasetFormat::kAuto || format == data::DatasetFormat::kMegatron;
  const bool prefix_ok = megatron_ok && ::access((path + ".bin").c_str(), R_OK) == 0 &&
                         ::access((path + ".idx").c_str(), R_OK) == 0;
  if (prefix_ok) return;
  std::error_code ec;
  TANDEM_CHECK(::access(path.c_str(), R_OK) == 0, "--data-path ", path, ": cannot read it (",
               os_reason(), "); give a readable token or text file",
               megatron_ok ? ", or the prefix P of a Megatron P.bin/P.idx pair" : "");
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), "--data-path ", path,
               ": is a directory; give a data file or a Megatron .bin/.idx prefix");
}

// The directory an output file will be written to must already exist; nothing is created here.
void check_output_parent(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), flag, " ", path,
               ": is a directory; give a file name");
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  TANDEM_CHECK(std::filesystem::is_directory(parent, ec), flag, " ", path, ": the directory ",
               parent.string(), " does not exist");
  TANDEM_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, flag, " ", path, ": cannot write in ",
               parent.string(), " (", os_reason(), ")");
}

// --save: the directory, or the nearest part of its path that exists (where it will be made),
// must be writable now, not found out after the last step.
void check_save_dir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::exists(dir, ec) || std::filesystem::is_directory(dir, ec),
               "--save ", dir, ": exists and is not a directory; give a directory");
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) {
    p = p.parent_path();
  }
  TANDEM_CHECK(std::filesystem::is_directory(p, ec), "--save ", dir, ": ", p.string(),
               " is not a directory");
  TANDEM_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, "--save ", dir, ": cannot write in ",
               p.string(), " (", os_reason(), ")");
}

// The path as the file system resolves it (parents' links followed, "." and ".." gone).
std::filesystem::path resolved(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? std::filesystem::absolute(path).lexically_normal() : p;
}

// p's path below dir, or empty when p is not inside dir.
std::filesystem::path below(const std::filesystem::path& p, const std::filesystem::path& dir) {
  const std::filesystem::path rel = p.lexically_relative(dir);
  if (rel.empty() || *rel.begin() == ".." || rel == ".") return {};
  return rel;
}

// Note [Outputs that are inputs]: a file the run writes must not be one it reads, nor one
// another output writes, nor sit inside the checkpoint it loads or where --save puts its own
// files (`latest`, the iter_NNNNNNN directories), checked before anything is written: a log
// written onto the data file would truncate it, onto a shard of the loaded checkpoint corrupt it.
void check_outputs_are_not_inputs(const RunOptions& o) {
  std::vector<std::pair<std::string, std::filesystem::path>> reads;
  if (!o.config_file.empty()) reads.push_back({"--config", resolved(o.config_file)});
  if (!o.data_path.empty()) {
    for (const char* suffix : {"", ".bin", ".idx"}) {
      reads.push_back({"--data-path", resolved(o.data_path + suffix)});
    }
  }
  const std::filesystem::path load = o.load_dir.empty() ? "" : resolved(o.load_dir);
  const std::filesystem::path save = o.save_dir.empty() ? "" : resolved(o.save_dir);
  std::vector<std::pair<std::string, std::filesystem::path>> writes;
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--log-json", o.log_json},
        {"--trace", o.trace_path},
        {"--node-times-out", o.node_times_out},
        {"--routing-out", o.routing_out}}) {
    if (path.empty()) continue;
    const std::filesystem::path out = resolved(path);
    for (const auto& [input, in] : reads) {
      TANDEM_CHECK(out != in, flag, " ", path, " is the file ", input, " reads (", in.string(),
                   "): writing it would destroy the input; give another file");
    }
    TANDEM_CHECK(load.empty() || below(out, load).empty(), flag, " ", path,
                 " lies inside the checkpoint --load reads (", load.string(),
                 "); write it elsewhere");
    const std::filesystem::path in_save = save.empty() ? "" : below(out, save);
    const std::string first = in_save.empty() ? "" : in_save.begin()->string();
    TANDEM_CHECK(first.empty() || (first != "latest" && first.rfind("iter_", 0) != 0 &&
                                   first.rfind('.', 0) != 0),
                 flag, " ", path, " is where --save ", o.save_dir,
                 " writes its own files (latest, iter_NNNNNNN); give another name");
    for (const auto& [other, prev] : writes) {
      TANDEM_CHECK(out != prev, flag, " ", path, " and ", other,
                   " name the same file; give each output its own");
    }
    writes.push_back({flag, out});
  }
}

}  // namespace

void check_paths(const RunOptions& o) {
  check_outputs_are_not_inputs(o);
  check_data_path(o);
  if (!o.load_dir.empty()) check_readable("--load", o.load_dir);
  check_save_dir(o.save_dir);
  check_output_parent("--log-json", o.log_json);
  check_output_parent("--trace", o.trace_path);
  check_output_parent("--node-times-out", o.node_times_out);
  check_output_parent("--routing-out", o.routing_out);
}

}  // namespace tandem::cli
