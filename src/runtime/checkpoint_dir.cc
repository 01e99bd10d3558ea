// The checkpoint directory's layout (checkpoint_dir.h): iteration directory names, `latest`,
// what an interrupted save leaves, and retention.
#include "runtime/checkpoint_dir.h"

#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/atomic_dir.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;

// Deletes one old checkpoint directory: renamed aside first, so its name never holds a partly
// deleted checkpoint. Failures become warnings.
void delete_checkpoint_dir(const std::string& dir, std::vector<std::string>& removed,
                           std::vector<std::string>& warnings) {
  std::string aside = dir + ".deleted-XXXXXX";
  std::error_code ec;
  if (::mkdtemp(aside.data()) == nullptr || ::rename(dir.c_str(), aside.c_str()) != 0) {
    warnings.push_back("could not delete old checkpoint " + dir + ": " + std::strerror(errno));
    fs::remove(aside, ec);
    return;
  }
  fs::remove_all(aside, ec);
  if (ec) warnings.push_back("could not delete " + aside + ": " + ec.message());
  removed.push_back(dir);
}

}  // namespace

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

int64_t parse_iteration_name(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "iter_"
  if (name.rfind("iter_", 0) != 0 || name.size() < kPrefix + 7 || name.size() > kPrefix + 18) {
    return -1;
  }
  int64_t value = 0;
  for (size_t i = kPrefix; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    value = value * 10 + (name[i] - '0');
  }
  return value;
}

std::string iteration_dir_name(int64_t iteration) {
  TANDEM_ASSERT(iteration >= 0, "iteration ", iteration);
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

void recover_save_root(const std::string& root) {
  std::set<std::string> bases;
  std::vector<std::string> trash;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* marker : {".tmp-", ".old-", ".deleted-"}) {
      const size_t at = name.find(marker);
      if (at == std::string::npos) continue;
      const std::string base = name.substr(0, at);
      if (base != kLatestFile && parse_iteration_name(base) < 0) continue;
      if (std::string(marker) == ".deleted-") {
        trash.push_back(e.path().string());
      } else {
        bases.insert(base);
      }
    }
  }
  for (const std::string& base : bases) io::recover_atomic_dir(root + "/" + base);
  for (const std::string& path : trash) fs::remove_all(path, ec);
}

void apply_retention(const std::string& root, int64_t written, int64_t keep,
                     std::vector<std::string>& removed, std::vector<std::string>& warnings) {
  if (keep == 0) return;  // every checkpoint stays, as Megatron-LM keeps them
  std::vector<std::pair<int64_t, std::string>> others;  // (iteration, name)
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t it = parse_iteration_name(name);
    if (it >= 0 && it != written && e.is_directory(ec)) others.emplace_back(it, name);
  }
  // Newest first: iterations up to `written` by number, then those above it (an older run's).
  std::sort(others.begin(), others.end(), [written](const auto& a, const auto& b) {
    const bool a_ours = a.first <= written, b_ours = b.first <= written;
    return a_ours != b_ours ? a_ours : a.first > b.first;
  });
  for (size_t i = static_cast<size_t>(keep - 1); i < others.size(); ++i) {
    delete_checkpoint_dir(root + "/" + others[i].second, removed, warnings);
  }
  if (!removed.empty()) fsync_path(root);
}

std::string resolve_checkpoint_dir(const std::string& dir_in) {
  const std::string dir = strip_trailing_slashes(dir_in);
  std::error_code ec;
  TANDEM_CHECK(fs::is_directory(dir, ec), "--load ", dir,
               fs::exists(dir, ec) ? ": not a directory" : ": no such directory",
               "; give a --save directory, one of its iter_NNNNNNN "
               "directories, or a Hugging Face checkpoint directory");
  const std::string latest = dir + "/" + kLatestFile;
  if (!path_exists(latest)) return dir;
  std::string name = io::read_file(latest, 4096);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  const bool printable = std::all_of(name.begin(), name.end(), [](char c) { return c >= 32; });
  TANDEM_CHECK(parse_iteration_name(name) >= 0, "checkpoint pointer '", latest, "' holds '",
               printable ? name : std::string("(binary data)"),
               "'; expected the name of an iteration directory such as iter_0000100");
  const std::string target = dir + "/" + name;
  // A crash while a directory of that name was being replaced can leave only its .old- copy.
  if (!path_exists(target)) io::recover_atomic_dir(target);
  TANDEM_CHECK(fs::is_directory(target, ec), "checkpoint pointer '", latest, "' names ", name,
               " but ", target,
               " does not exist (deleted or moved?); pass one of the "
               "iter_NNNNNNN directories in ",
               dir, " to --load instead");
  return target;
}

}  // namespace tandem::runtime
