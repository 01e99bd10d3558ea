// Megatron's --split: one data file cut by weight into a training, a validation and a test part,
// over its documents where the file records them (a Megatron index) and over its tokens
// otherwise. Each part is a data set of its own whose samples are windows wholly inside it (Note
// [Window order] within the part), so no token of the validation part is ever trained on.
// Invariants: the parts are contiguous, in the order train, validation, test, and cover the file;
// they are a pure function of the weights and the file.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/file_dataset.h"

namespace tandem::data {

enum class SplitPart : uint8_t { kTrain, kValid, kTest };
// "training", "validation", "test".
const char* split_part_name(SplitPart part);

struct SplitWeights {
  std::string text;              // as given, for messages: "969,30,1"
  std::array<double, 3> weight;  // train, validation, test; each >= 0, their sum > 0
  double of(SplitPart part) const { return weight[static_cast<size_t>(part)]; }
};

// Reads "969,30,1" (or "969/30/1", "969, 30, 1", "969 30 1", any of them in quotes): one to three
// non-negative numbers, the missing ones 0, as Megatron reads --split. Throws tandem::Error naming
// the text and what is valid.
SplitWeights parse_split(const std::string& text);

// Megatron's split indices over `units` documents or tokens: each part gets round(weight / sum
// x units) (ties to even, as Python's round), then every bound after the first moves by the
// rounding's excess so the last is `units`. Part p is [bounds[p], bounds[p + 1]).
std::array<int64_t, 4> split_bounds(const SplitWeights& w, int64_t units);

// Tokens [begin, end) of a file as a data set: sample i is the window the file would give for i
// if it held only those tokens.
class TokenRangeDataset : public Dataset {
 public:
  TokenRangeDataset(std::shared_ptr<const FileTokenDataset> file, int64_t begin, int64_t end,
                    std::string what);
  void sample(int64_t index, int32_t* out, int64_t length) const override;
  int64_t vocab_size() const override { return file_->vocab_size(); }
  std::string describe() const override { return what_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  std::shared_ptr<const FileTokenDataset> file_;
  int64_t begin_, end_;
  std::string what_;
};

// Part `part` of `file` under `w`. Throws tandem::Error naming the split, the part and the file
// when the part holds fewer than `seq_plus_one` tokens (one sample).
std::unique_ptr<TokenRangeDataset> split_dataset(std::shared_ptr<const FileTokenDataset> file,
                                                 const SplitWeights& w, SplitPart part,
                                                 int64_t seq_plus_one);

}  // namespace tandem::data
