// The bad-input harness of the CLI tests: run `tandem <command> <args>` in a fresh directory
// that a case prepares, and check the oracle of every bad input: exit code 2 (main's code for bad
// input), stderr holding the expected words (the bad value, the file, what is valid), and the
// directory exactly as before: no file created, changed or removed (names, sizes, modification
// times and contents compared).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem_process.h"

namespace tandem::test {

// Model options small enough that building the trainer takes no time.
inline const std::vector<std::string> kSmall = {
    "--num-layers",       "1",  "--hidden-size",      "32", "--num-attention-heads", "4",
    "--num-query-groups", "2",  "--ffn-hidden-size",  "32", "--num-experts",         "2",
    "--seq-length",       "16", "--micro-batch-size", "2",  "--global-batch-size",   "4"};

// kSmall followed by `more`.
inline std::vector<std::string> small(std::vector<std::string> more) {
  std::vector<std::string> args = kSmall;
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

inline void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// An llm.c token file: 256 int32 header (magic, version, count), then uint16 tokens.
inline std::string llmc(int32_t magic, int32_t version, int32_t count,
                        const std::vector<int>& tokens) {
  std::string out;
  put_le(out, static_cast<uint32_t>(magic), 4);
  put_le(out, static_cast<uint32_t>(version), 4);
  put_le(out, static_cast<uint32_t>(count), 4);
  out.resize(1024, '\0');
  for (int t : tokens) put_le(out, static_cast<uint32_t>(t), 2);
  return out;
}

struct BadInput {
  std::string name;
  std::vector<std::string> args;  // after `tandem <command>`
  std::vector<std::string> expected;
  std::function<void(const fs::path& work)> setup = [](const fs::path&) {};
  std::string command = "train";
};

// Runs one case; returns the seconds the program ran.
inline double run_case(const BadInput& c, const fs::path& capture,
                       const std::function<void(const fs::path&)>& prepare,
                       const ChildSetup& setup = {}) {
  TempDir work("tandem_bad");
  prepare(work.path());
  c.setup(work.path());
  const auto before = snapshot(work.path());
  std::vector<std::string> args = {c.command};
  args.insert(args.end(), c.args.begin(), c.args.end());
  std::string line;
  for (const std::string& a : args) line += " " + a;
  const auto start = std::chrono::steady_clock::now();
  const RunResult r = run_tandem(args, work.path(), capture, {}, setup);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 2) << c.name << ": tandem" << line << "\nstderr: " << r.err;
  for (const std::string& part : c.expected) {
    EXPECT_NE(r.err.find(part), std::string::npos)
        << c.name << ": tandem" << line << "\nstderr lacks '" << part << "': " << r.err;
  }
  EXPECT_EQ(snapshot(work.path()), before) << c.name << ": tandem" << line << " changed files";
  return seconds;
}

// Runs every case of every table; returns how many ran.
inline int run_cases(const std::vector<std::vector<BadInput>>& tables) {
  TempDir capture;
  int count = 0;
  for (const std::vector<BadInput>& cases : tables) {
    for (const BadInput& c : cases) {
      run_case(c, capture.path(), [](const fs::path&) {});
      ++count;
    }
  }
  return count;
}

}  // namespace tandem::test
