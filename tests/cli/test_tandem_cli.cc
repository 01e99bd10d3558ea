// The real `tandem` program on bad command lines, run as a subprocess in an empty directory.
// Oracle: exit code 2, stderr names the bad value, and the directory is still empty afterwards.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

#ifndef TANDEM_BIN
#error "CMake passes TANDEM_BIN, the path of the tandem program"
#endif

// The subcommand that takes the run options.
constexpr const char* kCommand = "train";
constexpr unsigned kTimeoutSeconds = 60;  // a bad command line must fail long before this

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_bin_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Result {
  int exit_code = -1;  // -1: killed by a signal
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs TANDEM_BIN with `args` in `cwd`; stdout and stderr are captured in `capture`, which is
// another directory so that `cwd` stays exactly as the program leaves it.
Result run_tandem(const std::vector<std::string>& args, const fs::path& cwd,
                  const fs::path& capture) {
  const std::string out_path = (capture / "stdout").string();
  const std::string err_path = (capture / "stderr").string();
  std::vector<std::string> all = {TANDEM_BIN, kCommand};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || ::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::alarm(kTimeoutSeconds);  // survives exec: SIGALRM ends a run that does not fail
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Result r;
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

struct BadRun {
  std::vector<std::string> args;
  std::string expected_in_stderr;  // the bad value
};

TEST(TandemProgram, BadCommandLinesExitWithTwoAndWriteNothing) {
  const std::vector<BadRun> cases = {
      {{"--num-layers", "abc"}, "abc"},
      {{"--no-such-option", "1"}, "--no-such-option"},
      {{"--num-layers"}, "--num-layers"},
      {{"--schedule", "zigzag"}, "zigzag"},
      {{"--device", "tpu"}, "tpu"},
      // No GPU on the test machine (or no CUDA in the build): refused before anything is written.
      {{"--device", "cuda", "--save", "ckpt", "--log-json", "out.json"}, "--device cuda"},
      {{"--log-json", "out.json", "--num-layers", "-3"}, "-3"},
      {{"--log-json", "out.json", "--moe-router-topk", "9"}, "--moe-router-topk 9"},
      {{"--log-json", "out.json", "--trace", "trace.json", "--lr", "-1"}, "--lr -1"},
      {{"--save", "ckpt", "--hidden-size", "250"}, "--hidden-size 250"},
      {{"--save", "ckpt", "--global-batch-size", "20"}, "--global-batch-size 20"},
      {{"--save", "ckpt", "--log-json", "out.json", "--seed", "x1"}, "x1"},
      {{"--config", "missing.toml", "--log-json", "out.json"}, "missing.toml"},
      {{"--data-path", "nope.bin", "--save", "ckpt"}, "nope.bin"},
  };
  TempDir capture;
  for (const BadRun& c : cases) {
    std::string line;
    for (const std::string& a : c.args) line += " " + a;
    TempDir work;
    const Result r = run_tandem(c.args, work.path(), capture.path());
    EXPECT_EQ(r.exit_code, 2) << "tandem " << kCommand << line << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(c.expected_in_stderr), std::string::npos)
        << "tandem " << kCommand << line << "\nstderr: " << r.err;
    EXPECT_TRUE(fs::is_empty(work.path())) << "tandem " << kCommand << line << " wrote files";
  }
}

TEST(TandemProgram, HelpExitsWithZero) {
  TempDir work, capture;
  const Result r = run_tandem({"--help"}, work.path(), capture.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--num-layers"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_empty(work.path()));
}

}  // namespace
