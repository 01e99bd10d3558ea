// The synthetic addition task. Oracle: an independent parser of the problem text and uint64
// arithmetic (a + b == the reversed answer read back), plus the split hash for disjointness.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/addition.h"
#include "data/random.h"

namespace tandem::data {
namespace {

std::string sample_text(const AdditionDataset& ds, int64_t index, int64_t length) {
  std::vector<int32_t> tokens(static_cast<size_t>(length), -1);
  ds.sample(index, tokens.data(), length);
  std::string text;
  for (int32_t t : tokens) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 256);
    text.push_back(static_cast<char>(t));
  }
  return text;
}

struct Parsed {
  uint64_t a, b, sum;
  std::string a_text, b_text;
};

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Parses one complete line "a+b=c" (c reversed); fails the test when it does not match.
// (A hand parser: std::regex trips GCC 12's -Wmaybe-uninitialized under the sanitizers.)
Parsed parse_line(const std::string& line) {
  const size_t plus = line.find('+');
  const size_t eq = line.find('=');
  const bool ok = plus != std::string::npos && eq != std::string::npos && plus < eq &&
                  all_digits(line.substr(0, plus)) &&
                  all_digits(line.substr(plus + 1, eq - plus - 1)) &&
                  all_digits(line.substr(eq + 1));
  EXPECT_TRUE(ok) << "line '" << line << "'";
  if (!ok) return {};
  const std::string a = line.substr(0, plus), b = line.substr(plus + 1, eq - plus - 1);
  std::string c = line.substr(eq + 1);
  std::reverse(c.begin(), c.end());
  return {std::stoull(a), std::stoull(b), std::stoull(c), a, b};
}

// The complete lines of a sample (the last piece is cut off unless the sample ends on '\n').
std::vector<std::string> complete_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', begin)) {
    lines.push_back(text.substr(begin, nl - begin));
    begin = nl + 1;
  }
  return lines;
}

TEST(Addition, SameSeedAndIndexGiveSameBytesOthersDiffer) {
  const AdditionDataset ds(7), same(7), other_seed(8);
  EXPECT_EQ(sample_text(ds, 3, 200), sample_text(same, 3, 200));
  EXPECT_EQ(sample_text(ds, 1'000'000'007, 64), sample_text(same, 1'000'000'007, 64));
  EXPECT_NE(sample_text(ds, 3, 200), sample_text(ds, 4, 200));
  EXPECT_NE(sample_text(ds, 3, 200), sample_text(other_seed, 3, 200));
  // Random access: the order in which samples are drawn does not matter.
  const std::string later = sample_text(ds, 99, 100);
  sample_text(ds, 5, 100);
  EXPECT_EQ(sample_text(ds, 99, 100), later);
}

TEST(Addition, ShorterSampleIsPrefixOfLongerOne) {
  const AdditionDataset ds(11);
  const std::string long_text = sample_text(ds, 42, 300);
  for (int64_t n : {1, 5, 13, 129}) EXPECT_EQ(sample_text(ds, 42, n), long_text.substr(0, n));
}

TEST(Addition, EveryCompleteProblemIsCorrectArithmeticWithReversedSum) {
  for (int max_digits : {1, 3, 5}) {
    const AdditionDataset ds(123, max_digits);
    int64_t problems = 0;
    for (int64_t index = 0; index < 50; ++index) {
      const std::string text = sample_text(ds, index, 129);
      ASSERT_TRUE(text[0] >= '0' && text[0] <= '9') << "samples start at a problem boundary";
      for (const std::string& line : complete_lines(text)) {
        const Parsed p = parse_line(line);
        EXPECT_EQ(p.a + p.b, p.sum) << line;
        EXPECT_EQ(p.a_text.size(), static_cast<size_t>(max_digits)) << "padded: " << line;
        EXPECT_EQ(p.b_text.size(), static_cast<size_t>(max_digits)) << "padded: " << line;
        EXPECT_EQ(addition_split(p.a, p.b), AdditionSplit::kTrain) << line;
        EXPECT_EQ(static_cast<int64_t>(line.size()) + 1, addition_max_problem_length(max_digits));
        ++problems;
      }
    }
    EXPECT_GT(problems, 200);
  }
}

// Note [Short operands]: a training operand is uniform below 10^k, k uniform in 0..max_digits
// (k = 0: zero); evaluation operands are uniform below 10^max_digits, mostly full length.
TEST(Addition, TrainingOperandsAreOftenShortEvalOperandsAreUniform) {
  const AdditionDataset ds(5, 3);
  std::vector<int> lengths(4, 0), units(10, 0);
  int total = 0, zeros = 0, nonzero = 0;
  for (int64_t index = 0; index < 200; ++index) {
    for (const std::string& line : complete_lines(sample_text(ds, index, 129))) {
      const Parsed p = parse_line(line);
      for (uint64_t v : {p.a, p.b}) {
        ++lengths[std::to_string(v).size()], ++total;
        if (v == 0) {
          ++zeros;
        } else {
          ++units[v % 10], ++nonzero;
        }
      }
    }
  }
  // P(0) = 1/4 + 1/40 + 1/400 + 1/4000 = 0.28; lengths 2 and 3: 0.25 and 0.225.
  EXPECT_GT(zeros, total / 5);
  EXPECT_LT(zeros, total * 9 / 25);
  for (int len : {2, 3}) {
    EXPECT_GT(lengths[len], total * 4 / 25) << "length " << len;
    EXPECT_LT(lengths[len], total * 8 / 25) << "length " << len;
  }
  for (int d = 1; d < 10; ++d) {
    EXPECT_GT(units[d], nonzero / 20) << "units digit " << d;
    EXPECT_LT(units[d], nonzero / 6) << "units digit " << d;
  }
  int full_length = 0;
  for (int64_t index = 0; index < 200; ++index) {
    const Parsed p = parse_line(make_eval_problem(9, index, 3).prompt + "0000");
    full_length += (p.a >= 100) + (p.b >= 100);
  }
  EXPECT_GT(full_length, 400 * 8 / 10)
      << "eval operands are uniform below 1000 (0.9 of them >= 100)";
}

