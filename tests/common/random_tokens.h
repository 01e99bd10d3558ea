// A data set of uniformly random token ids, keyed by the sample index: the shared test input
// where the content does not matter, only that every run and layout reads the same tokens.
#pragma once

#include <cstdint>
#include <string>

#include "core/rng.h"
#include "data/dataset.h"

namespace tandem::testing {

class RandomTokens : public data::Dataset {
 public:
  explicit RandomTokens(int64_t vocab) : vocab_(vocab) {}
  void sample(int64_t index, int32_t* out, int64_t length) const override {
    for (int64_t i = 0; i < length; ++i) {
      out[i] = static_cast<int32_t>(uniform01(static_cast<uint64_t>(index) + 77, i) * vocab_);
    }
  }
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return "random tokens"; }

 private:
  int64_t vocab_;
};

}  // namespace tandem::testing
