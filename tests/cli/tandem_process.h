// Running the real tandem program from tests: in a chosen working directory, with extra
// environment variables, its output captured in files kept outside that directory (so that the
// directory stays exactly as the program leaves it), or its stderr read live through a pipe so a
// test can kill it at a point it announces. Header-only; each test file that uses it is one
// binary with TANDEM_BIN defined by CMake.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef TANDEM_BIN
#error "CMake passes TANDEM_BIN, the path of the tandem program"
#endif

extern char** environ;

namespace tandem::test {

namespace fs = std::filesystem;

constexpr unsigned kTimeoutSeconds = 120;  // SIGALRM ends a run that hangs

class TempDir {
 public:
  explicit TempDir(const char* prefix = "tandem_cli") {
    std::string pattern = (fs::temp_directory_path() / (std::string(prefix) + "_XXXXXX")).string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// argv and envp built before fork(): the child only calls async-signal-safe functions.
struct Command {
  std::vector<std::string> args, env;
  std::vector<char*> argv, envp;

  Command(const std::vector<std::string>& tandem_args, const std::vector<std::string>& extra_env) {
    args.push_back(TANDEM_BIN);
    args.insert(args.end(), tandem_args.begin(), tandem_args.end());
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
};

struct RunResult {
  int exit_code = -1;  // -1: ended by a signal
  std::string out, err;
};

// What the child process is given besides its arguments and environment.
struct ChildSetup {
  int64_t address_space_bytes = 0;  // RLIMIT_AS (`ulimit -v`), when > 0
  int umask = -1;                   // the umask, when >= 0
};

// Runs `tandem args...` in `cwd` to completion; stdout and stderr go to files in `capture`.
inline RunResult run_tandem(const std::vector<std::string>& args, const fs::path& cwd,
                            const fs::path& capture, const std::vector<std::string>& env = {},
                            const ChildSetup& setup = {}) {
  Command cmd(args, env);
  const std::string out_path = (capture / "stdout").string();
  const std::string err_path = (capture / "stderr").string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || ::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    if (setup.address_space_bytes > 0) {
      const rlimit limit{static_cast<rlim_t>(setup.address_space_bytes),
                         static_cast<rlim_t>(setup.address_space_bytes)};
      if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(126);
    }
    if (setup.umask >= 0) ::umask(static_cast<mode_t>(setup.umask));
    ::alarm(kTimeoutSeconds);
    ::execve(cmd.argv[0], cmd.argv.data(), cmd.envp.data());
    ::_exit(127);
  }
  RunResult r;
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

// A running tandem whose stderr the test reads line by line.
class LiveTandem {
 public:
  LiveTandem(const std::vector<std::string>& args, const fs::path& cwd,
             const std::vector<std::string>& env) {
    Command cmd(args, env);
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null < 0 || ::chdir(cwd.c_str()) != 0) ::_exit(126);
      ::dup2(null, STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::alarm(kTimeoutSeconds);
      ::execve(cmd.argv[0], cmd.argv.data(), cmd.envp.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~LiveTandem() {
    if (pid_ > 0 && !reaped_) kill();
    if (fd_ >= 0) ::close(fd_);
  }
  LiveTandem(const LiveTandem&) = delete;
  LiveTandem& operator=(const LiveTandem&) = delete;

  // Reads stderr until it holds `text`; false at end of file or after `timeout_s`.
  bool wait_for(const std::string& text, int timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (seen_.find(text) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return false;
      seen_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // SIGKILL, then reap.
  void kill() {
    ::kill(pid_, SIGKILL);
    wait_exit();
  }
  // The exit code; -1 when a signal ended it.
  int wait_exit() {
    int status = 0;
    if (!reaped_ && ::waitpid(pid_, &status, 0) == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    return exit_code_;
  }
  const std::string& stderr_so_far() const { return seen_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string seen_;
};

// Every file and directory under `root`: relative path -> kind, size, modification time and
// contents, so that any creation, change or removal shows as a difference.
inline std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    const auto mtime = e.last_write_time().time_since_epoch().count();
    if (e.is_directory()) {
      out[rel] = "dir";
    } else {
      out[rel] = std::to_string(e.file_size()) + " bytes, mtime " + std::to_string(mtime) + ": " +
                 slurp(e.path());
    }
  }
  return out;
}

}  // namespace tandem::test
