// Crash-safe file writes (atomic_file.h).
#include "core/atomic_file.h"

#include <fcntl.h>
#include <stdlib.h>  // mkstemp
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/file_mode.h"

namespace tandem {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string parent_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, "cannot open '", path, "' to sync it: ", errno_text());
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems cannot sync a directory and say EINVAL; there is nothing more to do.
  TANDEM_CHECK(rc == 0 || err == EINVAL, "cannot sync '", path, "': ", std::strerror(err));
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  std::string pattern = path_ + ".tmp-XXXXXX";
  fd_ = ::mkstemp(pattern.data());
  TANDEM_CHECK(fd_ >= 0, "cannot create a temporary file beside '", path_, "': ", errno_text());
  tmp_path_ = pattern;
  TANDEM_CHECK(::fchmod(fd_, new_file_mode()) == 0, "cannot set the mode of '", tmp_path_,
               "': ", errno_text());  // mkstemp's 0600 -> the umask's (core/file_mode.h)
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, int64_t bytes) {
  TANDEM_ASSERT(fd_ >= 0 && !committed_, "write after commit to '", path_, "'");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, static_cast<size_t>(bytes));
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n > 0, "cannot write '", tmp_path_, "': ", errno_text());
    p += n;
    bytes -= n;
  }
}

void AtomicFileWriter::commit() {
  TANDEM_ASSERT(fd_ >= 0 && !committed_, "second commit of '", path_, "'");
  TANDEM_CHECK(::fsync(fd_) == 0, "cannot sync '", tmp_path_, "': ", errno_text());
  const int rc = ::close(fd_);
  fd_ = -1;
  TANDEM_CHECK(rc == 0, "cannot close '", tmp_path_, "': ", errno_text());
  TANDEM_CHECK(::rename(tmp_path_.c_str(), path_.c_str()) == 0, "cannot rename '", tmp_path_,
               "' to '", path_, "': ", errno_text());
  committed_ = true;
  fsync_path(parent_of(path_));  // the rename itself made durable
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFileWriter out(path);
  out.write(contents.data(), static_cast<int64_t>(contents.size()));
  out.commit();
}

}  // namespace tandem
