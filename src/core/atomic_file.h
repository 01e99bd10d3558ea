// Crash-safe file writes, the one way tandem writes an output file atomically (checkpoints,
// safetensors, config.json, token files, `latest`, eval's results): the file is written under a
// temporary name beside its target, synced and renamed onto it, and the directory synced, so
// the target name only ever holds a complete file. The file gets the mode open(2) would give it
// under the umask (core/file_mode.h). Whole directories: io/atomic_dir.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// Streams one file to `<path>.tmp-XXXXXX`; commit() syncs, closes and renames it to `path`.
// Destroyed without commit(), it removes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, int64_t bytes);
  void commit();
  const std::string& tmp_path() const { return tmp_path_; }

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Replaces `path` with `contents` atomically (e.g. the "latest" checkpoint pointer).
void write_file_atomic(const std::string& path, std::string_view contents);

// fsync on a file or directory; throws naming the path on failure.
void fsync_path(const std::string& path);

}  // namespace tandem
