// RoPE's rotation of one head, shared by the CPU rope ops and MLA's q, k, v op. Private to
// src/ops/cpu.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/tensor.h"

namespace tandem::ops::cpu {

// cos and sin of position * inv_freq[i], [seq, D/2], formed in double and multiplied by the
// attention factor (YaRN's, 1 otherwise); sin also by sign (-1: the transpose).
template <typename T>
struct RopeTable {
  std::vector<T> cs, sn;
  int64_t half = 0;
  bool interleaved = false;

  RopeTable(const RopeSpec& rope, int64_t head_dim, int64_t seq, double sign)
      : half(head_dim / 2), interleaved(rope.interleaved) {
    const std::vector<double> inv_freq = rope_inv_freq(rope, head_dim);
    const double af = rope_attention_factor(rope);
    cs.resize(static_cast<size_t>(seq * half));
    sn.resize(cs.size());
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t p = 0; p < seq; ++p) {
        const double ang = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
        cs[static_cast<size_t>(p * half + i)] = static_cast<T>(std::cos(ang) * af);
        sn[static_cast<size_t>(p * half + i)] = static_cast<T>(sign * std::sin(ang) * af);
      }
    }
  }

  // out = the rotation of one head x at position pos: rotate_half's pairs (i, i + D/2); with
  // `interleaved`, the forward (sign 1) reads the pairs (2i, 2i + 1) and writes them at
  // (i, i + D/2), and the transpose (sign -1) reads (i, i + D/2) and writes (2i, 2i + 1). out may
  // be x.
  void rotate(T* out, const T* x, int64_t pos, bool forward) const {
    const T* c = cs.data() + pos * half;
    const T* s = sn.data() + pos * half;
    if (!interleaved) {
      for (int64_t i = 0; i < half; ++i) {
        // rotate_half(u) = cat(-u2, u1): out1 = u1 c - u2 s, out2 = u2 c + u1 s.
        const T u1 = x[i], u2 = x[i + half];
        out[i] = u1 * c[i] - u2 * s[i];
        out[i + half] = u2 * c[i] + u1 * s[i];
      }
      return;
    }
    T u[2 * kMaxHalf];
    const int64_t n = 2 * half;
    for (int64_t i = 0; i < n; ++i) u[i] = x[i];
    for (int64_t i = 0; i < half; ++i) {
      const T u1 = forward ? u[2 * i] : u[i], u2 = forward ? u[2 * i + 1] : u[i + half];
      const T o1 = u1 * c[i] - u2 * s[i], o2 = u2 * c[i] + u1 * s[i];
      out[forward ? i : 2 * i] = o1;
      out[forward ? i + half : 2 * i + 1] = o2;
    }
  }

  static constexpr int64_t kMaxHalf = 512;  // interleaved heads up to 1024 columns
};

// Each row's position (Note [Document masking] in data/document_masks.h): positions[r] when
// given (i32 [n], each in [0, seq), checked here), else r % seq. Null when not given.
inline const int32_t* row_positions(const char* op, const Tensor& positions, int64_t n,
                                    int64_t seq) {
  if (!positions.defined()) return nullptr;
  TANDEM_CHECK(positions.dtype() == DType::kI32 && positions.dim() == 1 && positions.size(0) == n,
               op, ": positions must be i32 [", n, "]");
  const int32_t* p = positions.data<int32_t>();
  for (int64_t r = 0; r < n; ++r) {
    TANDEM_CHECK(p[r] >= 0 && p[r] < seq, op, ": positions[", r, "] = ", p[r], " is outside [0, ",
                 seq, ")");
  }
  return p;
}
inline int64_t position_of(const int32_t* pos, int64_t r, int64_t seq) {
  return pos != nullptr ? pos[r] : r % seq;
}

}  // namespace tandem::ops::cpu
