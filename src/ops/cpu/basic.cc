// CPU elementwise ops and reductions, embedding lookup, SwiGLU and the AdamW step. Loops run in
// element order so every result is bitwise reproducible.
#include <cmath>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"

namespace tandem::ops::cpu {

using cpu::dispatch_float;
using cpu::expect;
using cpu::float_dtype;

// ---- elementwise and reductions ----

void axpy(const Tensor& y, const Tensor& x, double alpha, Accumulate acc) {
  const DType dt = float_dtype("axpy", "y", y, -1);
  expect("axpy", "x", x, dt, y.shape());
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.data<T>();
    const T* px = x.data<T>();
    const T a = static_cast<T>(alpha);
    const int64_t n = y.numel();
    if (acc == Accumulate::kAdd) {
      for (int64_t i = 0; i < n; ++i) py[i] += a * px[i];
    } else {
      for (int64_t i = 0; i < n; ++i) py[i] = a * px[i];
    }
  });
}

void scale(const Tensor& x, double alpha) {
  const DType dt = float_dtype("scale", "x", x, -1);
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    T* px = x.data<T>();
    const T a = static_cast<T>(alpha);
    for (int64_t i = 0, n = x.numel(); i < n; ++i) px[i] *= a;
  });
}

PendingScalar sum_squares_start(const Tensor& x) {
  const DType dt = float_dtype("sum_squares", "x", x, -1);
  return PendingScalar(dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    double s = 0;
    for (int64_t i = 0, n = x.numel(); i < n; ++i) s += static_cast<double>(px[i]) * px[i];
    return s;
  }));
}

bool all_finite(const Tensor& x) {
  const DType dt = float_dtype("all_finite", "x", x, -1);
  return dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      if (!std::isfinite(px[i])) return false;
    }
    return true;
  });
}

// ---- bias ----

void bias_forward(const Tensor& y, const Tensor& b) {
  const char* op = "bias_forward";
  const DType dt = float_dtype(op, "y", y, 2);
  const int64_t m = y.size(0), n = y.size(1);
  expect(op, "b", b, dt, {n});
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.data<T>();
    const T* pb = b.data<T>();
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) py[r * n + c] += pb[c];
    }
  });
}

void bias_backward(const Tensor& db, const Tensor& dy) {
  const char* op = "bias_backward";
  const DType dt = float_dtype(op, "dy", dy, 2);
  const int64_t m = dy.size(0), n = dy.size(1);
  expect(op, "db", db, dt, {n});
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pd = dy.data<T>();
    T* pb = db.data<T>();
    std::vector<double> sum(static_cast<size_t>(n), 0.0);  // rows in order
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) sum[static_cast<size_t>(c)] += pd[r * n + c];
    }
    for (int64_t c = 0; c < n; ++c) pb[c] += static_cast<T>(sum[static_cast<size_t>(c)]);
  });
}

// ---- sigmoid gate ----

void sigmoid_gate_forward(const Tensor& y, const Tensor& gate, const Tensor& z,
                          const Tensor& logit) {
  const char* op = "sigmoid_gate_forward";
  const DType dt = float_dtype(op, "z", z, 2);
  const int64_t m = z.size(0), h = z.size(1);
  expect(op, "y", y, dt, {m, h});
  expect(op, "gate", gate, dt, {m});
  expect(op, "logit", logit, dt, {m});
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pz = z.data<T>();
    const T* pl = logit.data<T>();
    T *py = y.data<T>(), *pg = gate.data<T>();
    for (int64_t r = 0; r < m; ++r) {
      const T g = static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(pl[r]))));
      pg[r] = g;
      for (int64_t c = 0; c < h; ++c) py[r * h + c] = g * pz[r * h + c];
    }
  });
}

