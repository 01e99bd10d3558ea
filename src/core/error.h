// Errors, in two kinds that main tells apart by type (docs/design.md "Errors"):
//   tandem::Error          user, config, data and resource errors, thrown by TANDEM_CHECK; the
//                          message names the bad value and what is valid. Exit code 2.
//   tandem::InternalError  bugs and failures below us: a broken invariant (TANDEM_ASSERT), a
//                          failed CUDA, cuBLAS, NCCL or MPI call (TANDEM_INTERNAL_ERROR under
//                          their check macros); it carries the file, line and function that
//                          detected it. Exit code 1.
// The library throws both and never exits; only main turns an error into an exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

// A user, config, data or resource error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A bug or a failed call into a system library, with where it was detected. Not a tandem::Error:
// code that handles bad input (catch (const Error&)) lets it pass. what() is
// "<file>:<line>: <message> (in <function>)", the file relative to the repository.
class InternalError : public std::runtime_error {
 public:
  InternalError(const char* file, int line, const char* function, const std::string& message);

  const std::string& file() const { return file_; }
  int line() const { return line_; }
  const std::string& function() const { return function_; }
  const std::string& message() const { return message_; }

 private:
  std::string file_, function_, message_;
  int line_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void throw_internal(const char* file, int line, const char* function,
                                 const std::string& message);
}  // namespace detail

}  // namespace tandem

// Throws tandem::Error with the concatenated message when cond is false.
#define TANDEM_CHECK(cond, ...)                                                \
  do {                                                                         \
    if (!(cond)) throw ::tandem::Error(::tandem::detail::concat(__VA_ARGS__)); \
  } while (0)

// Throws tandem::InternalError at this file, line and function with the concatenated message.
// The one macro under TANDEM_ASSERT and the CUDA, cuBLAS, NCCL and MPI checks.
#define TANDEM_INTERNAL_ERROR(...)                                                         \
  ::tandem::detail::throw_internal(__FILE__, __LINE__, static_cast<const char*>(__func__), \
                                   ::tandem::detail::concat(__VA_ARGS__))

// Throws tandem::InternalError when an invariant is broken (kept in Release builds). In a
// destructor or another noexcept function that ends the process (std::terminate prints what()).
#define TANDEM_ASSERT(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      TANDEM_INTERNAL_ERROR("invariant broken: " #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
  } while (0)
