// CPU router (top-k, the routing weights of RouterScore, switch aux loss) and the dropless
// token permutation by expert. Every loop runs in a fixed order: results are bitwise reproducible.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"

namespace tandem::ops::cpu {

using cpu::expect;

// ---- router ----

namespace {

// Top-k of one row of e logits into idx[k]: descending, ties to the lower index (strict >).
template <typename T>
void row_topk(int32_t* idx, const T* logits, int64_t e, int64_t k, std::vector<char>& taken) {
  taken.assign(static_cast<size_t>(e), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t c = 0; c < e; ++c) {
      if (taken[static_cast<size_t>(c)]) continue;
      if (best < 0 || logits[c] > logits[best]) best = c;
    }
    taken[static_cast<size_t>(best)] = 1;
    idx[j] = static_cast<int32_t>(best);
  }
}

// out[j] = softmax over j of logits[idx[j]] (or of logits[j] when idx is null), in double.
template <typename T>
void row_softmax(T* out, const T* logits, const int32_t* idx, int64_t count) {
  auto at = [&](int64_t j) { return static_cast<double>(logits[idx ? idx[j] : j]); };
  double mx = -INFINITY;
  for (int64_t j = 0; j < count; ++j) mx = at(j) > mx ? at(j) : mx;
  double sum = 0;
  for (int64_t j = 0; j < count; ++j) sum += std::exp(at(j) - mx);
  for (int64_t j = 0; j < count; ++j) out[j] = static_cast<T>(std::exp(at(j) - mx) / sum);
}

// DeepSeek-V3's choice for one row (RouterSpec): the biased scores, the groups' values (the sum
// of each group's two best), the group_topk best groups kept and the others' experts read as 0,
// then the top-k. choice: [e] workspace.
template <typename T>
void row_sigmoid_choice(int32_t* idx, const T* scores, const double* bias, const RouterSpec& spec,
                        int64_t e, int64_t k, std::vector<double>& choice,
                        std::vector<char>& taken) {
  choice.resize(static_cast<size_t>(e));
  for (int64_t c = 0; c < e; ++c) {
    choice[static_cast<size_t>(c)] = static_cast<double>(scores[c]) + (bias ? bias[c] : 0.0);
  }
  if (spec.groups > 0) {
    const int64_t size = e / spec.groups;
    std::vector<double> value(static_cast<size_t>(spec.groups));
    for (int64_t g = 0; g < spec.groups; ++g) {
      double best = -INFINITY, second = -INFINITY;
      for (int64_t c = g * size; c < (g + 1) * size; ++c) {
        const double x = choice[static_cast<size_t>(c)];
        if (x > best) {
          second = best;
          best = x;
        } else if (x > second) {
          second = x;
        }
      }
      value[static_cast<size_t>(g)] = best + second;
    }
    std::vector<int32_t> kept(static_cast<size_t>(spec.group_topk));
    row_topk(kept.data(), value.data(), spec.groups, spec.group_topk, taken);
    std::vector<char> keep(static_cast<size_t>(spec.groups), 0);
    for (const int32_t g : kept) keep[static_cast<size_t>(g)] = 1;
    for (int64_t c = 0; c < e; ++c) {
      if (!keep[static_cast<size_t>(c / size)]) choice[static_cast<size_t>(c)] = 0.0;
    }
  }
  row_topk(idx, choice.data(), e, k, taken);
}

}  // namespace

