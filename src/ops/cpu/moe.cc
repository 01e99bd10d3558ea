// CPU token permutation by expert (dropless, or with an expert capacity: Note [Expert capacity]
// in core/footprint.h) and the combine. Every loop runs in a fixed order: results are bitwise
// reproducible. The routers are in router.cc.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"

namespace tandem::ops::cpu {

using cpu::expect;

// ---- token permutation ----

namespace {

// inv[slot] = the row of the expert-sorted order holding slot (-1: none, a dropped slot), for
// perm: [rows] of entries in [-1, slots), each slot at most once; throws otherwise, and when an
// entry at or past `used` (the rows the caller's tensor has) is not -1.
std::vector<int32_t> invert_perm(const char* op, const Tensor& perm, int64_t slots, int64_t used) {
  cpu::expect_rank(op, "perm", perm, 1);
  expect(op, "perm", perm, DType::kI32, {perm.size(0)});
  TANDEM_CHECK(used <= perm.size(0), op, ": ", used, " rows, but perm has ", perm.size(0));
  const int32_t* pp = perm.data<int32_t>();
  std::vector<int32_t> inv(static_cast<size_t>(slots), -1);
  for (int64_t i = 0; i < perm.size(0); ++i) {
    if (pp[i] < 0) continue;
    TANDEM_CHECK(pp[i] < slots && i < used, op, ": perm entry ", pp[i], " at row ", i,
                 " is outside [-1, ", slots, ") or past the ", used, " rows");
    int32_t& row = inv[static_cast<size_t>(pp[i])];
    TANDEM_CHECK(row < 0, op, ": perm holds slot ", pp[i], " twice (rows ", row, " and ", i, ")");
    row = static_cast<int32_t>(i);
  }
  return inv;
}

// Each expert's place (Note [Expert placement]), or the expert itself; checks expert_slot.
std::vector<int32_t> expert_places(const char* op, const Tensor& expert_slot, int64_t e) {
  std::vector<int32_t> key(static_cast<size_t>(e));
  for (int64_t x = 0; x < e; ++x) key[static_cast<size_t>(x)] = static_cast<int32_t>(x);
  if (!expert_slot.defined()) return key;
  expect(op, "expert_slot", expert_slot, DType::kI32, {e});
  const int32_t* ps = expert_slot.data<int32_t>();
  cpu::expect_indices(op, "expert place", ps, e, e);
  std::vector<bool> seen(static_cast<size_t>(e), false);
  for (int64_t x = 0; x < e; ++x) {
    TANDEM_CHECK(!seen[static_cast<size_t>(ps[x])], op, ": expert_slot holds place ", ps[x],
                 " twice; it must be a permutation of [0, ", e, ")");
    seen[static_cast<size_t>(ps[x])] = true;
    key[static_cast<size_t>(x)] = ps[x];
  }
  return key;
}

// Megatron-LM's token order, position t of every sequence before t + 1: row n of sequences of
// `seq` rows (n rows in all) is token (n % seq) * (n / seq) + n / seq.
int64_t position_order(int64_t row, int64_t rows, int64_t seq) {
  return (row % seq) * (rows / seq) + row / seq;
}

// Marks the slots of `slots` (one expert's, in flat order) past the capacity as dropped:
// keeps the `capacity` largest weights (probs) or earliest positions, ties to the earlier
// position.
template <typename T>
void drop_past_capacity(std::vector<char>& dropped, const std::vector<int32_t>& slots, const T* w,
                        int64_t n, int64_t k, const MoeCapacity& cap) {
  std::vector<int32_t> order = slots;
  auto pos = [&](int32_t s) { return position_order(s / k, n, cap.seq); };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (cap.policy == TokenDropPolicy::kProbs && w[a] != w[b]) return w[a] > w[b];
    return pos(a) < pos(b);
  });
  for (size_t i = static_cast<size_t>(cap.capacity); i < order.size(); ++i) {
    dropped[static_cast<size_t>(order[i])] = 1;
  }
}

}  // namespace

