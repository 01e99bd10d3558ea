// Token datasets: random access to fixed-length samples, deterministic from the seed, so a
// training position can be resumed and every parallel layout sees the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tandem::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Writes sample `index` (any index >= 0; the order behind it is fixed by the seed): `length`
  // token ids, each in [0, vocab_size). For training, length = seq + 1 (inputs and shifted
  // targets).
  virtual void sample(int64_t index, int32_t* out, int64_t length) const = 0;
  // One past the largest token id the dataset can produce.
  virtual int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;
};

}  // namespace tandem::data
