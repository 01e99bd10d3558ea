// A temporary file beside a target name, renamed onto it once complete (the token writers):
// the target name only ever holds a complete file. (src/io has the general atomic writers; data
// may not depend on io.)
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/file_mode.h"

namespace tandem::data {

// A temporary file beside `target`; removed on destruction unless commit() renamed it.
class TempFileBesideTarget {
 public:
  explicit TempFileBesideTarget(std::string target) : target_(std::move(target)) {
    std::string pattern = target_ + ".tmp-XXXXXX";
    fd_ = ::mkstemp(pattern.data());
    TANDEM_CHECK(fd_ >= 0, "cannot create a temporary file beside '", target_,
                 "': ", std::strerror(errno));
    tmp_ = pattern;
    // mkstemp's 0600 -> the umask's (core/file_mode.h).
    TANDEM_CHECK(::fchmod(fd_, new_file_mode()) == 0, "cannot set the mode of '", tmp_,
                 "': ", std::strerror(errno));
  }
  ~TempFileBesideTarget() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempFileBesideTarget(const TempFileBesideTarget&) = delete;
  TempFileBesideTarget& operator=(const TempFileBesideTarget&) = delete;

  void write(const void* data, int64_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, static_cast<size_t>(bytes));
      if (n < 0 && errno == EINTR) continue;
      TANDEM_CHECK(n > 0, "cannot write '", tmp_, "': ", std::strerror(errno));
      p += n;
      bytes -= n;
    }
  }

  void commit() {
    TANDEM_CHECK(::fsync(fd_) == 0, "cannot sync '", tmp_, "': ", std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    TANDEM_CHECK(rc == 0, "cannot close '", tmp_, "': ", std::strerror(errno));
    TANDEM_CHECK(::rename(tmp_.c_str(), target_.c_str()) == 0, "cannot rename '", tmp_, "' to '",
                 target_, "': ", std::strerror(errno));
    committed_ = true;
    // Make the rename itself durable.
    const size_t slash = target_.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : target_.substr(0, slash + 1);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string target_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace tandem::data
