// A read-only memory map of a whole file, with 64-bit sizes: token files past 4 GiB are mapped
// once and read in place, and only the pages a sample touches are ever read from disk.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::data {

class MappedFile {
 public:
  // Maps `path` read-only; throws tandem::Error naming the file when it cannot be opened or
  // mapped. An empty file maps to size 0 and a null data pointer.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  const unsigned char* data() const { return data_; }

 private:
  std::string path_;
  int64_t size_ = 0;
  const unsigned char* data_ = nullptr;
};

// The size of the file at `path` in bytes, or -1 when it does not exist or is not a regular file.
int64_t regular_file_size(const std::string& path);

}  // namespace tandem::data
