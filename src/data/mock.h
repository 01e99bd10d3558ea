// Mock data: uniformly random token ids, the input of Megatron's --mock-data and of
// torch_peer.py's default. For benchmarks, where the tokens' content does not matter but their
// spread does: the untrained router sends random tokens to all experts, where the built-in
// addition task's dozen distinct bytes send every row of a layer to the same few experts.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace tandem::data {

class MockDataset : public Dataset {
 public:
  // vocab_size >= 1; sample i is a pure function of (seed, i).
  MockDataset(uint64_t seed, int64_t vocab_size);

  void sample(int64_t index, int32_t* out, int64_t length) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string describe() const override;

 private:
  uint64_t seed_;
  int64_t vocab_size_;
};

}  // namespace tandem::data
