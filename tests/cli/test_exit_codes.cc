// The tandem program's exit codes by kind of error (src/cli/main.cc). Oracle: the code and the
// first line of stderr: a user error exits 2 with "tandem: error: ..."; an internal error exits 1
// with "tandem: internal error at <file>:<line>: ..." naming the source line that raised it. The
// errors are raised by the TANDEM_TEST_ERROR hook in main.cc, through TANDEM_CHECK and
// TANDEM_INTERNAL_ERROR, before the command line is read.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tandem_process.h"

namespace {

using tandem::test::run_tandem;
using tandem::test::RunResult;
using tandem::test::TempDir;

RunResult run_with(const std::string& test_error, const std::vector<std::string>& args) {
  TempDir cwd("tandem_exit"), capture("tandem_exit_out");
  return run_tandem(args, cwd.path(), capture.path(), {"TANDEM_TEST_ERROR=" + test_error});
}

// The line of src/cli/main.cc that holds `text`, counted from 1 (0 when none does).
int main_cc_line_of(const std::string& text) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/src/cli/main.cc");
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find(text) != std::string::npos) return n;
  }
  return 0;
}

TEST(ExitCodes, AnInternalErrorExitsOneNamingFileAndLine) {
  const RunResult r = run_with("internal", {"train", "--train-iters", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const int line = main_cc_line_of("if (f.error == \"internal\") TANDEM_INTERNAL_ERROR(");
  ASSERT_GT(line, 0);
  const std::string expected =
      "tandem: internal error at src/cli/main.cc:" + std::to_string(line) + ": ";
  EXPECT_EQ(r.err.rfind(expected, 0), 0u) << r.err;
  EXPECT_NE(r.err.find("TANDEM_TEST_ERROR=internal asks for this"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(in fail_if_a_test_asks)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(ExitCodes, AUserErrorExitsTwoWithoutFileAndLine) {
  const RunResult r = run_with("user", {"train", "--train-iters", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "tandem: error: TANDEM_TEST_ERROR=user asks for this\n");
}

TEST(ExitCodes, AnErrorForAnotherRankLeavesThisOneAlone) {
  // Not under mpirun: no rank matches, and --help runs as usual.
  const RunResult r = run_with("internal,rank=1", {"train", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--train-iters"), std::string::npos);
}

TEST(ExitCodes, BadOptionsStillExitTwo) {
  const RunResult r = run_with("", {"train", "--no-such-option"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--no-such-option"), std::string::npos) << r.err;
}

}  // namespace
