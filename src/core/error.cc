// Invariant failures print where they happened and abort; they are bugs, not user errors.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace tandem::detail {

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "tandem: internal invariant broken at %s:%d: %s %s\n", file, line, cond,
               msg.c_str());
  std::abort();
}

}  // namespace tandem::detail
