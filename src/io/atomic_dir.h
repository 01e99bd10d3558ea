// Crash-safe directory writes: a whole directory is written under a temporary sibling name,
// synced, and renamed into place, so its final name only ever holds a complete version. Its
// files are written with core/atomic_file.h, the one atomic file writer.
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

#include "core/atomic_file.h"

namespace tandem::io {

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

}  // namespace tandem::io
