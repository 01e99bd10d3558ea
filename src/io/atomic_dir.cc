// Crash-safe directory writes (Note [Atomic directory write] in atomic_dir.h).
#include "io/atomic_dir.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc, _GNU_SOURCE)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/file_mode.h"

namespace tandem::io {
namespace fs = std::filesystem;
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Removes `path` and everything under it; failures are ignored (used for cleanup only).
void remove_tree_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// A fresh, unique, empty directory named `<base>.<kind>-XXXXXX`.
std::string make_sibling_dir(const std::string& base, const char* kind) {
  std::string pattern = base + "." + kind + "-XXXXXX";
  TANDEM_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create directory '", pattern,
               "' beside '", base, "': ", errno_text());
  return pattern;
}

// Swaps the names of two directories atomically; false when the filesystem cannot.
bool exchange_names(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  const int err = errno;
  TANDEM_CHECK(err == EINVAL || err == ENOSYS || err == ENOTSUP, "cannot exchange '", a, "' and '",
               b, "': ", std::strerror(err));
  return false;
}

void rename_or_throw(const std::string& from, const std::string& to) {
  TANDEM_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename '", from, "' to '", to,
               "': ", errno_text());
}

}  // namespace

std::string read_file(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, "cannot open '", path, "': ", errno_text());
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!stat_ok || st.st_size > max_bytes) {
    ::close(fd);
    TANDEM_CHECK(stat_ok, "'", path, "' is not a readable regular file");
    TANDEM_CHECK(false, "'", path, "' is ", st.st_size, " bytes, more than the ", max_bytes,
                 " expected for it");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  TANDEM_CHECK(done == text.size(), "cannot read all ", text.size(), " bytes of '", path, "'");
  return text;
}

AtomicDirWriter::AtomicDirWriter(std::string final_dir, DirSwap swap)
    : final_dir_(std::move(final_dir)), swap_(swap) {
  TANDEM_CHECK(!final_dir_.empty() && final_dir_.back() != '/', "directory name '", final_dir_,
               "' is invalid: give it without a trailing '/'");
  tmp_dir_ = make_sibling_dir(final_dir_, "tmp");
  TANDEM_CHECK(::chmod(tmp_dir_.c_str(), new_directory_mode()) == 0, "cannot set the mode of '",
               tmp_dir_, "': ", errno_text());  // mkdtemp's 0700 -> the umask's
}

AtomicDirWriter::~AtomicDirWriter() {
  if (!committed_) remove_tree_quietly(tmp_dir_);
}

std::string AtomicDirWriter::file_path(const std::string& name) const {
  return tmp_dir_ + "/" + name;
}

void AtomicDirWriter::commit() {
  TANDEM_ASSERT(!committed_, "second commit of '", final_dir_, "'");
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(tmp_dir_)) {
    if (e.is_regular_file() || e.is_directory()) fsync_path(e.path().string());
  }
  fsync_path(tmp_dir_);
  const std::string parent = parent_of(final_dir_);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(final_dir_, ec))) {
    rename_or_throw(tmp_dir_, final_dir_);
    committed_ = true;
    fsync_path(parent);
    return;
  }
  if (swap_ == DirSwap::kExchangeIfSupported && exchange_names(tmp_dir_, final_dir_)) {
    committed_ = true;  // tmp_dir_ now names the old version
    fsync_path(parent);
    remove_tree_quietly(tmp_dir_);
    return;
  }
  // No atomic exchange here: move the old version aside (onto an empty unique directory, which
  // rename replaces), move the new one in, and only then remove the old one.
  const std::string old_dir = make_sibling_dir(final_dir_, "old");
  rename_or_throw(final_dir_, old_dir);
  if (::rename(tmp_dir_.c_str(), final_dir_.c_str()) != 0) {
    const int err = errno;
    ::rename(old_dir.c_str(), final_dir_.c_str());  // put the old version back
    TANDEM_CHECK(false, "cannot rename '", tmp_dir_, "' to '", final_dir_,
                 "': ", std::strerror(err));
  }
  committed_ = true;
  fsync_path(parent);
  remove_tree_quietly(old_dir);
}

void recover_atomic_dir(const std::string& final_dir) {
  const fs::path final_path(final_dir);
  const std::string base = final_path.filename().string();
  const std::string parent = parent_of(final_dir);
  std::vector<std::string> tmps, olds;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(base + ".tmp-", 0) == 0) tmps.push_back(e.path().string());
    if (name.rfind(base + ".old-", 0) == 0) olds.push_back(e.path().string());
  }
  if (!fs::exists(fs::symlink_status(final_dir, ec)) && !olds.empty()) {
    // The crash came between moving the old version aside and moving the new one in; the old
    // version is the last one that was completely committed.
    rename_or_throw(olds.back(), final_dir);
    olds.pop_back();
    fsync_path(parent);
  }
  for (const std::string& p : tmps) remove_tree_quietly(p);
  for (const std::string& p : olds) remove_tree_quietly(p);
}

}  // namespace tandem::io
