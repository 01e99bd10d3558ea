// The two error kinds of core/error.h. Oracle: the type thrown, and the file, line and function
// an internal error carries, compared with __LINE__ and the name of the function that threw.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace tandem {
namespace {

int g_assert_line = 0;

void broken_invariant(int value) {
  g_assert_line = __LINE__ + 1;
  TANDEM_ASSERT(value > 0, "value ", value, " is not positive");
}

TEST(Error, CheckThrowsTheUserErrorWithItsMessage) {
  try {
    TANDEM_CHECK(1 + 1 == 3, "--num-layers ", 0, " is invalid");
    FAIL() << "no throw";
  } catch (const InternalError&) {
    FAIL() << "a user error came out as an internal one";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--num-layers 0 is invalid");
  }
}

TEST(Error, AssertThrowsAnInternalErrorAtItsFileLineAndFunction) {
  EXPECT_NO_THROW(broken_invariant(1));
  try {
    broken_invariant(-2);
    FAIL() << "no throw";
  } catch (const Error&) {
    FAIL() << "an internal error came out as a user error";
  } catch (const InternalError& e) {
    EXPECT_EQ(e.file(), "tests/core/test_error.cc");
    EXPECT_EQ(e.line(), g_assert_line);
    EXPECT_EQ(e.function(), "broken_invariant");
    EXPECT_EQ(e.message(), "invariant broken: value > 0: value -2 is not positive");
    EXPECT_EQ(std::string(e.what()),
              "tests/core/test_error.cc:" + std::to_string(g_assert_line) +
                  ": invariant broken: value > 0: value -2 is not positive (in broken_invariant)");
  }
}

TEST(Error, AssertWithoutAMessageNamesTheCondition) {
  try {
    TANDEM_ASSERT(sizeof(int) == 1);
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    EXPECT_EQ(e.message(), "invariant broken: sizeof(int) == 1");
  }
}

TEST(Error, InternalErrorMacroNamesTheRepositoryPathHoweverTheBuildSpellsIt) {
  for (const char* spelled :
       {"/home/ci/tandem/src/core/tensor.cc", "../src/core/tensor.cc", "src/core/tensor.cc"}) {
    const InternalError e(spelled, 7, "f", "m");
    EXPECT_EQ(e.file(), "src/core/tensor.cc") << spelled;
    EXPECT_STREQ(e.what(), "src/core/tensor.cc:7: m (in f)");
  }
  // A checkout under a folder named like a top-level one keeps the last match.
  EXPECT_EQ(InternalError("/src/work/tests/src/cli/main.cc", 1, "f", "m").file(),
            "src/cli/main.cc");
  try {
    TANDEM_INTERNAL_ERROR("CUDA call ", "cudaMalloc", " failed: ", 2);
  } catch (const InternalError& e) {
    EXPECT_EQ(e.message(), "CUDA call cudaMalloc failed: 2");
    EXPECT_EQ(e.file(), "tests/core/test_error.cc");
  }
}

}  // namespace
}  // namespace tandem
