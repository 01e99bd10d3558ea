// CPU routers: the top-k of RouterSpec with its routing weights, the random logits of
// --moe-router-force-load-balancing, and the router's losses (RouterLoss: Megatron-LM's
// load-balancing losses and z-loss) with their gradients. Every loop runs in a fixed order:
// results are bitwise reproducible.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "core/rng.h"
#include "ops/cpu/common.h"
#include "ops/cpu/cpu_ops.h"

namespace tandem::ops::cpu {

using cpu::expect;

namespace {

// Top-k of one row of e values into idx[k]: descending, ties to the lower index (strict >).
template <typename T>
void row_topk(int32_t* idx, const T* values, int64_t e, int64_t k, std::vector<char>& taken) {
  taken.assign(static_cast<size_t>(e), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t c = 0; c < e; ++c) {
      if (taken[static_cast<size_t>(c)]) continue;
      if (best < 0 || values[c] > values[best]) best = c;
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

// logsumexp of one row, in double.
template <typename T>
double row_lse(const T* logits, int64_t e) {
  double mx = -INFINITY;
  for (int64_t c = 0; c < e; ++c) mx = std::max(mx, static_cast<double>(logits[c]));
  double sum = 0;
  for (int64_t c = 0; c < e; ++c) sum += std::exp(static_cast<double>(logits[c]) - mx);
  return mx + std::log(sum);
}

template <typename T>
double row_sum(const T* p, int64_t e) {
  double s = 0;
  for (int64_t x = 0; x < e; ++x) s += static_cast<double>(p[x]);
  return s;
}

// DeepSeek-V3's choice for one row (RouterSpec): the biased scores, the groups' values (the sum
// of each group's two best), the group_topk best groups kept and the others' experts out of the
// choice (-inf, as Megatron-LM masks them), then the top-k. choice: [e] workspace.
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
      if (!keep[static_cast<size_t>(c / size)]) choice[static_cast<size_t>(c)] = -INFINITY;
    }
  }
  row_topk(idx, choice.data(), e, k, taken);
}

void check_router_spec(const char* op, const RouterSpec& spec, int64_t e, int64_t k) {
  if (spec.groups > 0) {
    TANDEM_CHECK(spec.sigmoid() && e % spec.groups == 0 && e / spec.groups >= 2 &&
                     spec.group_topk >= 1 && spec.group_topk <= spec.groups &&
                     k <= spec.group_topk * (e / spec.groups),
                 op, ": groups ", spec.groups, ", group_topk ", spec.group_topk, " do not fit ", e,
                 " experts and k = ", k);
  }
  TANDEM_CHECK(spec.sigmoid() || spec.scaling == 1.0, op,
               ": a scaling of the weights needs sigmoid scores");
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
  check_router_spec(op, spec, e, k);
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

void router_random_logits(const Tensor& logits, uint64_t key, int64_t first_row) {
  const char* op = "router_random_logits";
  const DType dt = cpu::float_dtype(op, "logits", logits, 2);
  cpu::expect_at_least(op, "first_row", first_row, 0);
  const int64_t n = logits.size(0), e = logits.size(1);
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    T* pl = logits.data<T>();
    for (int64_t i = 0; i < n * e; ++i) {
      pl[i] = static_cast<T>(normal01(key, static_cast<uint64_t>(first_row * e + i)));
    }
  });
}

void router_load_add(const Tensor& load, const Tensor& counts, const Tensor& expert_slot) {
  const char* op = "router_load_add";
  cpu::expect_rank(op, "counts", counts, 1);
  const int64_t e = counts.numel();
  expect(op, "counts", counts, DType::kI32, {e});
  expect(op, "load", load, DType::kF32, {e});
  const int32_t* slot = nullptr;
  if (expert_slot.defined()) {
    expect(op, "expert_slot", expert_slot, DType::kI32, {e});
    slot = expert_slot.data<int32_t>();
    cpu::expect_indices(op, "expert place", slot, e, e);
  }
  float* pl = load.data<float>();
  const int32_t* pc = counts.data<int32_t>();
  for (int64_t c = 0; c < e; ++c) pl[c] += static_cast<float>(pc[slot ? slot[c] : c]);
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

void router_aux_counts(const Tensor& counts, const Tensor& probs, int64_t k) {
  const char* op = "router_aux_counts";
  const DType dt = cpu::float_dtype(op, "probs", probs, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  cpu::expect_rank(op, "counts", counts, 2);
  const int64_t g = counts.size(0);
  expect(op, "counts", counts, dt, {g, e});
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  TANDEM_CHECK(g >= 1 && n % g == 0, op, ": ", n, " rows do not split into ", g, " groups");
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pp = probs.data<T>();
    T* pc = counts.data<T>();
    std::fill(pc, pc + g * e, T(0));
    std::vector<int32_t> idx(static_cast<size_t>(k));
    std::vector<char> taken;
    for (int64_t r = 0; r < n; ++r) {
      row_topk(idx.data(), pp + r * e, e, k, taken);
      for (const int32_t x : idx) pc[(r / (n / g)) * e + x] += T(1);
    }
  });
}