void moe_permutation(const Tensor& perm, const Tensor& counts, const Tensor& topk_idx,
                     const Tensor& topk_w, int64_t num_experts, const Tensor& expert_slot,
                     const MoeCapacity& cap) {
  const char* op = "moe_permutation";
  cpu::expect_at_least(op, "num_experts", num_experts, 1);
  cpu::expect_rank(op, "topk_idx", topk_idx, 2);
  const int64_t n = topk_idx.size(0), k = topk_idx.size(1), nk = n * k;
  const int64_t c = cap.capacity;
  cpu::expect_at_least(op, "capacity", c, 0);
  const int64_t rows = c > 0 && cap.pad ? c * num_experts : nk;
  expect(op, "topk_idx", topk_idx, DType::kI32, {n, k});
  expect(op, "perm", perm, DType::kI32, {rows});
  expect(op, "counts", counts, DType::kI32, {num_experts});
  const int32_t* pi = topk_idx.data<int32_t>();
  cpu::expect_indices(op, "expert id", pi, nk, num_experts);
  const std::vector<int32_t> key = expert_places(op, expert_slot, num_experts);
  // Each place's slots in flat order (token, then slot).
  std::vector<std::vector<int32_t>> by_place(static_cast<size_t>(num_experts));
  for (int64_t s = 0; s < nk; ++s) {
    by_place[static_cast<size_t>(key[static_cast<size_t>(pi[s])])].push_back(
        static_cast<int32_t>(s));
  }
  std::vector<char> dropped(static_cast<size_t>(nk), 0);
  if (c > 0) {
    cpu::expect_at_least(op, "seq", cap.seq, 1);
    TANDEM_CHECK(n % cap.seq == 0, op, ": ", n, " tokens are not whole sequences of ", cap.seq);
    if (cap.policy == TokenDropPolicy::kProbs) {
      expect(op, "topk_w", topk_w, cpu::float_dtype(op, "topk_w", topk_w, 2), {n, k});
    }
    for (const std::vector<int32_t>& slots : by_place) {
      if (static_cast<int64_t>(slots.size()) <= c) continue;
      if (cap.policy == TokenDropPolicy::kPosition) {
        drop_past_capacity(dropped, slots, static_cast<const float*>(nullptr), n, k, cap);
        continue;
      }
      cpu::dispatch_float(topk_w.dtype(), [&](auto tag) {
        using T = decltype(tag);
        drop_past_capacity(dropped, slots, topk_w.data<T>(), n, k, cap);
      });
    }
  }
  int32_t* pp = perm.data<int32_t>();
  int32_t* pc = counts.data<int32_t>();
  int64_t row = 0;
  for (int64_t p = 0; p < num_experts; ++p) {
    const int64_t first = row;
    for (const int32_t s : by_place[static_cast<size_t>(p)]) {
      if (!dropped[static_cast<size_t>(s)]) pp[row++] = s;
    }
    if (c > 0 && cap.pad) {
      while (row < first + c) pp[row++] = -1;
    }
    pc[p] = static_cast<int32_t>(row - first);
  }
  while (row < rows) pp[row++] = -1;  // the dropped slots' rows, unsent
}

void permute_forward(const Tensor& out, const Tensor& x, const Tensor& perm, int64_t k) {
  const char* op = "permute_forward";
  const DType dt = cpu::float_dtype(op, "x", x, 2);
  cpu::expect_at_least(op, "k", k, 1);
  const int64_t n = x.size(0), h = x.size(1), rows = perm.numel();
  expect(op, "out", out, dt, {rows, h});
  invert_perm(op, perm, n * k, rows);  // validates perm
  const int32_t* pp = perm.data<int32_t>();
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < rows; ++i) {
      const T* src = pp[i] >= 0 ? px + (pp[i] / k) * h : nullptr;
      for (int64_t c = 0; c < h; ++c) po[i * h + c] = src ? src[c] : T(0);
    }
  });
}

void permute_backward(const Tensor& dx, const Tensor& dout, const Tensor& perm, int64_t k,
                      Accumulate acc) {
  const char* op = "permute_backward";
  const DType dt = cpu::float_dtype(op, "dx", dx, 2);
  cpu::expect_at_least(op, "k", k, 1);
  const int64_t n = dx.size(0), h = dx.size(1);
  cpu::expect_rank(op, "dout", dout, 2);
  expect(op, "dout", dout, dt, {dout.size(0), h});
  const std::vector<int32_t> inv = invert_perm(op, perm, n * k, dout.size(0));
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pd = dout.data<T>();
    T* px = dx.data<T>();
    // Each token sums its kept rows in slot order (fixed, so reproducible).
    for (int64_t t = 0; t < n; ++t) {
      T* dst = px + t * h;
      if (acc == Accumulate::kOverwrite) {
        for (int64_t c = 0; c < h; ++c) dst[c] = T(0);
      }
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = inv[static_cast<size_t>(t * k + j)];
        if (r < 0) continue;
        const T* src = pd + r * h;
        for (int64_t c = 0; c < h; ++c) dst[c] += src[c];
      }
    }
  });
}

