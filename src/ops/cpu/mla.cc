// CPU multi-head latent attention's q, k and v from their products (docs/model.md "Multi-head
// latent attention"): the heads' parts copied into place and the RoPE parts rotated. Plain
// copies and RopeTable rotations, so the backward is the forward's exact transpose.
#include <algorithm>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/rope.h"

namespace tandem::ops::cpu {

namespace {

// The widths of one call, checked against every tensor.
struct MlaDims {
  int64_t n, heads, dn, dr, dv, qk, kvw;  // qk = dn + dr; kvw = heads * (dn + dv)
};

MlaDims check_mla(const char* op, const Tensor& q, const Tensor& q_in, const Tensor& k,
                  const Tensor& v, const Tensor& kv, const Tensor& k_rope, int64_t seq,
                  int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim) {
  const DType dt = cpu::float_dtype(op, "q", q, 2);
  cpu::expect_at_least(op, "seq", seq, 1);
  cpu::expect_at_least(op, "heads", heads, 1);
  cpu::expect_at_least(op, "nope_dim", nope_dim, 1);
  cpu::expect_at_least(op, "rope_dim", rope_dim, 2);
  cpu::expect_at_least(op, "v_dim", v_dim, 1);
  TANDEM_CHECK(rope_dim % 2 == 0 && rope_dim <= 2 * RopeTable<float>::kMaxHalf, op, ": rope_dim ",
               rope_dim, " must be even and at most ", 2 * RopeTable<float>::kMaxHalf);
  const MlaDims d{
      q.size(0), heads, nope_dim, rope_dim, v_dim, nope_dim + rope_dim, heads * (nope_dim + v_dim)};
  cpu::expect(op, "q", q, dt, {d.n, heads * d.qk});
  cpu::expect(op, "q_in", q_in, dt, {d.n, heads * d.qk});
  cpu::expect(op, "k", k, dt, {d.n, heads * d.qk});
  cpu::expect(op, "v", v, dt, {d.n, heads * d.dv});
  cpu::expect(op, "kv", kv, dt, {d.n, d.kvw});
  cpu::expect(op, "k_rope", k_rope, dt, {d.n, d.dr});
  return d;
}

}  // namespace

void mla_qkv_forward_at(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_in,
                        const Tensor& kv, const Tensor& k_rope, int64_t seq, int64_t heads,
                        int64_t nope_dim, int64_t rope_dim, int64_t v_dim, const RopeSpec& rope,
                        const Tensor& positions) {
  const char* op = "mla_qkv_forward";
  const MlaDims d = check_mla(op, q, q_in, k, v, kv, k_rope, seq, heads, nope_dim, rope_dim, v_dim);
  const int32_t* pos = row_positions(op, positions, d.n, seq);
  cpu::dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const RopeTable<T> table(rope, d.dr, seq, 1.0);
    const T *pqi = q_in.data<T>(), *pkv = kv.data<T>(), *pkr = k_rope.data<T>();
    T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    std::vector<T> kr(static_cast<size_t>(d.dr));
    for (int64_t r = 0; r < d.n; ++r) {
      table.rotate(kr.data(), pkr + r * d.dr, position_of(pos, r, seq), true);
      for (int64_t h = 0; h < d.heads; ++h) {
        const T* qi = pqi + (r * d.heads + h) * d.qk;
        T* qo = pq + (r * d.heads + h) * d.qk;
        std::copy(qi, qi + d.dn, qo);
        table.rotate(qo + d.dn, qi + d.dn, position_of(pos, r, seq), true);
        const T* kvh = pkv + r * d.kvw + h * (d.dn + d.dv);
        T* ko = pk + (r * d.heads + h) * d.qk;
        std::copy(kvh, kvh + d.dn, ko);
        std::copy(kr.begin(), kr.end(), ko + d.dn);
        std::copy(kvh + d.dn, kvh + d.dn + d.dv, pv + (r * d.heads + h) * d.dv);
      }
    }
  });
}

void mla_qkv_backward_at(const Tensor& d_q_in, const Tensor& d_kv, const Tensor& d_k_rope,
                         const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq,
                         int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim,
                         const RopeSpec& rope, const Tensor& positions) {
  const char* op = "mla_qkv_backward";
  const MlaDims d =
      check_mla(op, dq, d_q_in, dk, dv, d_kv, d_k_rope, seq, heads, nope_dim, rope_dim, v_dim);
  const int32_t* pos = row_positions(op, positions, d.n, seq);
  cpu::dispatch_float(dq.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const RopeTable<T> table(rope, d.dr, seq, -1.0);
    const T *pdq = dq.data<T>(), *pdk = dk.data<T>(), *pdv = dv.data<T>();
    T *pdqi = d_q_in.data<T>(), *pdkv = d_kv.data<T>(), *pdkr = d_k_rope.data<T>();
    std::vector<double> sum(static_cast<size_t>(d.dr));
    std::vector<T> back(static_cast<size_t>(d.dr));
    for (int64_t r = 0; r < d.n; ++r) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t h = 0; h < d.heads; ++h) {
        const T* g = pdq + (r * d.heads + h) * d.qk;
        T* gi = pdqi + (r * d.heads + h) * d.qk;
        std::copy(g, g + d.dn, gi);
        table.rotate(gi + d.dn, g + d.dn, position_of(pos, r, seq), false);
        const T* gk = pdk + (r * d.heads + h) * d.qk;
        T* gkv = pdkv + r * d.kvw + h * (d.dn + d.dv);
        std::copy(gk, gk + d.dn, gkv);
        const T* gv = pdv + (r * d.heads + h) * d.dv;
        std::copy(gv, gv + d.dv, gkv + d.dn);
        // The heads' rope parts of k are one rotated k_rope: their gradients add, in head order,
        // before the one rotation back.
        for (int64_t c = 0; c < d.dr; ++c) sum[static_cast<size_t>(c)] += gk[d.dn + c];
      }
      for (int64_t c = 0; c < d.dr; ++c) back[static_cast<size_t>(c)] = static_cast<T>(sum[c]);
      table.rotate(pdkr + r * d.dr, back.data(), position_of(pos, r, seq), false);
    }
  });
}

void mla_qkv_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_in,
                     const Tensor& kv, const Tensor& k_rope, int64_t seq, int64_t heads,
                     int64_t nope_dim, int64_t rope_dim, int64_t v_dim, const RopeSpec& rope) {
  mla_qkv_forward_at(q, k, v, q_in, kv, k_rope, seq, heads, nope_dim, rope_dim, v_dim, rope,
                     Tensor());
}

void mla_qkv_backward(const Tensor& d_q_in, const Tensor& d_kv, const Tensor& d_k_rope,
                      const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq,
                      int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim,
                      const RopeSpec& rope) {
  mla_qkv_backward_at(d_q_in, d_kv, d_k_rope, dq, dk, dv, seq, heads, nope_dim, rope_dim, v_dim,
                      rope, Tensor());
}

}  // namespace tandem::ops::cpu
