// InternalError: where a bug or a failed library call was detected, with the file named from the
// repository's top (src/core/tensor.cc), however the build spelled __FILE__.
#include "core/error.h"

namespace tandem {
namespace {

// "/work/tandem/src/core/tensor.cc" and "../src/core/tensor.cc" -> "src/core/tensor.cc": the
// part from the last top-level folder of the repository that holds code.
std::string repository_path(const char* file) {
  const std::string path = file;
  size_t best = std::string::npos;
  for (const char* top : {"src/", "tests/", "bench/", "fuzz/"}) {
    for (size_t at = path.find(top); at != std::string::npos; at = path.find(top, at + 1)) {
      if (at == 0 || path[at - 1] == '/') {
        if (best == std::string::npos || at > best) best = at;
      }
    }
  }
  return best == std::string::npos ? path : path.substr(best);
}

}  // namespace

InternalError::InternalError(const char* file, int line, const char* function,
                             const std::string& message)
    : std::runtime_error(repository_path(file) + ":" + std::to_string(line) + ": " + message +
                         " (in " + function + ")"),
      file_(repository_path(file)),
      function_(function),
      message_(message),
      line_(line) {}

namespace detail {

void throw_internal(const char* file, int line, const char* function, const std::string& message) {
  throw InternalError(file, line, function, message);
}

}  // namespace detail
}  // namespace tandem
