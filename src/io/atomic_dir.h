// Crash-safe writes: a file or a whole directory is written under a temporary sibling name,
// synced, and renamed into place, so its final name only ever holds a complete version.
//
// Note [Atomic directory write]: AtomicDirWriter creates `<dir>.tmp-XXXXXX` beside `<dir>`; the
// caller writes its files there; commit() fsyncs every file and directory in it, then swaps it
// in. Where the filesystem can (Linux renameat2 RENAME_EXCHANGE) the swap is one atomic
// exchange and the old version, now under the tmp name, is removed; elsewhere the old `<dir>` is
// renamed to `<dir>.old-XXXXXX`, the new one renamed in, the parent synced and the old removed.
// A writer destroyed without commit() removes its tmp directory and leaves `<dir>` untouched.
// After a crash, recover_atomic_dir() restores `<dir>` from `.old-` if it went missing and
// removes leftover `.tmp-`/`.old-` siblings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::io {

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

// The whole file at `path`; throws naming the file when it is missing or above max_bytes.
std::string read_file(const std::string& path, int64_t max_bytes = int64_t{1} << 30);

// How commit() puts the new directory in place of an existing one
// (Note [Atomic directory write]): one atomic exchange where the filesystem supports it (falling
// back otherwise), or always the rename-aside sequence.
enum class DirSwap { kExchangeIfSupported, kRenameAside };

// Note [Atomic directory write].
class AtomicDirWriter {
 public:
  // `final_dir` must not end in '/'; its parent must exist.
  explicit AtomicDirWriter(std::string final_dir, DirSwap swap = DirSwap::kExchangeIfSupported);
  ~AtomicDirWriter();
  AtomicDirWriter(const AtomicDirWriter&) = delete;
  AtomicDirWriter& operator=(const AtomicDirWriter&) = delete;

  // The temporary directory files are written into before commit().
  const std::string& tmp_dir() const { return tmp_dir_; }
  // tmp_dir() + "/" + name.
  std::string file_path(const std::string& name) const;
  // Syncs everything under tmp_dir() and swaps it in as final_dir.
  void commit();
  bool committed() const { return committed_; }

 private:
  std::string final_dir_;
  std::string tmp_dir_;
  DirSwap swap_;
  bool committed_ = false;
};

// Repairs what a crash during AtomicDirWriter::commit() can leave
// (Note [Atomic directory write]). Call it only while no writer for `final_dir` is running (e.g. at
// startup).
void recover_atomic_dir(const std::string& final_dir);

// fsync on a file or directory; throws naming the path on failure.
void fsync_path(const std::string& path);

}  // namespace tandem::io