void router_aux_running_mean(const Tensor& counts, const Tensor& total) {
  const char* op = "router_aux_running_mean";
  const DType dt = cpu::float_dtype(op, "counts", counts, 2);
  const int64_t e = counts.size(1);
  expect(op, "counts", counts, dt, {1, e});
  expect(op, "total", total, DType::kF64, {e + 1});
  double* pt = total.data<double>();
  pt[e] += 1;
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    T* pc = counts.data<T>();
    for (int64_t x = 0; x < e; ++x) {
      pt[x] += static_cast<double>(pc[x]);
      pc[x] = static_cast<T>(pt[x] / pt[e]);
    }
  });
}

namespace {

// Checks router_loss_start's and router_backward's loss tensors against probs [n, e]; returns
// the groups of counts (0 without a load-balancing term).
int64_t check_router_loss(const char* op, const Tensor& probs, const Tensor& counts,
                          const Tensor& logits, const RouterLoss& loss) {
  const int64_t n = probs.size(0), e = probs.size(1);
  int64_t g = 0;
  if (loss.balance != 0) {
    cpu::expect_rank(op, "counts", counts, 2);
    g = counts.size(0);
    expect(op, "counts", counts, probs.dtype(), {g, e});
    TANDEM_CHECK(g >= 1 && n % g == 0, op, ": ", n, " rows do not split into ", g, " groups");
  }
  if (loss.z != 0) expect(op, "logits", logits, probs.dtype(), {n, e});
  return g;
}

}  // namespace

PendingScalar router_loss_start(const Tensor& probs, const Tensor& counts, const Tensor& logits,
                                const RouterLoss& loss) {
  const char* op = "router_loss";
  const DType dt = cpu::float_dtype(op, "probs", probs, 2);
  const int64_t g = check_router_loss(op, probs, counts, logits, loss);
  const int64_t n = probs.size(0), e = probs.size(1);
  if (n == 0) return PendingScalar(0.0);
  return PendingScalar(cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* pp = probs.data<T>();
    double balance = 0, z = 0;
    if (g > 0) {
      const T* pc = counts.data<T>();
      std::vector<double> sums(static_cast<size_t>(e));  // sum over the group's rows of q
      for (int64_t b = 0; b < g; ++b) {
        std::fill(sums.begin(), sums.end(), 0.0);
        for (int64_t r = b * (n / g); r < (b + 1) * (n / g); ++r) {
          const double scale = loss.normalized ? 1.0 / (row_sum(pp + r * e, e) + 1e-20) : 1.0;
          for (int64_t x = 0; x < e; ++x) {
            sums[static_cast<size_t>(x)] += static_cast<double>(pp[r * e + x]) * scale;
          }
        }
        for (int64_t x = 0; x < e; ++x) {
          balance += static_cast<double>(pc[b * e + x]) * sums[static_cast<size_t>(x)];
        }
      }
    }
    if (loss.z != 0) {
      for (int64_t r = 0; r < n; ++r) {
        const double l = row_lse(logits.data<T>() + r * e, e);
        z += l * l;
      }
    }
    return loss.balance * balance + loss.z * z;
  }));
}

namespace {

// The routing weights' gradient of one row into dl (overwritten) from dw = d topk_w: the
// softmax router's (kSoftmaxOfSelected through the k chosen logits' softmax, dl[idx_j] =
// w_j (dw_j - sum_i w_i dw_i); kSoftmaxOfAll, w_j = p[idx_j], through the full softmax, dl[x] =
// p_x (g_x - sum_j w_j dw_j), g_x = dw_j where x = idx_j, else 0), or the sigmoid router's into
// ds (added; d of the sigmoid scores s): w_j = a s_j / S (S = the chosen scores' sum + 1e-20; S =
// 1 when not normalised), so ds_j += a (dw_j / S - sum_i dw_i s_i / S^2) (a dw_j not normalised).
template <typename T>
void weights_backward(double* dl, double* ds, const T* dw, const T* w, const int32_t* idx,
                      const T* p, int64_t e, int64_t k, const RouterSpec& spec) {
  if (spec.sigmoid()) {
    const bool normalized = spec.score == RouterScore::kSigmoidNormalized;
    double sum = 1e-20, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      sum += static_cast<double>(p[idx[j]]);
      dot += static_cast<double>(dw[j]) * p[idx[j]];
    }
    for (int64_t j = 0; j < k; ++j) {
      ds[idx[j]] +=
          normalized ? spec.scaling * (dw[j] / sum - dot / (sum * sum)) : spec.scaling * dw[j];
    }
    return;
  }
  double dot = 0;
  for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(w[j]) * dw[j];
  if (spec.score == RouterScore::kSoftmaxOfSelected) {
    for (int64_t j = 0; j < k; ++j) dl[idx[j]] += static_cast<double>(w[j]) * (dw[j] - dot);
    return;
  }
  for (int64_t x = 0; x < e; ++x) dl[x] += -static_cast<double>(p[x]) * dot;
  for (int64_t j = 0; j < k; ++j) dl[idx[j]] += static_cast<double>(p[idx[j]]) * dw[j];
}

}  // namespace

