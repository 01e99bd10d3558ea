// Counter-based randomness for datasets: every draw is a pure function of (key, counter), so any
// sample can be produced alone, in any order, on any rank, and is the same on every run.
#pragma once

#include <cstdint>

namespace tandem::data {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A key for the stream `stream` of `seed` at position `index`; different (seed, stream, index)
// triples give unrelated keys.
constexpr uint64_t stream_key(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) + index);
}

// Uniform in [0, n) for n >= 1, by Lemire's multiply-shift; the bias is below n / 2^64.
inline uint64_t uniform_below(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
}

// Draws r_0, r_1, ... with r_i = splitmix64(key + i * golden): the state is only a counter.
class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}
  uint64_t next() { return splitmix64(key_ ^ splitmix64(counter_++)); }
  uint64_t below(uint64_t n) { return uniform_below(next(), n); }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// A pseudo-random permutation of [0, n) evaluated at x, for n >= 1 and x in [0, n): a 4-round
// Feistel network on the smallest even number of bits covering n, cycle-walked back into
// range (each walk stays in x's cycle, so the map is a bijection of [0, n)). Expected < 4 walks.
inline uint64_t permute_index(uint64_t x, uint64_t n, uint64_t key) {
  int half = 1;
  while (half < 32 && (uint64_t{1} << (2 * half)) < n) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  do {
    uint64_t left = x >> half;
    uint64_t right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = splitmix64(key ^ (right + (round << 60))) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

}  // namespace tandem::data
