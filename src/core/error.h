// Errors: TANDEM_CHECK throws tandem::Error for user, config and data errors (the message names
// the bad value and what is valid); TANDEM_ASSERT aborts on a broken invariant, in every build.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

// A user, config, data or resource error. Only main() turns it into an exit code.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace tandem

// Throws tandem::Error with the concatenated message when cond is false.
#define TANDEM_CHECK(cond, ...)                                        \
  do {                                                                 \
    if (!(cond)) throw ::tandem::Error(::tandem::detail::concat(__VA_ARGS__)); \
  } while (0)

// Aborts with file and line when an internal invariant is broken (kept in Release builds).
#define TANDEM_ASSERT(cond, ...)                                                     \
  do {                                                                               \
    if (!(cond))                                                                     \
      ::tandem::detail::assert_fail(#cond, __FILE__, __LINE__,                       \
                                    ::tandem::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
