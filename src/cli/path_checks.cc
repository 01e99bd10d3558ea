// The run's files, checked before anything is written (path_checks.h).
#include "cli/path_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "cli/data_options.h"
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

// A data file, or the prefix of a Megatron pair, must be readable.
void check_data_path(const RunOptions& o, const std::string& flag, const std::string& path) {
  const data::DatasetFormat format = parse_enum<data::DatasetFormat>(o.data_format).value();
  const bool megatron_ok =
      format == data::DatasetFormat::kAuto || format == data::DatasetFormat::kMegatron;
  const bool prefix_ok = megatron_ok && ::access((path + ".bin").c_str(), R_OK) == 0 &&
                         ::access((path + ".idx").c_str(), R_OK) == 0;
  if (prefix_ok) return;
  std::error_code ec;
  TANDEM_CHECK(::access(path.c_str(), R_OK) == 0, flag, " ", path, ": cannot read it (",
               os_reason(), "); give a readable token or text file",
               megatron_ok ? ", or the prefix P of a Megatron P.bin/P.idx pair" : "");
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), flag, " ", path,
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

// Whether `a` and `b` name one file (check_outputs).
bool same_file(const std::string& a, const std::string& b) {
  if (resolved(a) == resolved(b)) return true;
  struct stat sa = {}, sb = {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// A Megatron prefix names P.bin and P.idx; a file is read under its own name too.
void add_data_reads(std::vector<NamedPath>& reads, const std::string& flag,
                    const std::string& path) {
  if (path.empty()) return;
  for (const char* suffix : {"", ".bin", ".idx"}) reads.push_back({flag, path + suffix});
}

// Note [Outputs that are inputs]: a file a command writes must not be one it reads, nor one
// another output writes, nor (train, eval) sit inside the checkpoint it loads or where --save
// puts its own files (`latest`, the iter_NNNNNNN directories), checked before anything is
// written: a log written onto the data file would truncate it, onto a shard of the loaded
// checkpoint corrupt it; `tandem convert a a` would read a file it is replacing.
void check_outputs_are_not_inputs(const RunOptions& o) {
  std::vector<NamedPath> reads;
  if (!o.config_file.empty()) reads.push_back({"--config", o.config_file});
  for (const auto& [flag, path] : data_paths(o)) add_data_reads(reads, flag, path);
  const std::vector<NamedPath> writes = {{"--log-json", o.log_json},
                                         {"--trace", o.trace_path},
                                         {"--node-times-out", o.node_times_out},
                                         {"--routing-out", o.routing_out}};
  check_outputs(reads, writes);
  const std::filesystem::path load = o.load_dir.empty() ? "" : resolved(o.load_dir);
  const std::filesystem::path save = o.save_dir.empty() ? "" : resolved(o.save_dir);
  for (const auto& [flag, path] : writes) {
    if (path.empty()) continue;
    const std::filesystem::path out = resolved(path);
    TANDEM_CHECK(load.empty() || below(out, load).empty(), flag, " ", path,
                 " lies inside the checkpoint --load reads (", load.string(),
                 "); write it elsewhere");
    const std::filesystem::path in_save = save.empty() ? "" : below(out, save);
    const std::string first = in_save.empty() ? "" : in_save.begin()->string();
    TANDEM_CHECK(first.empty() || (first != "latest" && first.rfind("iter_", 0) != 0 &&
                                   first.rfind('.', 0) != 0),
                 flag, " ", path, " is where --save ", o.save_dir,
                 " writes its own files (latest, iter_NNNNNNN); give another name");
  }
}

}  // namespace

void check_outputs(const std::vector<NamedPath>& reads, const std::vector<NamedPath>& writes) {
  for (size_t w = 0; w < writes.size(); ++w) {
    const auto& [flag, path] = writes[w];
    if (path.empty()) continue;
    for (const auto& [input, in] : reads) {
      TANDEM_CHECK(in.empty() || !same_file(path, in), flag, " ", path, " is the file ", input,
                   " reads (", in, "): writing it would destroy the input; give another file");
    }
    for (size_t v = 0; v < w; ++v) {
      TANDEM_CHECK(writes[v].path.empty() || !same_file(path, writes[v].path), flag, " ", path,
                   " and ", writes[v].flag, " ", writes[v].path,
                   " name the same file; give each output its own");
    }
    check_output_parent(flag, path);
  }
}

void check_paths(const RunOptions& o) {
  check_outputs_are_not_inputs(o);
  for (const auto& [flag, path] : data_paths(o)) check_data_path(o, flag, path);
  if (!o.load_dir.empty()) check_readable("--load", o.load_dir);
  check_save_dir(o.save_dir);
}

}  // namespace tandem::cli