void sigmoid_gate_backward(const Tensor& dz, const Tensor& dlogit, const Tensor& dy,
                           const Tensor& z, const Tensor& gate) {
  const char* op = "sigmoid_gate_backward";
  const DType dt = float_dtype(op, "z", z, 2);
  const int64_t m = z.size(0), h = z.size(1);
  expect(op, "dz", dz, dt, {m, h});
  expect(op, "dy", dy, dt, {m, h});
  expect(op, "dlogit", dlogit, dt, {m});
  expect(op, "gate", gate, dt, {m});
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *pdy = dy.data<T>(), *pz = z.data<T>(), *pg = gate.data<T>();
    T *pdz = dz.data<T>(), *pdl = dlogit.data<T>();
    for (int64_t r = 0; r < m; ++r) {
      const double g = pg[r];
      double dot = 0;
      for (int64_t c = 0; c < h; ++c) dot += static_cast<double>(pdy[r * h + c]) * pz[r * h + c];
      for (int64_t c = 0; c < h; ++c) pdz[r * h + c] = static_cast<T>(pdy[r * h + c] * g);
      pdl[r] = static_cast<T>(dot * g * (1 - g));
    }
  });
}

// ---- embedding ----

void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table, IdCheck) {
  const char* op = "embedding_forward";
  const DType dt = float_dtype(op, "table", table, 2);
  cpu::expect_rank(op, "ids", ids, 1);
  const int64_t n = ids.size(0), v = table.size(0), h = table.size(1);
  expect(op, "ids", ids, DType::kI32, {n});
  expect(op, "out", out, dt, {n, h});
  const int32_t* pid = ids.data<int32_t>();
  cpu::expect_indices(op, "id", pid, n, v);  // before any write: a bad batch leaves out unchanged
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pt = table.data<T>();
    T* po = out.data<T>();
    for (int64_t r = 0; r < n; ++r) {
      const T* src = pt + pid[r] * h;
      T* dst = po + r * h;
      for (int64_t c = 0; c < h; ++c) dst[c] = src[c];
    }
  });
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const char* op = "embedding_backward";
  const DType dt = float_dtype(op, "dtable", dtable, 2);
  cpu::expect_rank(op, "ids", ids, 1);
  const int64_t n = ids.size(0), v = dtable.size(0), h = dtable.size(1);
  expect(op, "ids", ids, DType::kI32, {n});
  expect(op, "dout", dout, dt, {n, h});
  const int32_t* pid = ids.data<int32_t>();
  cpu::expect_indices(op, "id", pid, n, v);
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pd = dout.data<T>();
    T* pt = dtable.data<T>();
    // Rows in token order: a repeated id sums its rows in a fixed order.
    for (int64_t r = 0; r < n; ++r) {
      T* dst = pt + pid[r] * h;
      const T* src = pd + r * h;
      for (int64_t c = 0; c < h; ++c) dst[c] += src[c];
    }
  });
}

// ---- SwiGLU ----

namespace {
template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
}  // namespace

// gate_up [M, 2F] (even width) and the [M, F] shape of out and dout; returns F.
static int64_t swiglu_width(const char* op, const Tensor& gate_up) {
  const int64_t f = gate_up.size(1) / 2;
  TANDEM_CHECK(gate_up.size(1) % 2 == 0, op, ": tensor 'gate_up' has shape ",
               shape_str(gate_up.shape()), "; expected [M, 2F] (gate then up), an even width");
  return f;
}

void swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  const char* op = "swiglu_forward";
  const DType dt = float_dtype(op, "gate_up", gate_up, 2);
  const int64_t m = gate_up.size(0), f = swiglu_width(op, gate_up);
  expect(op, "out", out, dt, {m, f});
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < m; ++i) {
      const T* pg = gate_up.data<T>() + i * 2 * f;
      const T* pu = pg + f;
      T* po = out.data<T>() + i * f;
      for (int64_t j = 0; j < f; ++j) po[j] = pg[j] * sigmoid(pg[j]) * pu[j];
    }
  });
}

void swiglu_backward(const Tensor& d_gate_up, const Tensor& dout, const Tensor& gate_up) {
  const char* op = "swiglu_backward";
  const DType dt = float_dtype(op, "gate_up", gate_up, 2);
  const int64_t m = gate_up.size(0), f = swiglu_width(op, gate_up);
  expect(op, "dout", dout, dt, {m, f});
  expect(op, "d_gate_up", d_gate_up, dt, gate_up.shape());
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < m; ++i) {
      const T* pg = gate_up.data<T>() + i * 2 * f;
      const T* pu = pg + f;
      const T* pd = dout.data<T>() + i * f;
      T* pdg = d_gate_up.data<T>() + i * 2 * f;
      T* pdu = pdg + f;
      for (int64_t j = 0; j < f; ++j) {
        const T g = pg[j], s = sigmoid(g), d = pd[j];
        // d silu(g)/dg = s * (1 + g * (1 - s)).
        pdg[j] = d * pu[j] * s * (T(1) + g * (T(1) - s));
        pdu[j] = d * g * s;
      }
    }
  });
}