void router_forward(const Tensor& topk_idx, const Tensor& topk_w, const Tensor& probs,
                    const Tensor& logits, const RouterSpec& spec, const Tensor& bias) {
  const char* op = "router_forward";
  const DType dt = cpu::float_dtype(op, "logits", logits, 2);
  cpu::expect_rank(op, "topk_idx", topk_idx, 2);
  const int64_t n = logits.size(0), e = logits.size(1), k = topk_idx.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  expect(op, "topk_idx", topk_idx, DType::kI32, {n, k});
  expect(op, "topk_w", topk_w, dt, {n, k});
  expect(op, "probs", probs, dt, {n, e});
  TANDEM_CHECK(!bias.defined() || spec.sigmoid(), op, ": an expert bias needs sigmoid scores");
  std::vector<double> bias_values;  // the bias in double, whatever its dtype
  if (bias.defined()) {
    expect(op, "bias", bias, cpu::float_dtype(op, "bias", bias, 1), {e});
    cpu::dispatch_float(bias.dtype(), [&](auto tag) {
      using B = decltype(tag);
      bias_values.assign(bias.data<B>(), bias.data<B>() + e);
    });
  }
  if (spec.groups > 0) {
    TANDEM_CHECK(spec.sigmoid() && e % spec.groups == 0 && e / spec.groups >= 2 &&
                     spec.group_topk >= 1 && spec.group_topk <= spec.groups &&
                     k <= spec.group_topk * (e / spec.groups),
                 op, ": groups ", spec.groups, ", group_topk ", spec.group_topk, " do not fit ", e,
                 " experts and k = ", k);
  }
  TANDEM_CHECK(spec.sigmoid() || spec.scaling == 1.0, op,
               ": a scaling of the weights needs sigmoid scores");
  const double* pb = bias.defined() ? bias_values.data() : nullptr;
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pl = logits.data<T>();
    int32_t* pi = topk_idx.data<int32_t>();
    T *pw = topk_w.data<T>(), *pp = probs.data<T>();
    std::vector<char> taken;
    std::vector<double> choice;
    for (int64_t r = 0; r < n; ++r) {
      if (spec.sigmoid()) {
        T* p = pp + r * e;
        for (int64_t c = 0; c < e; ++c) {
          p[c] = static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(pl[r * e + c]))));
        }
        row_sigmoid_choice(pi + r * k, p, pb, spec, e, k, choice, taken);
        double sum = 1e-20;
        for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(p[pi[r * k + j]]);
        const double norm = spec.score == RouterScore::kSigmoidNormalized ? sum : 1.0;
        for (int64_t j = 0; j < k; ++j) {
          pw[r * k + j] =
              static_cast<T>(spec.scaling * static_cast<double>(p[pi[r * k + j]]) / norm);
        }
        continue;
      }
      row_topk(pi + r * k, pl + r * e, e, k, taken);
      row_softmax(pp + r * e, pl + r * e, static_cast<const int32_t*>(nullptr), e);
      if (spec.score == RouterScore::kSoftmaxOfSelected) {
        row_softmax(pw + r * k, pl + r * e, pi + r * k, k);
      } else {
        for (int64_t j = 0; j < k; ++j) pw[r * k + j] = pp[r * e + pi[r * k + j]];
      }
    }
  });
}

void router_load_add(const Tensor& load, const Tensor& counts) {
  const char* op = "router_load_add";
  cpu::expect_rank(op, "counts", counts, 1);
  expect(op, "counts", counts, DType::kI32, counts.shape());
  expect(op, "load", load, DType::kF32, counts.shape());
  float* pl = load.data<float>();
  const int32_t* pc = counts.data<int32_t>();
  for (int64_t c = 0; c < counts.numel(); ++c) pl[c] += static_cast<float>(pc[c]);
}

void router_counts(const Tensor& counts, const Tensor& topk_idx) {
  const char* op = "router_counts";
  cpu::expect_rank(op, "counts", counts, 1);
  cpu::expect_rank(op, "topk_idx", topk_idx, 2);
  expect(op, "counts", counts, DType::kI32, counts.shape());
  expect(op, "topk_idx", topk_idx, DType::kI32, topk_idx.shape());
  const int64_t e = counts.size(0), nk = topk_idx.numel();
  const int32_t* pi = topk_idx.data<int32_t>();
  cpu::expect_indices(op, "expert id", pi, nk, e);
  int32_t* pc = counts.data<int32_t>();
  for (int64_t c = 0; c < e; ++c) pc[c] = 0;
  for (int64_t s = 0; s < nk; ++s) ++pc[pi[s]];
}

