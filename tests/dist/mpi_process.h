// Running the tandem program under mpirun from a test: the command line through a shell, its
// exit code, output (stdout and stderr together) and wall time. Header-only; CMake passes
// TANDEM_BIN (the program) and TANDEM_MPIEXEC (mpirun).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::test {

struct Result {
  int code;  // the exit code; 128 + the signal when one ended it
  std::string output;
  double seconds;
};

inline Result run(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out, secs};
}

// mpirun as the tests start it: oversubscribed (CI has 2 cores), shared memory between ranks.
inline const std::string kMpirun = std::string(TANDEM_MPIEXEC) +
                                   " --oversubscribe --allow-run-as-root --bind-to none "
                                   "-x OMPI_MCA_btl=self,vader -x OPENBLAS_NUM_THREADS=1";

// The directory for one test's files, named after the test and this process, so that runs
// from different checkouts on one machine never read each other's event files.
inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/tandem_mpi_" + name + "_" + std::to_string(::getpid());
}

// temp_path(name), emptied and created.
inline std::string temp_dir(const std::string& name) {
  const std::string dir = temp_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The lines of a --log-json file.
inline std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace tandem::test
