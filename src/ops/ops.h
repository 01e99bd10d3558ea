// Every op of the model, forward and backward, one declaration each; the device of the tensors
// picks the backend (cpu/ now; cuda/ later). Ops never allocate their outputs: callers pass them.
// Argument order: outputs, inputs, then scalars. Float tensors are f32 or f64 (all of one op's
// float tensors share a dtype); index tensors are i32. Activations are row-major [N, C] with
// N = batch * seq tokens, token n at position n % seq of sequence n / seq.
// Weights are stored as Hugging Face does, [out, in]: y = x @ W^T.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::ops {

// Whether an op adds into its output or overwrites it.
enum class Accumulate : uint8_t { kOverwrite, kAdd };

// ---- elementwise and reductions ----
// y (+)= alpha * x, same shape.
void axpy(const Tensor& y, const Tensor& x, double alpha, Accumulate acc = Accumulate::kAdd);
// x *= alpha.
void scale(const Tensor& x, double alpha);
// Sum of squares of all elements, accumulated in double.
double sum_squares(const Tensor& x);
// True when every element is finite.
bool all_finite(const Tensor& x);

// ---- embedding ----
// out[n, :] = table[ids[n], :].   out: [N, H]; ids: [N] i32; table: [V, H].
// Throws tandem::Error when an id is outside [0, V).
void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table);
// dtable[ids[n], :] += dout[n, :].   dtable: [V, H]; dout: [N, H]; ids: [N].
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids);

// ---- rmsnorm: y = x / sqrt(mean(x^2) + eps) * g ----
// y: [N, H]; rstd: [N] (1 / sqrt(mean(x^2) + eps), saved for backward); x: [N, H]; g: [H].
void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& g,
                     double eps);
// dx (+)= d/dx, dg += d/dg.   dx: [N, H]; dg: [H]; dy, x: [N, H]; g: [H]; rstd: [N].
void rmsnorm_backward(const Tensor& dx, const Tensor& dg, const Tensor& dy, const Tensor& x,
                      const Tensor& g, const Tensor& rstd, Accumulate acc_dx);

// ---- linear (no bias): y = x @ w^T, through BLAS ----
// y: [M, out]; x: [M, in]; w: [out, in].
void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w,
                    Accumulate acc = Accumulate::kOverwrite);
// dx (+)= dy @ w.   dx: [M, in]; dy: [M, out]; w: [out, in].
void linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w,
                           Accumulate acc = Accumulate::kOverwrite);
// dw (+)= dy^T @ x.   dw: [out, in]; dy: [M, out]; x: [M, in].
void linear_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x,
                            Accumulate acc = Accumulate::kAdd);

// ---- rotary embedding, HF rotate_half form (MODEL.md) ----
// out = rope(x) for x: [N, heads * D] with position n % seq; out may alias x.
void rope_forward(const Tensor& out, const Tensor& x, int64_t seq, int64_t heads,
                  int64_t head_dim, double theta);
// dx = rope^T(dy) (the inverse rotation); dx may alias dy.
void rope_backward(const Tensor& dx, const Tensor& dy, int64_t seq, int64_t heads,
                   int64_t head_dim, double theta);

// ---- causal attention with grouped-query heads, scale 1/sqrt(D) ----
// out: [N, heads*D]; lse: [batch, heads, seq] (log-sum-exp of each query row, for backward);
// q: [N, heads*D]; k, v: [N, kv_heads*D]; N = batch*seq. Query head h uses KV head
// h / (heads / kv_heads).
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
};
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionShape& s);
// dq, dk, dv overwritten. Inputs as saved by the forward, plus dout: [N, heads*D].
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionShape& s);

// ---- SwiGLU: out = silu(gate) * up ----
// out, gate, up: [M, F].
void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up);
// dgate, dup overwritten; dout, gate, up: [M, F].
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                     const Tensor& gate, const Tensor& up);

// ---- router (Mixtral): top-k of the logits, softmax over the selected; switch aux loss ----
// topk_idx: [N, k] i32, expert ids in descending logit order (ties: lower index first);
// topk_w: [N, k] softmax of the selected logits; probs: [N, E] softmax over all E (for the aux
// loss); logits: [N, E].
void router_forward(const Tensor& topk_idx, const Tensor& topk_w, const Tensor& probs,
                    const Tensor& logits);
// Tokens routed to each expert: counts: [E] i32 (overwritten) from topk_idx: [N, k].
void router_counts(const Tensor& counts, const Tensor& topk_idx);
// aux = coeff * E * sum_e f_e * P_e, f_e = counts[e] / (N*k), P_e = mean_n probs[n, e].
double router_aux_loss(const Tensor& probs, const Tensor& counts, int64_t k, double coeff);
// dlogits (overwritten): gradient through the selected softmax from dtopk_w: [N, k], plus
// aux_scale times the gradient of the aux loss (aux_scale = d total loss / d aux).
void router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                     const Tensor& topk_w, const Tensor& probs, const Tensor& counts, int64_t k,
                     double coeff, double aux_scale);

// ---- token permutation by expert (dropless) ----
// perm: [N*k] i32, the flat slot (n*k + j) held at each row of the expert-sorted order, stable
// (experts ascending, then token order, then slot); counts: [E] i32 rows per expert.
void moe_permutation(const Tensor& perm, const Tensor& counts, const Tensor& topk_idx,
                     int64_t num_experts);
// out[i, :] = x[perm[i] / k, :].   out: [N*k, H]; x: [N, H].
void permute_forward(const Tensor& out, const Tensor& x, const Tensor& perm, int64_t k);
// dx (+)= sum of dout rows that came from each token.   dx: [N, H]; dout: [N*k, H].
void permute_backward(const Tensor& dx, const Tensor& dout, const Tensor& perm, int64_t k,
                      Accumulate acc = Accumulate::kOverwrite);
// out[n, :] += sum_j topk_w[n, j] * y[row of slot n*k+j, :].   out: [N, H]; y: [N*k, H].
void combine_forward(const Tensor& out, const Tensor& y, const Tensor& perm, const Tensor& topk_w);
// dy[i, :] = topk_w[slot] * dout[token]; dtopk_w[n, j] = <dout[n], y[row]>. dy: [N*k, H];
// dtopk_w: [N, k]; both overwritten.
void combine_backward(const Tensor& dy, const Tensor& dtopk_w, const Tensor& dout, const Tensor& y,
                      const Tensor& perm, const Tensor& topk_w);

// ---- cross-entropy over the vocabulary ----
// Returns the sum over rows of -log softmax(logits)[target]; logits: [N, V]; targets: [N] i32.
// Throws tandem::Error for a target outside [0, V).
double cross_entropy_forward(const Tensor& logits, const Tensor& targets);
// dlogits = (softmax(logits) - onehot(target)) * scale; dlogits may alias logits.
void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            double scale);

// ---- optimizer ----
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};
// Decoupled weight decay (PyTorch's AdamW): p -= lr*wd*p; then the Adam update. All f32/f64,
// same shape.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWParams& hp);

}  // namespace tandem::ops