PendingScalar router_aux_loss_start(const Tensor& probs, const Tensor& counts, int64_t k,
                                    double coeff) {
  const char* op = "router_aux_loss";
  const DType dt = cpu::float_dtype(op, "probs", probs, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  expect(op, "counts", counts, DType::kI32, {e});
  cpu::expect_at_least(op, "k", k, 1);
  if (n == 0) return PendingScalar(0.0);
  return PendingScalar(cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pp = probs.data<T>();
    std::vector<double> col(static_cast<size_t>(e), 0.0);  // sum_n probs[n, e]
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < e; ++c) col[static_cast<size_t>(c)] += pp[r * e + c];
    }
    const int32_t* pc = counts.data<int32_t>();
    const double nd = static_cast<double>(n);
    double s = 0;
    for (int64_t c = 0; c < e; ++c) {
      s += (pc[c] / (nd * static_cast<double>(k))) * (col[static_cast<size_t>(c)] / nd);
    }
    return coeff * static_cast<double>(e) * s;
  }));
}

namespace {

// The sequence-wise aux loss's pieces (router_seq_aux_loss_start): for each sequence b of `seq`
// rows, c[b][e] = the choices of e in it; and per row, q = p / sum_e p (the normalised scores).
std::vector<double> sequence_counts(const int32_t* idx, int64_t n, int64_t e, int64_t k,
                                    int64_t seq) {
  std::vector<double> c(static_cast<size_t>((n / seq) * e), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < k; ++j) c[static_cast<size_t>((r / seq) * e + idx[r * k + j])] += 1;
  }
  return c;
}

template <typename T>
double row_sum(const T* p, int64_t e) {
  double s = 0;
  for (int64_t x = 0; x < e; ++x) s += static_cast<double>(p[x]);
  return s;
}

}  // namespace

PendingScalar router_seq_aux_loss_start(const Tensor& probs, const Tensor& topk_idx, int64_t seq,
                                        double coeff) {
  const char* op = "router_seq_aux_loss";
  const DType dt = cpu::float_dtype(op, "probs", probs, 2);
  cpu::expect_rank(op, "topk_idx", topk_idx, 2);
  const int64_t n = probs.size(0), e = probs.size(1), k = topk_idx.size(1);
  expect(op, "topk_idx", topk_idx, DType::kI32, {n, k});
  cpu::expect_at_least(op, "seq", seq, 1);
  TANDEM_CHECK(n % seq == 0, op, ": ", n, " rows are not whole sequences of ", seq);
  if (n == 0) return PendingScalar(0.0);
  const int32_t* pi = topk_idx.data<int32_t>();
  cpu::expect_indices(op, "expert id", pi, n * k, e);
  const std::vector<double> c = sequence_counts(pi, n, e, k, seq);
  return PendingScalar(cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pp = probs.data<T>();
    const double f = static_cast<double>(e) / (static_cast<double>(k) * static_cast<double>(seq));
    double total = 0;
    for (int64_t b = 0; b < n / seq; ++b) {
      std::vector<double> mean_q(static_cast<size_t>(e), 0.0);  // P_e of sequence b
      for (int64_t r = b * seq; r < (b + 1) * seq; ++r) {
        const double sum = row_sum(pp + r * e, e);
        for (int64_t x = 0; x < e; ++x) {
          mean_q[static_cast<size_t>(x)] += static_cast<double>(pp[r * e + x]) / sum;
        }
      }
      for (int64_t x = 0; x < e; ++x) {
        total += f * c[static_cast<size_t>(b * e + x)] * mean_q[static_cast<size_t>(x)] /
                 static_cast<double>(seq);
      }
    }
    return coeff * total / static_cast<double>(n / seq);
  }));
}

