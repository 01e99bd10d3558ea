// --moe-layer-freq's values: a number N, a 0/1 list, or Megatron-LM's Python expression of one
// (moe_layer_pattern in core/model_config.h).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace tandem {

namespace {

// Note [Layer patterns as Python lists]: Megatron-LM evaluates a --moe-layer-freq that is not a
// number as a Python expression, and its recipes write ([0]*3+[1]*58). This reads that part of
// Python: lists of integers, `+` joining them, `*` repeating them (either side), parentheses.
class PatternParser {
 public:
  explicit PatternParser(std::string_view text) : text_(text) {}
  // The list, or the reason the text is not one.
  std::vector<int64_t> parse() {
    std::vector<int64_t> out = sum();
    skip();
    if (pos_ != text_.size()) fail("unexpected '" + std::string(1, text_[pos_]) + "'");
    return out;
  }

 private:
  static constexpr int64_t kMostEntries = int64_t{1} << 20;
  [[noreturn]] void fail(const std::string& why) { throw std::invalid_argument(why); }
  void skip() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  bool take(char c) {
    skip();
    if (pos_ < text_.size() && text_[pos_] == c) return ++pos_, true;
    return false;
  }
  bool at_digit() {
    skip();
    return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9';
  }
  int64_t number() {
    if (!at_digit()) fail("a number is missing");
    int64_t n = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      n = n * 10 + (text_[pos_++] - '0');
      if (n > kMostEntries) fail("a number is above " + std::to_string(kMostEntries));
    }
    return n;
  }
  static std::vector<int64_t> repeat(const std::vector<int64_t>& v, int64_t times) {
    if (static_cast<int64_t>(v.size()) * times > kMostEntries) {
      throw std::invalid_argument("the list is longer than " + std::to_string(kMostEntries));
    }
    std::vector<int64_t> out;
    for (int64_t t = 0; t < times; ++t) out.insert(out.end(), v.begin(), v.end());
    return out;
  }
  std::vector<int64_t> sum() {
    std::vector<int64_t> out = product();
    while (take('+')) {
      const std::vector<int64_t> more = product();
      if (static_cast<int64_t>(out.size() + more.size()) > kMostEntries)
        fail("the list is too long");
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }
  std::vector<int64_t> product() {
    int64_t times = 1;
    while (at_digit()) {  // 3*[0]
      times *= number();
      if (!take('*')) fail("a number stands where a list should");
    }
    std::vector<int64_t> out = atom();
    while (take('*')) out = repeat(out, number());  // [0]*3
    return repeat(out, times);
  }
  std::vector<int64_t> atom() {
    if (take('(')) {
      std::vector<int64_t> out = sum();
      if (!take(')')) fail("a ( is not closed");
      return out;
    }
    if (!take('[')) fail("a list [...] is expected");
    std::vector<int64_t> out;
    if (take(']')) return out;
    do {
      if (take(']')) return out;  // a trailing comma
      out.push_back(number());
      if (static_cast<int64_t>(out.size()) > kMostEntries) fail("the list is too long");
    } while (take(','));
    if (!take(']')) fail("a [ is not closed");
    return out;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<bool> moe_layer_pattern(const std::string& given, int64_t num_layers) {
  const auto bad = [&](const std::string& why) -> Error {
    return Error(detail::concat("--moe-layer-freq ", given, " is invalid: ", why,
                                "; valid: an integer N >= 1 (layer l has experts when l % N == 0) "
                                "or a list of 0 and 1, one per layer, like [0,1,1,1] or, as "
                                "Megatron-LM's Python, ([0]*1+[1]*3)"));
  };
  // A script's quotes kept inside the value ("--moe-layer-freq '${FREQ}'" in a string that the
  // shell splits later) are a Python string's to Megatron-LM: read what they hold.
  std::string freq = given;
  if (freq.size() >= 2 && (freq.front() == '\'' || freq.front() == '"') &&
      freq.back() == freq.front()) {
    freq = freq.substr(1, freq.size() - 2);
  }
  std::vector<bool> moe;
  if (!freq.empty() &&
      (freq.front() == '[' || freq.front() == '(' || freq.find('*') != std::string::npos)) {
    std::vector<int64_t> list;
    try {
      list = PatternParser(freq).parse();
    } catch (const std::invalid_argument& e) {
      throw bad(e.what());
    }
    for (const int64_t v : list) {
      if (v != 0 && v != 1) throw bad(detail::concat("'", v, "' is not 0 or 1"));
      moe.push_back(v == 1);
    }
    if (static_cast<int64_t>(moe.size()) != num_layers) {
      throw bad(detail::concat("the list has ", moe.size(), " entries for ", num_layers,
                               " layers (--num-layers)"));
    }
    return moe;
  }
  int64_t n = 0;
  for (const char ch : freq) {
    if (ch < '0' || ch > '9' || n > (int64_t{1} << 40)) throw bad("it is not a whole number");
    n = n * 10 + (ch - '0');
  }
  if (freq.empty() || n < 1) throw bad("it is not an integer >= 1");
  for (int64_t l = 0; l < num_layers; ++l) moe.push_back(l % n == 0);
  return moe;
}

}  // namespace tandem
