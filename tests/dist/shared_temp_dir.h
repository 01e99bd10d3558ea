// A directory every rank of the test world can see, made by rank 0 and removed by it at the end
// of the scope (the multi-rank checkpoint tests' save directories).
#pragma once

#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <string>
#include <system_error>

#include "dist_env.h"

namespace tandem::testing {

class SharedTempDir {
 public:
  SharedTempDir() {
    std::string mine;
    if (g_world->rank() == 0) {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "tandem_dist_XXXXXX").string();
      mine = ::mkdtemp(pattern.data());
    }
    path_ = g_world->all_gather_bytes(mine)[0];
  }
  ~SharedTempDir() {
    g_world->barrier();
    std::error_code ec;
    if (g_world->rank() == 0) std::filesystem::remove_all(path_, ec);
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tandem::testing
