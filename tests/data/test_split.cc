// Megatron's --split and the addition task's held-out set. Oracles: split indices worked out by
// hand from Megatron's rule (round each share, ties to even, then move every bound after the
// first by the excess); the tokens written into the files (each part's samples hold only its
// own tokens); and for the held-out set the task's split function (every problem is held out)
// and `tandem generate`'s problem stream.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/addition.h"
#include "data/addition_held_out.h"
#include "data/split.h"
#include "data_files.h"

namespace tandem::data {
namespace {

// A fresh directory per test (data_files.h).
class SplitTest : public FileDatasetTest {};

TEST(Split, ParsesMegatronsForms) {
  EXPECT_EQ(parse_split("969,30,1").weight, (std::array<double, 3>{969, 30, 1}));
  EXPECT_EQ(parse_split("969/30/1").weight, (std::array<double, 3>{969, 30, 1}));
  EXPECT_EQ(parse_split("98, 2").weight, (std::array<double, 3>{98, 2, 0}));
  EXPECT_EQ(parse_split("1").weight, (std::array<double, 3>{1, 0, 0}));
  EXPECT_EQ(parse_split("0.9,0.1,0").weight, (std::array<double, 3>{0.9, 0.1, 0}));
  // A launch script's quoted value arrives with its quotes; Megatron's default has spaces.
  EXPECT_EQ(parse_split("'99,1,0'").weight, (std::array<double, 3>{99, 1, 0}));
  EXPECT_EQ(parse_split("\"99/1/0\"").weight, (std::array<double, 3>{99, 1, 0}));
  EXPECT_EQ(parse_split("969, 30, 1").weight, (std::array<double, 3>{969, 30, 1}));
  EXPECT_EQ(parse_split("99 1  0").weight, (std::array<double, 3>{99, 1, 0}));
  for (const std::string bad :
       {"", "a,b", "1,2,3,4", "0,0,0", "-1,2", "1,,2", "1e999,1", "9x", "''", "1 2 3 4", "1;2"}) {
    expect_error([&] { parse_split(bad); }, {"--split " + bad});
  }
}

TEST(Split, BoundsFollowMegatronsRounding) {
  using B = std::array<int64_t, 4>;
  EXPECT_EQ(split_bounds(parse_split("969,30,1"), 1000), (B{0, 969, 999, 1000}));
  // 3.33 rounds to 3 three times: the missing unit moves every bound after the first by one.
  EXPECT_EQ(split_bounds(parse_split("1,1,1"), 10), (B{0, 4, 7, 10}));
  // Ties to even (Python's round): 2.5 -> 2, 2.5 -> 2, then one unit short.
  EXPECT_EQ(split_bounds(parse_split("1,1"), 5), (B{0, 3, 5, 5}));
  EXPECT_EQ(split_bounds(parse_split("1,1"), 1), (B{0, 1, 1, 1}));
  // A part of weight 0 first: the bound stays at 0 rather than going below it.
  EXPECT_EQ(split_bounds(parse_split("0,1,1"), 3), (B{0, 0, 1, 3}));
  for (int64_t units : {1, 2, 7, 100, 12345}) {
    const B b = split_bounds(parse_split("969,30,1"), units);
    EXPECT_EQ(b[0], 0);
    EXPECT_EQ(b[3], units);
    EXPECT_LE(b[1], b[2]);
    EXPECT_LE(b[2], b[3]);
  }
}

TEST_F(SplitTest, TextPartsHoldOnlyTheirOwnTokens) {
  // 1000 bytes whose value says which tenth of the file they are in.
  std::vector<unsigned char> bytes;
  for (int i = 0; i < 1000; ++i) bytes.push_back(static_cast<unsigned char>('0' + i / 100));
  write_bytes(path("t.txt"), bytes);
  std::shared_ptr<const FileTokenDataset> file =
      open_file_dataset(path("t.txt"), DatasetFormat::kText, 256, 7, 9);
  const SplitWeights w = parse_split("8,1,1");
  const auto train = split_dataset(file, w, SplitPart::kTrain, 9);
  const auto valid = split_dataset(file, w, SplitPart::kValid, 9);
  const auto test = split_dataset(file, w, SplitPart::kTest, 9);
  EXPECT_EQ(std::make_pair(train->begin(), train->end()), std::make_pair(int64_t{0}, int64_t{800}));
  EXPECT_EQ(std::make_pair(valid->begin(), valid->end()),
            std::make_pair(int64_t{800}, int64_t{900}));
  EXPECT_EQ(std::make_pair(test->begin(), test->end()),
            std::make_pair(int64_t{900}, int64_t{1000}));
  EXPECT_NE(valid->describe().find("validation part of --split 8,1,1"), std::string::npos)
      << valid->describe();
  std::set<int32_t> train_seen, valid_seen;
  std::vector<int32_t> row(9);
  for (int64_t i = 0; i < 300; ++i) {  // past one epoch of each part's windows
    train->sample(i, row.data(), 9);
    train_seen.insert(row.begin(), row.end());
    valid->sample(i, row.data(), 9);
    valid_seen.insert(row.begin(), row.end());
  }
  EXPECT_EQ(valid_seen, (std::set<int32_t>{'8'}));
  EXPECT_EQ(train_seen.size(), 8u);
  EXPECT_EQ(train_seen.count('8') + train_seen.count('9'), 0u);
  // The same samples again: a part is a pure function of the file, the weights and the seed.
  const auto again = split_dataset(file, w, SplitPart::kValid, 9);
  std::vector<int32_t> a(9), b(9);
  for (int64_t i = 0; i < 20; ++i) {
    valid->sample(i, a.data(), 9);
    again->sample(i, b.data(), 9);
    EXPECT_EQ(a, b);
  }
}

TEST_F(SplitTest, MegatronFilesSplitByDocument) {
  // Ten documents of 5 tokens (document d holds the id d + 1), stored as 20 sequences: each
  // document is two sequences (3 then 2 tokens), so documents and sequences differ.
  std::vector<unsigned char> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0}, bin;
  put_le(idx, 1, 8);
  put_le(idx, 8, 1);  // uint16
  put_le(idx, 20, 8);
  put_le(idx, 11, 8);
  for (int s = 0; s < 20; ++s) put_le(idx, s % 2 ? 2 : 3, 4);
  for (int s = 0, pointer = 0; s < 20; pointer += (s % 2 ? 2 : 3) * 2, ++s) put_le(idx, pointer, 8);
  for (int d = 0; d <= 10; ++d) put_le(idx, 2 * d, 8);
  for (int d = 0; d < 10; ++d) {
    for (int t = 0; t < 5; ++t) put_le(bin, d + 1, 2);
  }
  write_bytes(path("m.idx"), idx);
  write_bytes(path("m.bin"), bin);
  std::shared_ptr<const FileTokenDataset> file =
      open_file_dataset(path("m"), DatasetFormat::kAuto, 16, 1, 4);
  ASSERT_EQ(file->num_documents(), 10);
  const SplitWeights w = parse_split("7,2,1");
  const auto valid = split_dataset(file, w, SplitPart::kValid, 4);
  EXPECT_EQ(valid->begin(), 35);  // documents [7, 9)
  EXPECT_EQ(valid->end(), 45);
  std::set<int32_t> seen;
  std::vector<int32_t> row(4);
  for (int64_t i = 0; i < 10; ++i) {
    valid->sample(i, row.data(), 4);
    seen.insert(row.begin(), row.end());
  }
  EXPECT_EQ(seen, (std::set<int32_t>{8, 9}));
  EXPECT_EQ(split_dataset(file, w, SplitPart::kTest, 4)->begin(), 45);
  // One document (5 tokens) is too short for a sample of 6.
  expect_error([&] { split_dataset(file, w, SplitPart::kTest, 6); },
               {"--split 7,2,1", "test part", "5 tokens", "documents [9, 10)"});
}

TEST(AdditionHeldOut, SamplesAreHeldOutProblemsAsGenerateDrawsThem) {
  const int digits = 2;
  const AdditionHeldOutDataset held_out(1234, digits);
  const int64_t problem = addition_max_problem_length(digits);  // 10 bytes
  std::set<std::string> seen;
  for (int64_t i = 0; i < 20; ++i) {
    std::vector<int32_t> row(31);
    held_out.sample(i, row.data(), 31);  // 3 whole problems and the start of a fourth
    const std::string text(row.begin(), row.end());
    for (int64_t k = 0; k < 3; ++k) {
      const std::string one =
          text.substr(static_cast<size_t>(k * problem), static_cast<size_t>(problem));
      const uint64_t a = std::stoull(one.substr(0, 2)), b = std::stoull(one.substr(3, 2));
      EXPECT_EQ(one, format_addition_problem(a, b, digits));
      EXPECT_EQ(addition_split(a, b), AdditionSplit::kEval) << one;
      // Sample i holds problems 4i to 4i + 3 of the evaluation stream.
      const AdditionProblem p = make_eval_problem(1234, 4 * i + k, digits);
      EXPECT_EQ(one, p.prompt + p.answer + "\n");
      seen.insert(one);
    }
  }
  EXPECT_GT(seen.size(), 40u);  // the pairs differ (a few may repeat: there are ~1000)
}

}  // namespace
}  // namespace tandem::data