// ---- optimizer ----

namespace {

// One step's scalars in T, formed in double from the hyper-parameters as PyTorch does; the
// element arithmetic (adamw_range) is in T.
template <typename T>
struct AdamWConstants {
  T b1, c1, b2, c2, step_size, inv_sqrt_bc2, eps;
};

template <typename T>
AdamWConstants<T> adamw_constants(const AdamWParams& hp) {
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  return {static_cast<T>(hp.beta1),    static_cast<T>(1.0 - hp.beta1),
          static_cast<T>(hp.beta2),    static_cast<T>(1.0 - hp.beta2),
          static_cast<T>(hp.lr / bc1), static_cast<T>(1.0 / std::sqrt(bc2)),
          static_cast<T>(hp.eps)};
}

// Elements [begin, end): g = grad * grad_scale (exactly grad when the scale is one, and exactly
// what ops::scale then a step would use otherwise); the moments; p = p * decay - the update.
template <typename T>
void adamw_range(T* p, T* m, T* v, const T* grad, int64_t begin, int64_t end, T decay, T grad_scale,
                 const AdamWConstants<T>& k) {
  for (int64_t i = begin; i < end; ++i) {
    const T g = grad[i] * grad_scale;
    const T mi = k.b1 * m[i] + k.c1 * g;
    const T vi = k.b2 * v[i] + k.c2 * g * g;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - k.step_size * mi / (std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps);
  }
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWParams& hp) {
  const char* op = "adamw_step";
  const DType dt = float_dtype(op, "param", param, -1);
  expect(op, "grad", grad, dt, param.shape());
  expect(op, "m", m, dt, param.shape());
  expect(op, "v", v, dt, param.shape());
  cpu::expect_at_least(op, "step", hp.step, 1);
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    adamw_range(param.data<T>(), m.data<T>(), v.data<T>(), grad.data<T>(), 0, param.numel(),
                static_cast<T>(1.0 - hp.lr * hp.weight_decay), T(1), adamw_constants<T>(hp));
  });
}

void adamw_step_flat(const Tensor& param, const Tensor& m, const Tensor& v,
                     const Tensor& param_bf16, const Tensor& grad,
                     const std::vector<int64_t>& decayed, double grad_scale,
                     const AdamWParams& hp) {
  const char* op = "adamw_step_flat";
  const DType dt = float_dtype(op, "param", param, 1);
  expect(op, "m", m, dt, param.shape());
  expect(op, "v", v, dt, param.shape());
  expect(op, "grad", grad, dt, param.shape());
  if (param_bf16.defined()) expect(op, "param_bf16", param_bf16, DType::kBF16, param.shape());
  cpu::expect_at_least(op, "step", hp.step, 1);
  const int64_t n = param.numel();
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const AdamWConstants<T> k = adamw_constants<T>(hp);
    // What adamw_step multiplies by: 1 - lr * wd, or 1 - lr * 0 (exactly one) outside `decayed`.
    const T decay = static_cast<T>(1.0 - hp.lr * hp.weight_decay), none = T(1);
    T* pp = param.data<T>();
    int64_t at = 0;
    for (size_t r = 0; r <= decayed.size(); ++r) {  // runs alternate: not decayed, decayed, ...
      const int64_t end = r < decayed.size() ? decayed[r] : n;
      adamw_range(pp, m.data<T>(), v.data<T>(), grad.data<T>(), at, end, r % 2 == 1 ? decay : none,
                  static_cast<T>(grad_scale), k);
      at = end;
    }
    if (!param_bf16.defined()) return;
    BF16* pb = param_bf16.data<BF16>();
    for (int64_t i = 0; i < n; ++i) pb[i] = bf16_from_float(static_cast<float>(pp[i]));
  });
}

}  // namespace tandem::ops::cpu
