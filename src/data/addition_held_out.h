// The built-in addition task's validation set: the text of its held-out problems, the pairs that
// training never draws (data/addition.h, AdditionSplit::kEval), laid out as the training samples
// are: consecutive problems from a problem boundary, the last one cut off at the end. Sample i
// holds problems i * k to i * k + k - 1 of make_eval_problem's stream, k the most problems a
// sample can hold, so samples never share a problem and the first are the problems `tandem
// generate` scores first (for the same seed).
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace tandem::data {

class AdditionHeldOutDataset : public Dataset {
 public:
  // max_digits in [1, kAdditionMaxDigitsLimit] (data/addition.h).
  AdditionHeldOutDataset(uint64_t seed, int max_digits);

  void sample(int64_t index, int32_t* out, int64_t length) const override;
  int64_t vocab_size() const override { return 256; }
  std::string describe() const override;

 private:
  uint64_t seed_;
  int max_digits_;
};

}  // namespace tandem::data
