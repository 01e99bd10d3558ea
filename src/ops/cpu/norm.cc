// CPU RMSNorm and rotary position embedding (HF rotate_half form, docs/model.md). Row reductions
// run in double and in a fixed order, so results are bitwise reproducible.
#include <cmath>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/rope.h"

namespace tandem::ops::cpu {

using cpu::dispatch_float;
using cpu::expect;

// ---- rmsnorm ----

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& g,
                     double eps) {
  const char* op = "rmsnorm_forward";
  const DType dt = cpu::float_dtype(op, "x", x, 2);
  const int64_t n = x.size(0), h = x.size(1);
  expect(op, "g", g, dt, {h});
  expect(op, "y", y, dt, {n, h});
  expect(op, "rstd", rstd, dt, {n});
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    T* py = y.data<T>();
    T* pr = rstd.data<T>();
    for (int64_t r = 0; r < n; ++r) {
      const T* xr = px + r * h;
      double ss = 0;
      for (int64_t c = 0; c < h; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(h) + eps));
      pr[r] = rs;
      T* yr = py + r * h;
      for (int64_t c = 0; c < h; ++c) yr[c] = xr[c] * rs * pg[c];
    }
  });
}

// With r = rstd: dx_c = r * g_c * dy_c - r^3 / H * x_c * sum_i dy_i g_i x_i;
// dg_c = sum over rows of dy_c * x_c * r.
void rmsnorm_backward(const Tensor& dx, const Tensor& dg, const Tensor& dy, const Tensor& x,
                      const Tensor& g, const Tensor& rstd, Accumulate acc_dx) {
  const char* op = "rmsnorm_backward";
  const DType dt = cpu::float_dtype(op, "x", x, 2);
  const int64_t n = x.size(0), h = x.size(1);
  expect(op, "g", g, dt, {h});
  expect(op, "dg", dg, dt, {h});
  expect(op, "dy", dy, dt, {n, h});
  expect(op, "dx", dx, dt, {n, h});
  expect(op, "rstd", rstd, dt, {n});
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *pg = g.data<T>(), *pdy = dy.data<T>(), *pr = rstd.data<T>();
    T* pdx = dx.data<T>();
    std::vector<double> dg_sum(static_cast<size_t>(h), 0.0);  // rows summed in double, then added
    const bool add = acc_dx == Accumulate::kAdd;
    for (int64_t r = 0; r < n; ++r) {
      const T *xr = px + r * h, *dyr = pdy + r * h;
      T* dxr = pdx + r * h;
      double dot = 0;
      for (int64_t c = 0; c < h; ++c) dot += static_cast<double>(dyr[c]) * pg[c] * xr[c];
      const T rs = pr[r];
      const T coef = static_cast<T>(dot * rs * rs * rs / static_cast<double>(h));
      // dy and x are read before dx is written at each c, so dx may alias dy.
      for (int64_t c = 0; c < h; ++c) {
        dg_sum[static_cast<size_t>(c)] += static_cast<double>(dyr[c]) * xr[c] * rs;
        const T d = dyr[c] * pg[c] * rs - coef * xr[c];
        dxr[c] = add ? dxr[c] + d : d;
      }
    }
    T* pdg = dg.data<T>();
    for (int64_t c = 0; c < h; ++c) pdg[c] += static_cast<T>(dg_sum[static_cast<size_t>(c)]);
  });
}

// ---- rope ----

namespace {

// out = rotation of x by +angle (sign 1, the forward) or -angle (sign -1, its transpose, the
// backward). x, out: [N, heads * D]; row n at position n % seq. out may alias x.
void rope_apply(const char* op, const Tensor& out, const Tensor& x, int64_t seq, int64_t heads,
                int64_t head_dim, const RopeSpec& rope, double sign,
                const Tensor& positions = Tensor()) {
  const DType dt = cpu::float_dtype(op, "x", x, 2);
  cpu::expect_at_least(op, "seq", seq, 1);
  cpu::expect_at_least(op, "heads", heads, 1);
  cpu::expect_at_least(op, "head_dim", head_dim, 2);
  TANDEM_CHECK(head_dim % 2 == 0, op, ": head_dim ", head_dim, " must be even");
  TANDEM_CHECK(x.size(1) == heads * head_dim, op, ": x has ", x.size(1),
               " columns; expected heads * head_dim = ", heads * head_dim);
  expect(op, "out", out, dt, x.shape());
  const int64_t n = x.size(0), width = heads * head_dim;
  const int32_t* pos = row_positions(op, positions, n, seq);
  TANDEM_CHECK(!rope.interleaved || head_dim <= 2 * RopeTable<float>::kMaxHalf, op,
               ": interleaved head_dim ", head_dim, " is above ", 2 * RopeTable<float>::kMaxHalf);
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const RopeTable<T> table(rope, head_dim, seq, sign);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        table.rotate(po + r * width + hd * head_dim, px + r * width + hd * head_dim,
                     position_of(pos, r, seq), sign > 0);
      }
    }
  });
}

}  // namespace

void rope_forward(const Tensor& out, const Tensor& x, int64_t seq, int64_t heads, int64_t head_dim,
                  const RopeSpec& rope) {
  rope_apply("rope_forward", out, x, seq, heads, head_dim, rope, 1.0);
}

void rope_backward(const Tensor& dx, const Tensor& dy, int64_t seq, int64_t heads, int64_t head_dim,
                   const RopeSpec& rope) {
  rope_apply("rope_backward", dx, dy, seq, heads, head_dim, rope, -1.0);
}

namespace {

// q and k, in place, one after the other (one launch matters on the GPU only). k is checked
// before q is written.
void rope_apply_qk(const char* op, const Tensor& q, const Tensor& k, int64_t seq, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, const RopeSpec& rope, double sign,
                   const Tensor& positions) {
  const DType dt = cpu::float_dtype(op, "q", q, 2);
  cpu::expect_at_least(op, "kv_heads", kv_heads, 1);
  expect(op, "k", k, dt, {q.size(0), kv_heads * head_dim});
  rope_apply(op, q, q, seq, heads, head_dim, rope, sign, positions);
  rope_apply(op, k, k, seq, kv_heads, head_dim, rope, sign, positions);
}

}  // namespace

void rope_forward_qk(const Tensor& q, const Tensor& k, int64_t seq, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, const RopeSpec& rope) {
  rope_apply_qk("rope_forward_qk", q, k, seq, heads, kv_heads, head_dim, rope, 1.0, Tensor());
}

void rope_forward_qk_at(const Tensor& q, const Tensor& k, int64_t seq, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, const RopeSpec& rope,
                        const Tensor& positions) {
  rope_apply_qk("rope_forward_qk", q, k, seq, heads, kv_heads, head_dim, rope, 1.0, positions);
}

void rope_backward_qk(const Tensor& dq, const Tensor& dk, int64_t seq, int64_t heads,
                      int64_t kv_heads, int64_t head_dim, const RopeSpec& rope) {
  rope_apply_qk("rope_backward_qk", dq, dk, seq, heads, kv_heads, head_dim, rope, -1.0, Tensor());
}

void rope_backward_qk_at(const Tensor& dq, const Tensor& dk, int64_t seq, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, const RopeSpec& rope,
                         const Tensor& positions) {
  rope_apply_qk("rope_backward_qk", dq, dk, seq, heads, kv_heads, head_dim, rope, -1.0, positions);
}

}  // namespace tandem::ops::cpu
