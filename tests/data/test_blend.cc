// Megatron's blended data (data/blend.h). Oracles: the words' forms as Megatron's
// get_blend_from_list reads them; a plain sequential rewrite of Megatron's blending loop (its
// indices for every sample, against the random-access chunks the data set keeps); the binomial
// bound on each file's share of the samples, read from the tokens themselves (each file holds
// one byte value); and the bound of one sample that Megatron's greedy order keeps.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "data/blend.h"
#include "data_files.h"

namespace tandem::data {
namespace {

class BlendTest : public FileDatasetTest {
 protected:
  // A text file of `bytes` copies of `c` (a byte-level data set of one token value).
  std::string file_of(char c, int bytes) {
    const std::string p = path(std::string(1, c) + ".txt");
    write_bytes(p, std::vector<unsigned char>(static_cast<size_t>(bytes), c));
    return p;
  }
};

TEST(Blend, ReadsMegatronsForms) {
  const BlendSpec one = parse_blend("--data-path", {"A"});
  EXPECT_EQ(one.paths, (std::vector<std::string>{"A"}));
  EXPECT_TRUE(one.weights.empty());
  const BlendSpec pairs = parse_blend("--data-path", {"0.3", "A", "0.7", "B"});
  EXPECT_EQ(pairs.paths, (std::vector<std::string>{"A", "B"}));
  EXPECT_EQ(pairs.weights, (std::vector<double>{0.3, 0.7}));
  const BlendSpec prefixes = parse_blend("--data-path", {"A", "B"});
  EXPECT_EQ(prefixes.paths, (std::vector<std::string>{"A", "B"}));
  EXPECT_TRUE(prefixes.weights.empty());
  // An odd number of words holds no pairs: prefixes alone, even where one looks like a number.
  EXPECT_EQ(parse_blend("--data-path", {"1", "A", "B"}).paths,
            (std::vector<std::string>{"1", "A", "B"}));
  expect_error([] { parse_blend("--data-path", {}); }, {"--data-path", "no path"});
  expect_error(
      [] {
        parse_blend("--data-path", {"0.3", "A", "B", "C"});
      },
      {"--data-path 0.3 A B C", "some prefixes have a weight"});
  for (const std::string bad : {"0", "-1", "nan", "inf"}) {
    expect_error(
        [&] {
          parse_blend("--train-data-path", {bad, "A", "1", "B"});
        },
        {"--train-data-path", "the weight " + bad + " of A", "finite number > 0"});
  }
}

// Megatron's blending loop, sample after sample: the part of each sample and its index there.
std::vector<std::pair<size_t, int64_t>> megatron_order(const std::vector<double>& raw, int64_t n) {
  double sum = 0;
  for (double w : raw) sum += w;
  std::vector<double> w;
  for (double x : raw) w.push_back(x / sum);
  std::vector<int64_t> taken(w.size(), 0);
  std::vector<std::pair<size_t, int64_t>> out;
  for (int64_t i = 0; i < n; ++i) {
    const double at = i < 1 ? 1.0 : static_cast<double>(i);
    size_t best = 0;
    for (size_t d = 1; d < w.size(); ++d) {
      if (w[d] * at - static_cast<double>(taken[d]) >
          w[best] * at - static_cast<double>(taken[best]))
        best = d;
    }
    out.emplace_back(best, taken[best]++);
  }
  return out;
}

// Parts that are never read: locate() alone is asked.
class NoData : public Dataset {
 public:
  void sample(int64_t, int32_t*, int64_t) const override {}
  int64_t vocab_size() const override { return 1; }
  std::string describe() const override { return "none"; }
};

BlendedDataset blend_of(const std::vector<double>& weights) {
  std::vector<std::unique_ptr<Dataset>> parts;
  for (size_t d = 0; d < weights.size(); ++d) parts.push_back(std::make_unique<NoData>());
  return BlendedDataset(std::move(parts), weights);
}

TEST(Blend, OrderIsMegatronsAtEveryIndexInAnyOrder) {
  for (const std::vector<double>& weights :
       {std::vector<double>{0.3, 0.7}, {2, 5, 3}, {1, 1, 1, 1}, {0.001, 0.999}}) {
    const int64_t n = 3 * kBlendStride + 17;
    const auto want = megatron_order(weights, n);
    const BlendedDataset forward = blend_of(weights);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(forward.locate(i), want[i]) << i;
    const BlendedDataset backward = blend_of(weights);  // the far end first
    for (int64_t i = n - 1; i >= 0; i -= 7) ASSERT_EQ(backward.locate(i), want[i]) << i;
  }
}

// Every prefix of n samples takes w * n of each part, within one sample (Megatron's greedy
// order), far into the run too.
TEST(Blend, EveryPrefixHoldsItsShareWithinOneSample) {
  const std::vector<double> weights = {0.2, 0.5, 0.3};
  const BlendedDataset blend = blend_of(weights);
  std::vector<int64_t> count(3, 0);
  for (int64_t n = 1; n <= 20000; ++n) {
    count[blend.locate(n - 1).first]++;
    for (size_t d = 0; d < 3; ++d)
      ASSERT_LE(std::abs(static_cast<double>(count[d]) - weights[d] * static_cast<double>(n)), 1.0)
          << "part " << d << " after " << n;
  }
  const int64_t far = 1'000'000;
  for (size_t d = 0; d < 3; ++d) {
    // The index within part d of the next sample it gives is the number taken so far.
    int64_t i = far;
    while (blend.locate(i).first != d) ++i;
    EXPECT_LE(
        std::abs(static_cast<double>(blend.locate(i).second) - weights[d] * static_cast<double>(i)),
        1.0)
        << d;
  }
}

// Through the files: 0.3 A 0.7 B gives each file its share of the samples (the binomial bound
// of 4 standard deviations, which any fair draw meets; Megatron's order meets 1 / n), the same
// samples for the same seed, other windows for another seed.
TEST_F(BlendTest, FilesGetTheirSharesAndTheSeedFixesTheSamples) {
  const std::string a = file_of('a', 5000), b = file_of('b', 3000);
  const BlendSpec spec = parse_blend("--data-path", {"0.3", a, "0.7", b});
  const auto open = [&](uint64_t seed) {
    return open_blend(spec, DatasetFormat::kText, 256, seed, 9, std::nullopt, SplitPart::kTrain);
  };
  const auto ds = open(7), same = open(7), other = open(8);
  const int n = 2000;
  int from_a = 0;
  bool differs = false;
  std::vector<int32_t> x(9), y(9), z(9);
  for (int i = 0; i < n; ++i) {
    ds->sample(i, x.data(), 9);
    same->sample(i, y.data(), 9);
    other->sample(i, z.data(), 9);
    ASSERT_EQ(x, y) << i;
    for (int32_t t : x) ASSERT_EQ(t, x[0]) << "a sample is of one file";
    from_a += x[0] == 'a' ? 1 : 0;
    EXPECT_EQ(z[0], x[0]) << "the seed picks windows, not files";
  }
  const double share = static_cast<double>(from_a) / n;
  EXPECT_NEAR(share, 0.3, 4 * std::sqrt(0.3 * 0.7 / n));
  EXPECT_NEAR(share, 0.3, 1.0 / n);
  EXPECT_NE(ds->describe().find("a blend of 0.3 x"), std::string::npos) << ds->describe();
  // Another seed orders the windows differently (checked on a file with distinct tokens).
  std::vector<unsigned char> bytes;
  for (int i = 0; i < 4000; ++i) bytes.push_back(static_cast<unsigned char>(i * 31 % 251));
  write_bytes(path("c.txt"), bytes);
  const BlendSpec two = parse_blend("--data-path", {"1", path("c.txt"), "1", a});
  const auto s7 = open_blend(two, DatasetFormat::kText, 256, 7, 9, std::nullopt, SplitPart::kTrain);
  const auto s8 = open_blend(two, DatasetFormat::kText, 256, 8, 9, std::nullopt, SplitPart::kTrain);
  for (int i = 0; i < 50 && !differs; i += 2) {
    s7->sample(i, x.data(), 9);
    s8->sample(i, y.data(), 9);
    differs = x != y;
  }
  EXPECT_TRUE(differs) << "seeds 7 and 8 gave the same windows";
}

// Prefixes alone are weighted by their sizes; with --split each file gives its own part.
TEST_F(BlendTest, PrefixesAloneWeighBySizeAndSplitCutsEachFile) {
  const std::string a = file_of('a', 1000), b = file_of('b', 3000);
  const auto ds = open_blend(parse_blend("--data-path", {a, b}), DatasetFormat::kText, 256, 1, 9,
                             std::nullopt, SplitPart::kTrain);
  const auto* blend = dynamic_cast<const BlendedDataset*>(ds.get());
  ASSERT_NE(blend, nullptr);
  EXPECT_DOUBLE_EQ(blend->weights()[0], 0.25);
  // A file of a then b; its validation part (the last 10% of tokens) is all b.
  write_bytes(path("ab.txt"), [] {
    std::vector<unsigned char> v(900, 'a');
    v.insert(v.end(), 100, 'b');
    return v;
  }());
  const auto valid =
      open_blend(parse_blend("--data-path", {"0.5", path("ab.txt"), "0.5", b}),
                 DatasetFormat::kText, 256, 1, 9, parse_split("90,10,0"), SplitPart::kValid);
  std::vector<int32_t> x(9);
  for (int i = 0; i < 100; ++i) {
    valid->sample(i, x.data(), 9);
    for (int32_t t : x) ASSERT_EQ(t, 'b') << "sample " << i << " left the validation parts";
  }
}

}  // namespace
}  // namespace tandem::data