namespace {

// The sigmoid router's weights w_j = a s_j / S (S = the chosen scores' sum + 1e-20; S = 1 when
// not normalised), s = sigmoid(logit): ds_j = a (dw_j / S - sum_i dw_i s_i / S^2) (a dw_j when
// not normalised) at the chosen experts, and dlogit = ds s (1 - s); the others' are 0.
//
// With the sequence-wise aux loss (coeff > 0): g_e = aux_scale * coeff * (E / (k T)) c_e / T / B
// is d loss / d q_e at every row of sequence b (q = s / sum s), so ds_x += (g_x - sum_e g_e q_e)
// / sum s, through the same s (1 - s).
void sigmoid_router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                             const Tensor& probs, int64_t k, double coeff, double aux_scale,
                             const RouterSpec& spec) {
  const int64_t n = probs.size(0), e = probs.size(1);
  const bool normalized = spec.score == RouterScore::kSigmoidNormalized;
  const int32_t* pi = topk_idx.data<int32_t>();
  const bool aux = coeff != 0 && n > 0;
  TANDEM_CHECK(!aux || (spec.aux_seq >= 1 && n % spec.aux_seq == 0),
               "router_backward: the sequence-wise aux loss needs whole sequences: ", n,
               " rows, aux_seq ", spec.aux_seq);
  const int64_t seq = aux ? spec.aux_seq : 1;
  const std::vector<double> c = aux ? sequence_counts(pi, n, e, k, seq) : std::vector<double>();
  const double g_scale = aux ? aux_scale * coeff * static_cast<double>(e) /
                                   (static_cast<double>(k) * static_cast<double>(seq)) /
                                   static_cast<double>(seq) / static_cast<double>(n / seq)
                             : 0.0;
  cpu::dispatch_float(probs.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pdw = dtopk_w.data<T>(), *pp = probs.data<T>();
    T* pdl = dlogits.data<T>();
    std::vector<double> ds(static_cast<size_t>(e));
    for (int64_t r = 0; r < n; ++r) {
      const T* p = pp + r * e;
      const int32_t* idx = pi + r * k;
      const T* dw = pdw + r * k;
      T* dl = pdl + r * e;
      std::fill(ds.begin(), ds.end(), 0.0);
      if (aux) {  // through q = p / sum p
        const double* g = c.data() + (r / seq) * e;
        const double sum = row_sum(p, e);
        double gq = 0;
        for (int64_t x = 0; x < e; ++x) gq += g_scale * g[x] * static_cast<double>(p[x]) / sum;
        for (int64_t x = 0; x < e; ++x) ds[static_cast<size_t>(x)] = (g_scale * g[x] - gq) / sum;
      }
      double sum = 1e-20, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        sum += static_cast<double>(p[idx[j]]);
        dot += static_cast<double>(dw[j]) * p[idx[j]];
      }
      for (int64_t j = 0; j < k; ++j) {
        ds[static_cast<size_t>(idx[j])] +=
            normalized ? spec.scaling * (dw[j] / sum - dot / (sum * sum)) : spec.scaling * dw[j];
      }
      for (int64_t x = 0; x < e; ++x) {
        const double sx = p[x];
        dl[x] = static_cast<T>(ds[static_cast<size_t>(x)] * sx * (1 - sx));
      }
    }
  });
}

}  // namespace