// Per row n of group b: the load-balancing term's gradient at the scores q is
// gq_x = loss_scale * balance * counts[b, x]. Softmax: q = p = softmax(logits), dl_x +=
// p_x (gq_x - sum_x' p_x' gq_x'). Sigmoid: q = s / (sum s + 1e-20), ds_x += (gq_x - sum_x' gq_x'
// q_x') / (sum s + 1e-20), and dl = ds s (1 - s). The z-loss adds loss_scale * z * 2 lse(l) *
// softmax(l)_x, l the row's logits.
void router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                     const Tensor& topk_w, const Tensor& probs, const Tensor& counts,
                     const Tensor& logits, const RouterSpec& spec, const RouterLoss& loss,
                     double loss_scale) {
  const char* op = "router_backward";
  const DType dt = cpu::float_dtype(op, "probs", probs, 2);
  const int64_t n = probs.size(0), e = probs.size(1);
  cpu::expect_rank(op, "topk_idx", topk_idx, 2);
  const int64_t k = topk_idx.size(1);
  TANDEM_CHECK(k >= 1 && k <= e, op, ": k = ", k, " must lie in [1, ", e, "] (the experts)");
  expect(op, "dlogits", dlogits, dt, {n, e});
  expect(op, "dtopk_w", dtopk_w, dt, {n, k});
  expect(op, "topk_w", topk_w, dt, {n, k});
  expect(op, "topk_idx", topk_idx, DType::kI32, {n, k});
  const int32_t* pi = topk_idx.data<int32_t>();
  cpu::expect_indices(op, "expert id", pi, n * k, e);
  check_router_spec(op, spec, e, k);
  const int64_t g = check_router_loss(op, probs, counts, logits, loss);
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T *pdw = dtopk_w.data<T>(), *pw = topk_w.data<T>(), *pp = probs.data<T>();
    const T* pc = g > 0 ? counts.data<T>() : nullptr;
    T* pdl = dlogits.data<T>();
    std::vector<double> dl(static_cast<size_t>(e)), ds(static_cast<size_t>(e)),
        gq(static_cast<size_t>(e));
    for (int64_t r = 0; r < n; ++r) {
      const T* p = pp + r * e;
      std::fill(dl.begin(), dl.end(), 0.0);
      std::fill(ds.begin(), ds.end(), 0.0);
      if (pc != nullptr) {
        const T* c = pc + (r / (n / g)) * e;
        for (int64_t x = 0; x < e; ++x) gq[x] = loss_scale * loss.balance * c[x];
        const double sum = loss.normalized ? row_sum(p, e) + 1e-20 : 1.0;
        double dot = 0;
        for (int64_t x = 0; x < e; ++x) dot += gq[x] * static_cast<double>(p[x]) / sum;
        for (int64_t x = 0; x < e; ++x) {
          if (spec.sigmoid()) {
            ds[x] += (gq[x] - dot) / sum;
          } else {
            dl[x] += static_cast<double>(p[x]) * (gq[x] - dot);
          }
        }
      }
      weights_backward(dl.data(), ds.data(), pdw + r * k, pw + r * k, pi + r * k, p, e, k, spec);
      if (spec.sigmoid()) {
        for (int64_t x = 0; x < e; ++x) {
          const double s = p[x];
          dl[x] += ds[x] * s * (1 - s);
        }
      }
      if (loss.z != 0) {
        const T* l = logits.data<T>() + r * e;
        const double lse = row_lse(l, e);
        for (int64_t x = 0; x < e; ++x) {
          dl[x] += loss_scale * loss.z * 2 * lse * std::exp(static_cast<double>(l[x]) - lse);
        }
      }
      for (int64_t x = 0; x < e; ++x) pdl[r * e + x] = static_cast<T>(dl[x]);
    }
  });
}

}  // namespace tandem::ops::cpu
