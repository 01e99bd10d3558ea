#include "data/mock.h"

#include "core/error.h"
#include "data/random.h"

namespace tandem::data {

namespace {
constexpr uint64_t kMockStream = 0x6d6f'636b'0000'0001ULL;  // "mock", apart from the other streams
}  // namespace

MockDataset::MockDataset(uint64_t seed, int64_t vocab_size) : seed_(seed), vocab_size_(vocab_size) {
  TANDEM_CHECK(vocab_size >= 1, "mock data needs a vocabulary of at least 1 token, got ",
               vocab_size);
}

void MockDataset::sample(int64_t index, int32_t* out, int64_t length) const {
  CounterRng rng(stream_key(seed_, kMockStream, static_cast<uint64_t>(index)));
  for (int64_t i = 0; i < length; ++i) {
    out[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size_)));
  }
}

std::string MockDataset::describe() const {
  return "mock data: uniformly random tokens in [0, " + std::to_string(vocab_size_) + ")";
}

}  // namespace tandem::data
