// MockDataset (--mock-data): uniformly random tokens. Oracles: the range [0, vocab), a chi-square
// bound on the counts of a small vocabulary, and determinism in (seed, index) alone.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "data/mock.h"

namespace tandem::data {
namespace {

std::vector<int32_t> draw(const MockDataset& d, int64_t index, int64_t length) {
  std::vector<int32_t> out(static_cast<size_t>(length), -1);
  d.sample(index, out.data(), length);
  return out;
}

TEST(MockData, TokensAreInRangeAndSpreadUniformly) {
  constexpr int64_t kVocab = 16;
  const MockDataset d(7, kVocab);
  EXPECT_EQ(d.vocab_size(), kVocab);
  std::vector<int64_t> counts(kVocab, 0);
  int64_t n = 0;
  for (int64_t i = 0; i < 64; ++i) {
    for (int32_t t : draw(d, i, 1000)) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, kVocab);
      ++counts[static_cast<size_t>(t)];
      ++n;
    }
  }
  const double expected = static_cast<double>(n) / kVocab;
  double chi2 = 0;
  for (int64_t c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 37.7) << "chi-square with 15 degrees of freedom, p = 0.001";
}

TEST(MockData, SampleIsAFunctionOfSeedAndIndexOnly) {
  const MockDataset a(7, 32000);
  const MockDataset b(7, 32000);
  const MockDataset other_seed(8, 32000);
  // Any order of reading gives the same sample.
  const std::vector<int32_t> s5 = draw(a, 5, 257);
  draw(a, 6, 257);
  EXPECT_EQ(draw(b, 5, 257), s5);
  EXPECT_EQ(draw(a, 5, 257), s5);
  EXPECT_NE(draw(a, 6, 257), s5);
  EXPECT_NE(draw(other_seed, 5, 257), s5);
  // A shorter read is a prefix of the longer one.
  const std::vector<int32_t> head = draw(a, 5, 100);
  EXPECT_EQ(head, std::vector<int32_t>(s5.begin(), s5.begin() + 100));
}

TEST(MockData, EmptyVocabularyIsAnError) {
  try {
    MockDataset d(1, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("got 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::data