void copy_row_blocks(const Tensor& out, const Tensor& in, const std::vector<RowBlock>& blocks) {
  const char* op = "copy_row_blocks";
  TANDEM_CHECK(out.device() == Device::kCPU && in.device() == Device::kCPU, op,
               ": out and in must both be on the CPU");
  const int64_t row_bytes = check_row_blocks(op, out, in, blocks);
  auto* dst = static_cast<std::byte*>(out.raw_data());
  const auto* src = static_cast<const std::byte*>(in.raw_data());
  for (const RowBlock& b : blocks) {
    if (b.rows == 0) continue;
    std::memcpy(dst + b.to * row_bytes, src + b.from * row_bytes,
                static_cast<size_t>(b.rows * row_bytes));
  }
}

void combine_forward(const Tensor& out, const Tensor& y, const Tensor& perm, const Tensor& topk_w) {
  const char* op = "combine_forward";
  const DType dt = cpu::float_dtype(op, "out", out, 2);
  cpu::float_dtype(op, "topk_w", topk_w, 2);
  const int64_t n = out.size(0), h = out.size(1), k = topk_w.size(1);
  expect(op, "topk_w", topk_w, dt, {n, k});
  cpu::expect_rank(op, "y", y, 2);
  expect(op, "y", y, dt, {y.size(0), h});
  const std::vector<int32_t> inv = invert_perm(op, perm, n * k, y.size(0));
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *py = y.data<T>(), *pw = topk_w.data<T>();
    T* po = out.data<T>();
    for (int64_t t = 0; t < n; ++t) {
      T* dst = po + t * h;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = inv[static_cast<size_t>(t * k + j)];
        if (r < 0) continue;  // dropped
        const T w = pw[t * k + j];
        const T* src = py + r * h;
        for (int64_t c = 0; c < h; ++c) dst[c] += w * src[c];
      }
    }
  });
}

void combine_backward(const Tensor& dy, const Tensor& dtopk_w, const Tensor& dout, const Tensor& y,
                      const Tensor& perm, const Tensor& topk_w) {
  const char* op = "combine_backward";
  const DType dt = cpu::float_dtype(op, "dout", dout, 2);
  cpu::float_dtype(op, "topk_w", topk_w, 2);
  const int64_t n = dout.size(0), h = dout.size(1), k = topk_w.size(1);
  expect(op, "topk_w", topk_w, dt, {n, k});
  expect(op, "dtopk_w", dtopk_w, dt, {n, k});
  cpu::expect_rank(op, "y", y, 2);
  const int64_t rows = y.size(0);
  expect(op, "y", y, dt, {rows, h});
  expect(op, "dy", dy, dt, {rows, h});
  invert_perm(op, perm, n * k, rows);  // validates perm: each slot's dtopk_w is written once
  const int32_t* pp = perm.data<int32_t>();
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *pd = dout.data<T>(), *py = y.data<T>(), *pw = topk_w.data<T>();
    T *pdy = dy.data<T>(), *pdw = dtopk_w.data<T>();
    std::fill(pdw, pdw + n * k, T(0));  // a dropped slot's weight has no gradient
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t slot = pp[i];
      if (slot < 0) {  // padding: its output counts for nothing
        std::fill(pdy + i * h, pdy + (i + 1) * h, T(0));
        continue;
      }
      const T* d = pd + (slot / k) * h;
      const T* yr = py + i * h;
      const T w = pw[slot];
      double dot = 0;
      for (int64_t c = 0; c < h; ++c) {
        dot += static_cast<double>(d[c]) * yr[c];
        pdy[i * h + c] = w * d[c];
      }
      pdw[slot] = static_cast<T>(dot);
    }
  });
}

}  // namespace tandem::ops::cpu
