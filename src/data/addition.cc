// The synthetic addition task: problem drawing (counter-based, rejection into a split), text
// layout and scoring. See addition.h for the format and why the sum is reversed.
#include "data/addition.h"

#include <algorithm>

#include "core/error.h"
#include "data/random.h"

namespace tandem::data {
namespace {

// Stream ids keep training samples, evaluation problems and the split hash unrelated.
constexpr uint64_t kTrainStream = 0x7472'6169'6e00'0001ULL;
constexpr uint64_t kEvalStream = 0x6576'616c'0000'0002ULL;
constexpr uint64_t kSplitKey = 0x7370'6c69'7400'0003ULL;
constexpr uint64_t kEvalOneIn = 10;

uint64_t pow10(int d) {
  uint64_t p = 1;
  for (int i = 0; i < d; ++i) p *= 10;
  return p;
}

// A training operand: uniform below 10^k, k uniform in [0, max_digits] (k = 0: the operand is 0)
// (Note [Short operands]). An evaluation operand: uniform below 10^max_digits.
uint64_t draw_operand(CounterRng& rng, int max_digits, AdditionSplit split) {
  const int k = split == AdditionSplit::kTrain
                    ? static_cast<int>(rng.below(static_cast<uint64_t>(max_digits) + 1))
                    : max_digits;
  return rng.below(pow10(k));
}

// v in decimal, zero-padded on the left to `width` digits.
std::string padded(uint64_t v, int width) {
  std::string s = std::to_string(v);
  return std::string(static_cast<size_t>(std::max(0, width - static_cast<int>(s.size()))), '0') + s;
}

struct Operands {
  uint64_t a;
  uint64_t b;
};

// Draws pairs until one falls in `split` (about 9 in 10 uniform pairs do for training, 1 in 10
// for eval).
Operands draw_operands(CounterRng& rng, int max_digits, AdditionSplit split) {
  while (true) {
    const uint64_t a = draw_operand(rng, max_digits, split);
    const uint64_t b = draw_operand(rng, max_digits, split);
    if (addition_split(a, b) == split) return {a, b};
  }
}

void check_max_digits(int max_digits) {
  TANDEM_CHECK(max_digits >= 1 && max_digits <= kAdditionMaxDigitsLimit, "addition max_digits ",
               max_digits, " is invalid: it must be between 1 and ", kAdditionMaxDigitsLimit);
}

}  // namespace

AdditionSplit addition_split(uint64_t a, uint64_t b) {
  const uint64_t h = splitmix64(splitmix64(a ^ kSplitKey) + b);
  return h % kEvalOneIn == 0 ? AdditionSplit::kEval : AdditionSplit::kTrain;
}

std::string reversed_digits(uint64_t v, int width) {
  std::string s = padded(v, width);
  std::reverse(s.begin(), s.end());
  return s;
}

std::string format_addition_problem(uint64_t a, uint64_t b, int max_digits) {
  return padded(a, max_digits) + "+" + padded(b, max_digits) + "=" +
         reversed_digits(a + b, max_digits + 1) + "\n";
}

int64_t addition_max_problem_length(int max_digits) {
  check_max_digits(max_digits);
  // a, b: max_digits each; the sum: max_digits + 1; '+', '=', '\n'.
  return 3 * static_cast<int64_t>(max_digits) + 4;
}

AdditionDataset::AdditionDataset(uint64_t seed, int max_digits)
    : seed_(seed), max_digits_(max_digits) {
  check_max_digits(max_digits);
}

void AdditionDataset::sample(int64_t index, int32_t* out, int64_t length) const {
  TANDEM_CHECK(index >= 0, "addition sample index ", index, " is invalid: it must be >= 0");
  TANDEM_CHECK(length >= 0, "addition sample length ", length, " is invalid: it must be >= 0");
  CounterRng rng(stream_key(seed_, kTrainStream, static_cast<uint64_t>(index)));
  int64_t filled = 0;
  while (filled < length) {
    const Operands p = draw_operands(rng, max_digits_, AdditionSplit::kTrain);
    const std::string text = format_addition_problem(p.a, p.b, max_digits_);
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(text.size()), length - filled);
    for (int64_t i = 0; i < n; ++i) out[filled + i] = static_cast<unsigned char>(text[i]);
    filled += n;
  }
}

std::string AdditionDataset::describe() const {
  return "synthetic addition (max_digits " + std::to_string(max_digits_) + ", seed " +
         std::to_string(seed_) +
         ", zero-padded operands, often short in training, reversed sums, byte tokens)";
}

AdditionProblem make_eval_problem(uint64_t seed, int64_t index, int max_digits) {
  check_max_digits(max_digits);
  TANDEM_CHECK(index >= 0, "addition eval index ", index, " is invalid: it must be >= 0");
  CounterRng rng(stream_key(seed, kEvalStream, static_cast<uint64_t>(index)));
  const Operands p = draw_operands(rng, max_digits, AdditionSplit::kEval);
  return {padded(p.a, max_digits) + "+" + padded(p.b, max_digits) + "=",
          reversed_digits(p.a + p.b, max_digits + 1)};
}

bool score_addition_completion(const AdditionProblem& problem, std::string_view completion) {
  const size_t newline = completion.find('\n');
  if (newline == std::string_view::npos) return false;
  return completion.substr(0, newline) == problem.answer;
}

}  // namespace tandem::data
