// Counter-based random numbers: every value is a pure function of (seed, stream, index), so
// initialisation and data order do not depend on the parallel layout or on call order.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace tandem {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A stable 64-bit key for a name (FNV-1a), to derive per-tensor streams.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return h;
}

// Uniform in [0, 1) from the top 53 bits of the i-th draw of stream `key`.
inline double uniform01(uint64_t key, uint64_t i) {
  return static_cast<double>(splitmix64(key ^ splitmix64(i)) >> 11) * 0x1.0p-53;
}

// Standard normal (Box-Muller over two uniforms), the i-th draw of stream `key`.
inline double normal01(uint64_t key, uint64_t i) {
  const double u1 = 1.0 - uniform01(key, 2 * i);  // in (0, 1]
  const double u2 = uniform01(key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace tandem
