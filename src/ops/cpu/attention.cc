// CPU causal attention with grouped-query heads, flash-attention style: the forward saves only
// the log-sum-exp of each query row and the backward recomputes the probabilities from it. Each
// (batch, head) pair runs as BLAS products over a [seq, seq] workspace owned by the call, taken
// from the CPU allocator as an op temporary (category other) so that the measured peak holds it
// and the plan counts it (Note [Node workspace] in core/footprint.h: one [seq, seq] in the
// forward; two and a [seq] row in the backward). With
// document bounds (AttentionShape::key_begin) a query row's keys start at its document's first
// position; the entries before it are zero, as those above the diagonal are.
#include <cmath>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"

namespace tandem::ops::cpu {

using cpu::Trans;

namespace {

// Sizes shared by forward and backward; q rows have stride qw = heads*D, k rows kw = kv*D, v rows
// vw = kv*Dv, out rows ow = heads*Dv.
struct Dims {
  int64_t b, t, heads, kv, d, dv, group, qw, kw, vw, ow;
  double scale;
};

Dims check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& lse, const AttentionShape& s) {
  cpu::expect_at_least(op, "batch", s.batch, 1);
  cpu::expect_at_least(op, "seq", s.seq, 1);
  cpu::expect_at_least(op, "heads", s.heads, 1);
  cpu::expect_at_least(op, "kv_heads", s.kv_heads, 1);
  cpu::expect_at_least(op, "head_dim", s.head_dim, 1);
  TANDEM_CHECK(s.heads % s.kv_heads == 0, op, ": heads ", s.heads,
               " is not a multiple of kv_heads ", s.kv_heads);
  const Dims d{.b = s.batch,
               .t = s.seq,
               .heads = s.heads,
               .kv = s.kv_heads,
               .d = s.head_dim,
               .dv = s.v_dim(),
               .group = s.heads / s.kv_heads,
               .qw = s.heads * s.head_dim,
               .kw = s.kv_heads * s.head_dim,
               .vw = s.kv_heads * s.v_dim(),
               .ow = s.heads * s.v_dim(),
               .scale = s.softmax_scale()};
  const DType dt = cpu::float_dtype(op, "q", q, 2);
  const int64_t n = d.b * d.t;
  cpu::expect(op, "q", q, dt, {n, d.qw});
  cpu::expect(op, "k", k, dt, {n, d.kw});
  cpu::expect(op, "v", v, dt, {n, d.vw});
  cpu::expect(op, "lse", lse, dt, {d.b, d.heads, d.t});
  if (s.key_begin.defined()) {
    cpu::expect(op, "key_begin", s.key_begin, DType::kI32, {n});
    const int32_t* begin = s.key_begin.data<int32_t>();
    for (int64_t r = 0; r < n; ++r) {
      TANDEM_CHECK(begin[r] >= 0 && begin[r] <= r % d.t, op, ": key_begin[", r, "] = ", begin[r],
                   " is outside [0, ", r % d.t, "], the positions before query ", r % d.t);
    }
  }
  return d;
}

// Pointers to one (batch, head) pair: q rows of stride qw, k rows kw, v rows vw.
template <typename T>
struct HeadView {
  const T *q, *k, *v;
  T* lse;                // [seq]
  const int32_t* begin;  // [seq]: each query's first key; null: 0
  int64_t first_key(int64_t i) const { return begin ? begin[i] : 0; }
};

template <typename T>
HeadView<T> head_view(const Dims& d, const T* q, const T* k, const T* v, T* lse,
                      const AttentionShape& s, int64_t b, int64_t h) {
  const int64_t g = h / d.group;  // the KV head this query head reads
  const int32_t* begin = s.key_begin.defined() ? s.key_begin.data<int32_t>() + b * d.t : nullptr;
  return {q + b * d.t * d.qw + h * d.d, k + b * d.t * d.kw + g * d.d, v + b * d.t * d.vw + g * d.dv,
          lse + (b * d.heads + h) * d.t, begin};
}

// p[T, T] = causal softmax(q k^T * scale), zero above the diagonal; writes lse[T].
template <typename T>
void head_forward_probs(const Dims& d, const HeadView<T>& hv, T* p) {
  const int64_t t = d.t;
  const T scale = static_cast<T>(d.scale);
  cpu::gemm(Trans::kNo, Trans::kYes, t, t, d.d, scale, hv.q, d.qw, hv.k, d.kw, T(0), p, t);
  for (int64_t i = 0; i < t; ++i) {
    T* row = p + i * t;
    const int64_t lo = hv.first_key(i);
    T mx = row[lo];
    for (int64_t j = lo + 1; j <= i; ++j) mx = row[j] > mx ? row[j] : mx;
    double sum = 0;
    for (int64_t j = lo; j <= i; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t j = 0; j < lo; ++j) row[j] = T(0);
    for (int64_t j = lo; j <= i; ++j) row[j] *= inv;
    for (int64_t j = i + 1; j < t; ++j) row[j] = T(0);
    hv.lse[i] = static_cast<T>(static_cast<double>(mx) + std::log(sum));
  }
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionShape& s) {
  const char* op = "attention_forward";
  const Dims d = check_attention(op, q, k, v, lse, s);
  cpu::expect(op, "out", out, q.dtype(), {q.size(0), d.ow});
  cpu::dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // [seq, seq] probabilities of one head
    const Tensor probs =
        Tensor::empty({d.t * d.t}, q.dtype(), MemCategory::kOther, "attention.probs");
    T* p = probs.data<T>();
    for (int64_t b = 0; b < d.b; ++b) {
      for (int64_t h = 0; h < d.heads; ++h) {
        const HeadView<T> hv =
            head_view(d, q.data<T>(), k.data<T>(), v.data<T>(), lse.data<T>(), s, b, h);
        head_forward_probs(d, hv, p);
        T* o = out.data<T>() + b * d.t * d.ow + h * d.dv;
        cpu::gemm(Trans::kNo, Trans::kNo, d.t, d.dv, d.t, T(1), p, d.t, hv.v, d.vw, T(0), o, d.ow);
      }
    }
  });
}