// Per token: the aux part through the full softmax with c_e = d aux / d probs[n, e] =
// coeff * E * f_e / N (f_e constant): dl[e] = aux_scale * p_e (c_e - sum_e' p_e' c_e'). The
// routing weights' part: kSoftmaxOfSelected, through the selected softmax, dl[idx_j] +=
// w_j (dw_j - sum_i w_i dw_i); kSoftmaxOfAll, w_j = p[idx_j], through the full softmax,
// dl[e] += p_e (g_e - sum_j w_j dw_j) with g_e = dw_j where e = idx_j, else 0.
void router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                     const Tensor& topk_w, const Tensor& probs, const Tensor& counts, int64_t k,
                     double coeff, double aux_scale, const RouterSpec& spec) {
  const char* op = "router_backward";
  const RouterScore score = spec.score;
  const DType dt = cpu::float_dtype(op, "probs", probs, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  expect(op, "dlogits", dlogits, dt, {n, e});
  expect(op, "dtopk_w", dtopk_w, dt, {n, k});
  expect(op, "topk_w", topk_w, dt, {n, k});
  expect(op, "topk_idx", topk_idx, DType::kI32, {n, k});
  expect(op, "counts", counts, DType::kI32, {e});
  const int32_t* pi = topk_idx.data<int32_t>();
  cpu::expect_indices(op, "expert id", pi, n * k, e);
  if (spec.sigmoid()) {
    sigmoid_router_backward(dlogits, dtopk_w, topk_idx, probs, k, coeff, aux_scale, spec);
    return;
  }
  std::vector<double> c(static_cast<size_t>(e));
  const double nd = static_cast<double>(n);
  for (int64_t x = 0; x < e; ++x) {
    c[static_cast<size_t>(x)] = coeff * static_cast<double>(e) * counts.data<int32_t>()[x] /
                                (nd * static_cast<double>(k)) / nd;
  }
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *pdw = dtopk_w.data<T>(), *pw = topk_w.data<T>(), *pp = probs.data<T>();
    T* pdl = dlogits.data<T>();
    for (int64_t r = 0; r < n; ++r) {
      const T* p = pp + r * e;
      T* dl = pdl + r * e;
      double pc = 0;
      for (int64_t x = 0; x < e; ++x) pc += static_cast<double>(p[x]) * c[static_cast<size_t>(x)];
      for (int64_t x = 0; x < e; ++x) {
        dl[x] = static_cast<T>(aux_scale * p[x] * (c[static_cast<size_t>(x)] - pc));
      }
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(pw[r * k + j]) * pdw[r * k + j];
      if (score == RouterScore::kSoftmaxOfSelected) {
        for (int64_t j = 0; j < k; ++j) {
          dl[pi[r * k + j]] += static_cast<T>(pw[r * k + j] * (pdw[r * k + j] - dot));
        }
        continue;
      }
      for (int64_t x = 0; x < e; ++x) dl[x] += static_cast<T>(-static_cast<double>(p[x]) * dot);
      for (int64_t j = 0; j < k; ++j) {
        dl[pi[r * k + j]] += static_cast<T>(static_cast<double>(p[pi[r * k + j]]) * pdw[r * k + j]);
      }
    }
  });
}

// ---- token permutation ----

namespace {

// inv[slot] = the row of the expert-sorted order holding slot; throws unless perm is a
// permutation of [0, count).
std::vector<int32_t> invert_perm(const char* op, const Tensor& perm, int64_t count) {
  expect(op, "perm", perm, DType::kI32, {count});
  const int32_t* pp = perm.data<int32_t>();
  cpu::expect_indices(op, "perm entry", pp, count, count);
  std::vector<int32_t> inv(static_cast<size_t>(count), -1);
  for (int64_t i = 0; i < count; ++i) {
    int32_t& slot = inv[static_cast<size_t>(pp[i])];
    TANDEM_CHECK(slot < 0, op, ": perm holds slot ", pp[i], " twice (rows ", slot, " and ", i,
                 "); it must be a permutation");
    slot = static_cast<int32_t>(i);
  }
  return inv;
}

}  // namespace