TEST(Addition, EvalProblemsAreHeldOutAndReproducible) {
  std::set<std::string> prompts;
  for (int64_t index = 0; index < 200; ++index) {
    const AdditionProblem p = make_eval_problem(9, index);
    const AdditionProblem again = make_eval_problem(9, index);
    EXPECT_EQ(p.prompt, again.prompt);
    EXPECT_EQ(p.answer, again.answer);
    ASSERT_FALSE(p.prompt.empty());
    EXPECT_EQ(p.prompt.back(), '=');
    const Parsed parsed = parse_line(p.prompt + p.answer);
    EXPECT_EQ(parsed.a + parsed.b, parsed.sum);
    EXPECT_EQ(addition_split(parsed.a, parsed.b), AdditionSplit::kEval) << p.prompt;
    prompts.insert(p.prompt);
  }
  EXPECT_GT(prompts.size(), 150u) << "eval problems vary";
  // The held-out set is a real fraction of all pairs, not empty and not most of them.
  int held_out = 0;
  for (uint64_t a = 0; a < 100; ++a) {
    for (uint64_t b = 0; b < 100; ++b) held_out += addition_split(a, b) == AdditionSplit::kEval;
  }
  EXPECT_GT(held_out, 700);
  EXPECT_LT(held_out, 1300);
}

TEST(Addition, TrainingSamplesNeverContainAnEvalPair) {
  // 1-digit problems: only 100 pairs, so every one appears many times; the held-out ones never.
  const AdditionDataset ds(3, 1);
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (int64_t index = 0; index < 300; ++index) {
    for (const std::string& line : complete_lines(sample_text(ds, index, 64))) {
      const Parsed p = parse_line(line);
      seen.insert({p.a, p.b});
    }
  }
  int train_pairs = 0;
  for (uint64_t a = 0; a < 10; ++a) {
    for (uint64_t b = 0; b < 10; ++b) {
      const bool is_eval = addition_split(a, b) == AdditionSplit::kEval;
      train_pairs += !is_eval;
      if (is_eval) {
        EXPECT_EQ(seen.count({a, b}), 0u) << a << "+" << b;
      }
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), train_pairs) << "all training pairs appear";
}

TEST(Addition, ScorerNeedsExactAnswerThenNewline) {
  const AdditionProblem p{"123+45=", "861"};
  EXPECT_TRUE(score_addition_completion(p, "861\n"));
  EXPECT_TRUE(score_addition_completion(p, "861\n9+9=81\n"));
  EXPECT_FALSE(score_addition_completion(p, "861"));
  EXPECT_FALSE(score_addition_completion(p, "86\n"));
  EXPECT_FALSE(score_addition_completion(p, "8610\n"));
  EXPECT_FALSE(score_addition_completion(p, " 861\n"));
  EXPECT_FALSE(score_addition_completion(p, "168\n"));
  EXPECT_FALSE(score_addition_completion(p, ""));
}

TEST(Addition, FormatHelpers) {
  EXPECT_EQ(reversed_digits(168, 3), "861");
  EXPECT_EQ(reversed_digits(168, 4), "8610");
  EXPECT_EQ(reversed_digits(0, 2), "00");
  EXPECT_EQ(reversed_digits(1000, 4), "0001");
  EXPECT_EQ(format_addition_problem(123, 45, 3), "123+045=8610\n");
  EXPECT_EQ(format_addition_problem(999, 999, 3), "999+999=8991\n");
  EXPECT_EQ(addition_max_problem_length(3), 13);
  EXPECT_EQ(static_cast<int64_t>(format_addition_problem(1, 2, 3).size()),
            addition_max_problem_length(3));
}

TEST(Addition, InvalidMaxDigitsIsAnError) {
  for (int bad : {0, -1, kAdditionMaxDigitsLimit + 1}) {
    try {
      AdditionDataset ds(1, bad);
      FAIL() << "max_digits " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("max_digits " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(make_eval_problem(1, 0, 0), Error);
  const AdditionDataset ds(1, kAdditionMaxDigitsLimit);
  for (const std::string& line : complete_lines(sample_text(ds, 0, 400))) {
    const Parsed p = parse_line(line);
    EXPECT_EQ(p.a + p.b, p.sum);
  }
}

TEST(Random, PermuteIndexIsABijection) {
  for (uint64_t n : {1ULL, 2ULL, 3ULL, 5ULL, 16ULL, 17ULL, 1000ULL, 4097ULL}) {
    std::vector<bool> hit(n, false);
    for (uint64_t x = 0; x < n; ++x) {
      const uint64_t y = permute_index(x, n, 0xabcdef + n);
      ASSERT_LT(y, n);
      EXPECT_FALSE(hit[y]) << "n " << n << " repeats " << y;
      hit[y] = true;
    }
  }
}

}  // namespace
}  // namespace tandem::data