namespace {

// Gradients of one (batch, head): dq written, dk/dv (the head's KV group) accumulated.
// dout/out rows have stride ow, dq qw, dk kw, dv vw. p, ds: [T, T] workspace; delta: [T].
template <typename T>
void head_backward(const Dims& d, const HeadView<T>& hv, const T* dout, const T* out, T* dq, T* dk,
                   T* dv, T* p, T* ds, T* delta) {
  const int64_t t = d.t;
  const T scale = static_cast<T>(d.scale);
  // delta_i = sum_d dout[i, d] * out[i, d] = sum_j p_ij * dp_ij.
  for (int64_t i = 0; i < t; ++i) {
    double acc = 0;
    for (int64_t c = 0; c < d.dv; ++c)
      acc += static_cast<double>(dout[i * d.ow + c]) * out[i * d.ow + c];
    delta[i] = static_cast<T>(acc);
  }
  // p = exp(q k^T * scale - lse), recomputed; zero above the diagonal and before the document.
  cpu::gemm(Trans::kNo, Trans::kYes, t, t, d.d, scale, hv.q, d.qw, hv.k, d.kw, T(0), p, t);
  for (int64_t i = 0; i < t; ++i) {
    T* row = p + i * t;
    const int64_t lo = hv.first_key(i);
    for (int64_t j = 0; j < lo; ++j) row[j] = T(0);
    for (int64_t j = lo; j <= i; ++j) row[j] = std::exp(row[j] - hv.lse[i]);
    for (int64_t j = i + 1; j < t; ++j) row[j] = T(0);
  }
  // dv += p^T dout;  dp = dout v^T (into ds).
  cpu::gemm(Trans::kYes, Trans::kNo, t, d.dv, t, T(1), p, t, dout, d.ow, T(1), dv, d.vw);
  cpu::gemm(Trans::kNo, Trans::kYes, t, t, d.dv, T(1), dout, d.ow, hv.v, d.vw, T(0), ds, t);
  // ds = p * (dp - delta), exactly zero where masked.
  for (int64_t i = 0; i < t; ++i) {
    T* row = ds + i * t;
    const T* prow = p + i * t;
    for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - delta[i]);  // p is 0 masked
    for (int64_t j = i + 1; j < t; ++j) row[j] = T(0);
  }
  // dq = scale * ds k;  dk += scale * ds^T q.
  cpu::gemm(Trans::kNo, Trans::kNo, t, d.d, t, scale, ds, t, hv.k, d.kw, T(0), dq, d.qw);
  cpu::gemm(Trans::kYes, Trans::kNo, t, d.d, t, scale, ds, t, hv.q, d.qw, T(1), dk, d.kw);
}

}  // namespace

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionShape& s) {
  const char* op = "attention_backward";
  const Dims d = check_attention(op, q, k, v, lse, s);
  cpu::expect(op, "out", out, q.dtype(), {q.size(0), d.ow});
  cpu::expect(op, "dout", dout, q.dtype(), {q.size(0), d.ow});
  cpu::expect(op, "dq", dq, q.dtype(), q.shape());
  cpu::expect(op, "dk", dk, q.dtype(), k.shape());
  cpu::expect(op, "dv", dv, q.dtype(), v.shape());
  dk.zero_();  // query heads of one group add into the same dk/dv columns, in head order
  dv.zero_();
  cpu::dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // p, ds [seq, seq] and delta [seq], one after another
    const Tensor work =
        Tensor::empty({2 * d.t * d.t + d.t}, q.dtype(), MemCategory::kOther, "attention.grads");
    T* p = work.data<T>();
    T* ds = p + d.t * d.t;
    T* delta = ds + d.t * d.t;
    for (int64_t b = 0; b < d.b; ++b) {
      for (int64_t h = 0; h < d.heads; ++h) {
        const HeadView<T> hv =
            head_view(d, q.data<T>(), k.data<T>(), v.data<T>(), lse.data<T>(), s, b, h);
        const int64_t qoff = b * d.t * d.qw + h * d.d, ooff = b * d.t * d.ow + h * d.dv;
        const int64_t koff = b * d.t * d.kw + (h / d.group) * d.d;
        const int64_t voff = b * d.t * d.vw + (h / d.group) * d.dv;
        head_backward(d, hv, dout.data<T>() + ooff, out.data<T>() + ooff, dq.data<T>() + qoff,
                      dk.data<T>() + koff, dv.data<T>() + voff, p, ds, delta);
      }
    }
  });
}

}  // namespace tandem::ops::cpu