void moe_permutation(const Tensor& perm, const Tensor& counts, const Tensor& topk_idx,
                     int64_t num_experts, const Tensor& expert_slot) {
  const char* op = "moe_permutation";
  cpu::expect_at_least(op, "num_experts", num_experts, 1);
  cpu::expect_rank(op, "topk_idx", topk_idx, 2);
  const int64_t nk = topk_idx.numel();
  expect(op, "topk_idx", topk_idx, DType::kI32, topk_idx.shape());
  expect(op, "perm", perm, DType::kI32, {nk});
  expect(op, "counts", counts, DType::kI32, {num_experts});
  const int32_t* pi = topk_idx.data<int32_t>();
  cpu::expect_indices(op, "expert id", pi, nk, num_experts);
  // The sort key of each expert: its place (Note [Expert placement]), or the expert itself.
  std::vector<int32_t> key(static_cast<size_t>(num_experts));
  for (int64_t x = 0; x < num_experts; ++x) key[static_cast<size_t>(x)] = static_cast<int32_t>(x);
  if (expert_slot.defined()) {
    expect(op, "expert_slot", expert_slot, DType::kI32, {num_experts});
    const int32_t* ps = expert_slot.data<int32_t>();
    cpu::expect_indices(op, "expert place", ps, num_experts, num_experts);
    std::vector<bool> seen(static_cast<size_t>(num_experts), false);
    for (int64_t x = 0; x < num_experts; ++x) {
      TANDEM_CHECK(!seen[static_cast<size_t>(ps[x])], op, ": expert_slot holds place ", ps[x],
                   " twice; it must be a permutation of [0, ", num_experts, ")");
      seen[static_cast<size_t>(ps[x])] = true;
      key[static_cast<size_t>(x)] = ps[x];
    }
  }
  int32_t* pc = counts.data<int32_t>();
  for (int64_t x = 0; x < num_experts; ++x) pc[x] = 0;
  for (int64_t s = 0; s < nk; ++s) ++pc[key[static_cast<size_t>(pi[s])]];
  // Counting sort: slots in flat order (token, then slot) land after their key's offset.
  std::vector<int64_t> next(static_cast<size_t>(num_experts), 0);
  for (int64_t x = 1; x < num_experts; ++x) {
    next[static_cast<size_t>(x)] = next[static_cast<size_t>(x - 1)] + pc[x - 1];
  }
  int32_t* pp = perm.data<int32_t>();
  for (int64_t s = 0; s < nk; ++s) {
    pp[next[static_cast<size_t>(key[static_cast<size_t>(pi[s])])]++] = static_cast<int32_t>(s);
  }
}

void permute_forward(const Tensor& out, const Tensor& x, const Tensor& perm, int64_t k) {
  const char* op = "permute_forward";
  const DType dt = cpu::float_dtype(op, "x", x, 2);
  cpu::expect_at_least(op, "k", k, 1);
  const int64_t n = x.size(0), h = x.size(1);
  expect(op, "out", out, dt, {n * k, h});
  invert_perm(op, perm, n * k);  // validates perm
  const int32_t* pp = perm.data<int32_t>();
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < n * k; ++i) {
      const T* src = px + (pp[i] / k) * h;
      for (int64_t c = 0; c < h; ++c) po[i * h + c] = src[c];
    }
  });
}

void permute_backward(const Tensor& dx, const Tensor& dout, const Tensor& perm, int64_t k,
                      Accumulate acc) {
  const char* op = "permute_backward";
  const DType dt = cpu::float_dtype(op, "dx", dx, 2);
  cpu::expect_at_least(op, "k", k, 1);
  const int64_t n = dx.size(0), h = dx.size(1);
  expect(op, "dout", dout, dt, {n * k, h});
  const std::vector<int32_t> inv = invert_perm(op, perm, n * k);
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pd = dout.data<T>();
    T* px = dx.data<T>();
    // Each token sums its k rows in slot order (fixed, so reproducible).
    for (int64_t t = 0; t < n; ++t) {
      T* dst = px + t * h;
      if (acc == Accumulate::kOverwrite) {
        for (int64_t c = 0; c < h; ++c) dst[c] = T(0);
      }
      for (int64_t j = 0; j < k; ++j) {
        const T* src = pd + inv[static_cast<size_t>(t * k + j)] * h;
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
  expect(op, "y", y, dt, {n * k, h});
  const std::vector<int32_t> inv = invert_perm(op, perm, n * k);
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *py = y.data<T>(), *pw = topk_w.data<T>();
    T* po = out.data<T>();
    for (int64_t t = 0; t < n; ++t) {
      T* dst = po + t * h;
      for (int64_t j = 0; j < k; ++j) {
        const T w = pw[t * k + j];
        const T* src = py + inv[static_cast<size_t>(t * k + j)] * h;
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
  expect(op, "y", y, dt, {n * k, h});
  expect(op, "dy", dy, dt, {n * k, h});
  invert_perm(op, perm, n * k);  // validates perm: every slot of dtopk_w is written once below
  const int32_t* pp = perm.data<int32_t>();
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *pd = dout.data<T>(), *py = y.data<T>(), *pw = topk_w.data<T>();
    T *pdy = dy.data<T>(), *pdw = dtopk_w.data<T>();
    for (int64_t i = 0; i < n * k; ++i) {
      const int64_t slot = pp[i];
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
