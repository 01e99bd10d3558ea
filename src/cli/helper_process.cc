#include "cli/helper_process.h"

#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace tandem::cli {

std::string beside_program(const std::string& env, const std::vector<std::string>& candidates,
                           const std::string& fallback) {
  if (const char* path = std::getenv(env.c_str())) return path;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (const std::string& rel : candidates) {
    const std::filesystem::path p = exe.parent_path() / rel;
    if (!ec && std::filesystem::is_regular_file(p, ec)) return p.lexically_normal().string();
  }
  return fallback;
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string helper_failure(int status, const std::string& helper) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGPIPE) return "";
  return detail::concat(helper, " failed (",
                        WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                          : std::string("killed"),
                        "; its message is above)");
}

std::string helper_first_line(const std::string& command, const std::string& helper) {
  std::FILE* pipe = ::popen(command.c_str(), "r");
  TANDEM_CHECK(pipe != nullptr, "cannot start `", command, "`");
  std::string line;
  for (int c; (c = std::fgetc(pipe)) != EOF && c != '\n';) line += static_cast<char>(c);
  // Drain the rest so that the helper never stops on a full pipe.
  while (std::fgetc(pipe) != EOF) {
  }
  const std::string failure = helper_failure(::pclose(pipe), helper);
  TANDEM_CHECK(failure.empty(), failure, " running `", command, "`");
  TANDEM_CHECK(!line.empty(), "`", command, "` printed nothing");
  return line;
}

}  // namespace tandem::cli
