// The device dispatch of ops.h: each op runs on the device of its first tensor (the backend
// checks that the others are there too). Written out from op_decls.inc, one function per op.
#include <cmath>
#include <string>

#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#if TANDEM_WITH_CUDA
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_ops.h"
#endif

namespace tandem::ops {

#if TANDEM_WITH_CUDA
#define TANDEM_OP(first, name, ...)                                                           \
  if ((first).defined() && (first).device() == Device::kCUDA) return cuda::name(__VA_ARGS__); \
  return cpu::name(__VA_ARGS__)
#else
#define TANDEM_OP(first, name, ...) return cpu::name(__VA_ARGS__)
#endif

Lanes::Lanes(const Tensor& on) : cuda_(on.defined() && on.device() == Device::kCUDA) {
#if TANDEM_WITH_CUDA
  // The fork point is here, before piece 0 adds work to the current stream (lane 0).
  if (cuda_) cuda::lane_mark();
#endif
}

Lanes::~Lanes() {
  if (joined_) return;
  try {  // unwinding from a piece's error: the error that is already on its way matters
    join();
  } catch (...) {
  }
}

int Lanes::count() { return static_cast<int>(tuning().expert_lanes); }

void Lanes::run(int64_t piece, const std::function<void()>& fn) {
  const int lane = cuda_ ? static_cast<int>(piece % count()) : 0;
#if TANDEM_WITH_CUDA
  if (cuda_ && lane != 0) {
    if ((forked_ & (1u << lane)) == 0) {
      cuda::lane_fork(lane);
      forked_ |= 1u << lane;
    }
    cuda::lane_run(lane, fn);
    return;
  }
#endif
  (void)lane;
  fn();
}

bool grouped_expert_phase(ExpertPhase phase, int64_t rows, int64_t experts) {
  // Note [Grouped expert products].
  const std::string& chosen = tuning().expert_grouped;
  if (chosen == "auto") return rows < kGroupedRowsBelow * experts;
  return chosen.find(phase == ExpertPhase::kForward ? "forward" : "input") != std::string::npos;
}

void check_tuning([[maybe_unused]] const Tuning& t) {
#if TANDEM_WITH_CUDA
  cuda::check_attention_variants(t);
#endif
}

void Lanes::join() {
  joined_ = true;
#if TANDEM_WITH_CUDA
  for (int lane = 1; lane < kMaxLanes; ++lane) {
    if (forked_ & (1u << lane)) cuda::lane_join(lane);
  }
#endif
  forked_ = 0;
}

void axpy(const Tensor& y, const Tensor& x, double alpha, Accumulate acc) {
  TANDEM_OP(y, axpy, y, x, alpha, acc);
}

void scale(const Tensor& x, double alpha) { TANDEM_OP(x, scale, x, alpha); }

PendingScalar sum_squares_start(const Tensor& x) { TANDEM_OP(x, sum_squares_start, x); }

bool all_finite(const Tensor& x) { TANDEM_OP(x, all_finite, x); }

void convert(const Tensor& dst, const Tensor& src) { TANDEM_OP(dst, convert, dst, src); }

void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table, IdCheck check) {
  TANDEM_OP(out, embedding_forward, out, ids, table, check);
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  TANDEM_OP(dtable, embedding_backward, dtable, dout, ids);
}

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& g,
                     double eps) {
  TANDEM_OP(y, rmsnorm_forward, y, rstd, x, g, eps);
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dg, const Tensor& dy, const Tensor& x,
                      const Tensor& g, const Tensor& rstd, Accumulate acc_dx) {
  TANDEM_OP(dx, rmsnorm_backward, dx, dg, dy, x, g, rstd, acc_dx);
}

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, Accumulate acc) {
  TANDEM_OP(y, linear_forward, y, x, w, acc);
}

void linear_forward_residual(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& r) {
  TANDEM_OP(y, linear_forward_residual, y, x, w, r);
}

void linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w, Accumulate acc) {
  TANDEM_OP(dx, linear_backward_input, dx, dy, w, acc);
}

void linear_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, Accumulate acc) {
  TANDEM_OP(dw, linear_backward_weight, dw, dy, x, acc);
}

void grouped_linear_forward(const Tensor& y, const Tensor& x, const std::vector<Tensor>& w,
                            const std::vector<int32_t>& rows) {
  TANDEM_OP(y, grouped_linear_forward, y, x, w, rows);
}

void grouped_linear_backward_input(const Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w,
                                   const std::vector<int32_t>& rows) {
  TANDEM_OP(dx, grouped_linear_backward_input, dx, dy, w, rows);
}

void bias_forward(const Tensor& y, const Tensor& b) { TANDEM_OP(y, bias_forward, y, b); }

void bias_backward(const Tensor& db, const Tensor& dy) { TANDEM_OP(db, bias_backward, db, dy); }

void sigmoid_gate_forward(const Tensor& y, const Tensor& gate, const Tensor& z,
                          const Tensor& logit) {
  TANDEM_OP(y, sigmoid_gate_forward, y, gate, z, logit);
}

void sigmoid_gate_backward(const Tensor& dz, const Tensor& dlogit, const Tensor& dy,
                           const Tensor& z, const Tensor& gate) {
  TANDEM_OP(dz, sigmoid_gate_backward, dz, dlogit, dy, z, gate);
}

void rope_forward(const Tensor& out, const Tensor& x, int64_t seq, int64_t heads, int64_t head_dim,
                  const RopeSpec& rope) {
  TANDEM_OP(out, rope_forward, out, x, seq, heads, head_dim, rope);
}

void rope_backward(const Tensor& dx, const Tensor& dy, int64_t seq, int64_t heads, int64_t head_dim,
                   const RopeSpec& rope) {
  TANDEM_OP(dx, rope_backward, dx, dy, seq, heads, head_dim, rope);
}

void rope_forward_qk(const Tensor& q, const Tensor& k, int64_t seq, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, const RopeSpec& rope) {
  TANDEM_OP(q, rope_forward_qk, q, k, seq, heads, kv_heads, head_dim, rope);
}

void rope_backward_qk(const Tensor& dq, const Tensor& dk, int64_t seq, int64_t heads,
                      int64_t kv_heads, int64_t head_dim, const RopeSpec& rope) {
  TANDEM_OP(dq, rope_backward_qk, dq, dk, seq, heads, kv_heads, head_dim, rope);
}

void mla_qkv_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_in,
                     const Tensor& kv, const Tensor& k_rope, int64_t seq, int64_t heads,
                     int64_t nope_dim, int64_t rope_dim, int64_t v_dim, const RopeSpec& rope) {
  TANDEM_OP(q, mla_qkv_forward, q, k, v, q_in, kv, k_rope, seq, heads, nope_dim, rope_dim, v_dim,
            rope);
}

void mla_qkv_backward(const Tensor& d_q_in, const Tensor& d_kv, const Tensor& d_k_rope,
                      const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq,
                      int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim,
                      const RopeSpec& rope) {
  TANDEM_OP(d_q_in, mla_qkv_backward, d_q_in, d_kv, d_k_rope, dq, dk, dv, seq, heads, nope_dim,
            rope_dim, v_dim, rope);
}

// The document-masking ops (Note [Document masking] in data/document_masks.h): undefined
// positions or loss mask, the op each extends.
void rope_forward_qk_at(const Tensor& q, const Tensor& k, int64_t seq, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, const RopeSpec& rope,
                        const Tensor& positions) {
  if (!positions.defined()) return rope_forward_qk(q, k, seq, heads, kv_heads, head_dim, rope);
  TANDEM_OP(q, rope_forward_qk_at, q, k, seq, heads, kv_heads, head_dim, rope, positions);
}

void rope_backward_qk_at(const Tensor& dq, const Tensor& dk, int64_t seq, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, const RopeSpec& rope,
                         const Tensor& positions) {
  if (!positions.defined()) return rope_backward_qk(dq, dk, seq, heads, kv_heads, head_dim, rope);
  TANDEM_OP(dq, rope_backward_qk_at, dq, dk, seq, heads, kv_heads, head_dim, rope, positions);
}

void mla_qkv_forward_at(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_in,
                        const Tensor& kv, const Tensor& k_rope, int64_t seq, int64_t heads,
                        int64_t nope_dim, int64_t rope_dim, int64_t v_dim, const RopeSpec& rope,
                        const Tensor& positions) {
  if (!positions.defined()) {
    return mla_qkv_forward(q, k, v, q_in, kv, k_rope, seq, heads, nope_dim, rope_dim, v_dim, rope);
  }
  TANDEM_OP(q, mla_qkv_forward_at, q, k, v, q_in, kv, k_rope, seq, heads, nope_dim, rope_dim, v_dim,
            rope, positions);
}

void mla_qkv_backward_at(const Tensor& d_q_in, const Tensor& d_kv, const Tensor& d_k_rope,
                         const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq,
                         int64_t heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim,
                         const RopeSpec& rope, const Tensor& positions) {
  if (!positions.defined()) {
    return mla_qkv_backward(d_q_in, d_kv, d_k_rope, dq, dk, dv, seq, heads, nope_dim, rope_dim,
                            v_dim, rope);
  }
  TANDEM_OP(d_q_in, mla_qkv_backward_at, d_q_in, d_kv, d_k_rope, dq, dk, dv, seq, heads, nope_dim,
            rope_dim, v_dim, rope, positions);
}

double cross_entropy_forward_masked(const Tensor& logits, const Tensor& targets,
                                    const Tensor& loss_mask) {
  if (!loss_mask.defined()) return cross_entropy_forward(logits, targets);
  TANDEM_OP(logits, cross_entropy_forward_masked, logits, targets, loss_mask);
}

void cross_entropy_backward_masked(const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, double scale, const Tensor& loss_mask) {
  if (!loss_mask.defined()) return cross_entropy_backward(dlogits, logits, targets, scale);
  TANDEM_OP(dlogits, cross_entropy_backward_masked, dlogits, logits, targets, scale, loss_mask);
}

double lm_head_ce_forward_masked(const Tensor& lse, const Tensor& x, const Tensor& w,
                                 const Tensor& targets, const Tensor& loss_mask) {
  if (!loss_mask.defined()) return lm_head_ce_forward(lse, x, w, targets);
  TANDEM_OP(x, lm_head_ce_forward_masked, lse, x, w, targets, loss_mask);
}

void lm_head_ce_backward_masked(const Tensor& dx, const Tensor& dw, const Tensor& x,
                                const Tensor& w, const Tensor& targets, const Tensor& lse,
                                double scale, const Tensor& loss_mask, Accumulate acc_dw) {
  if (!loss_mask.defined()) return lm_head_ce_backward(dx, dw, x, w, targets, lse, scale, acc_dw);
  TANDEM_OP(x, lm_head_ce_backward_masked, dx, dw, x, w, targets, lse, scale, loss_mask, acc_dw);
}

PendingScalar lm_head_ce_forward_backward_masked(const Tensor& dx, const Tensor& dw,
                                                 const Tensor& lse, const Tensor& x,
                                                 const Tensor& w, const Tensor& targets,
                                                 double scale, const Tensor& loss_mask,
                                                 Accumulate acc_dw) {
  if (!loss_mask.defined()) {
    return lm_head_ce_forward_backward(dx, dw, lse, x, w, targets, scale, acc_dw);
  }
  TANDEM_OP(x, lm_head_ce_forward_backward_masked, dx, dw, lse, x, w, targets, scale, loss_mask,
            acc_dw);
}

double AttentionShape::softmax_scale() const {
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionShape& s) {
  TANDEM_OP(out, attention_forward, out, lse, q, k, v, s);
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionShape& s) {
  TANDEM_OP(dq, attention_backward, dq, dk, dv, dout, q, k, v, out, lse, s);
}

void swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  TANDEM_OP(out, swiglu_forward, out, gate_up);
}

void swiglu_backward(const Tensor& d_gate_up, const Tensor& dout, const Tensor& gate_up) {
  TANDEM_OP(d_gate_up, swiglu_backward, d_gate_up, dout, gate_up);
}

void router_forward(const Tensor& topk_idx, const Tensor& topk_w, const Tensor& probs,
                    const Tensor& logits, const RouterSpec& spec, const Tensor& bias) {
  TANDEM_OP(topk_idx, router_forward, topk_idx, topk_w, probs, logits, spec, bias);
}

void router_random_logits(const Tensor& logits, uint64_t key, int64_t first_row) {
  TANDEM_OP(logits, router_random_logits, logits, key, first_row);
}

void router_load_add(const Tensor& load, const Tensor& counts, const Tensor& expert_slot) {
  TANDEM_OP(load, router_load_add, load, counts, expert_slot);
}

void router_counts(const Tensor& counts, const Tensor& topk_idx) {
  TANDEM_OP(counts, router_counts, counts, topk_idx);
}

void router_aux_counts(const Tensor& counts, const Tensor& probs, int64_t k) {
  TANDEM_OP(counts, router_aux_counts, counts, probs, k);
}

void router_aux_running_mean(const Tensor& counts, const Tensor& total) {
  TANDEM_OP(counts, router_aux_running_mean, counts, total);
}

PendingScalar router_loss_start(const Tensor& probs, const Tensor& counts, const Tensor& logits,
                                const RouterLoss& loss) {
  TANDEM_OP(probs, router_loss_start, probs, counts, logits, loss);
}

void router_backward(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& topk_idx,
                     const Tensor& topk_w, const Tensor& probs, const Tensor& counts,
                     const Tensor& logits, const RouterSpec& spec, const RouterLoss& loss,
                     double loss_scale) {
  TANDEM_OP(dlogits, router_backward, dlogits, dtopk_w, topk_idx, topk_w, probs, counts, logits,
            spec, loss, loss_scale);
}

void moe_permutation(const Tensor& perm, const Tensor& counts, const Tensor& topk_idx,
                     const Tensor& topk_w, int64_t num_experts, const Tensor& expert_slot,
                     const MoeCapacity& cap) {
  TANDEM_OP(perm, moe_permutation, perm, counts, topk_idx, topk_w, num_experts, expert_slot, cap);
}

void permute_forward(const Tensor& out, const Tensor& x, const Tensor& perm, int64_t k) {
  TANDEM_OP(out, permute_forward, out, x, perm, k);
}

void permute_backward(const Tensor& dx, const Tensor& dout, const Tensor& perm, int64_t k,
                      Accumulate acc) {
  TANDEM_OP(dx, permute_backward, dx, dout, perm, k, acc);
}

void copy_row_blocks(const Tensor& out, const Tensor& in, const std::vector<RowBlock>& blocks) {
  TANDEM_OP(out, copy_row_blocks, out, in, blocks);
}

void combine_forward(const Tensor& out, const Tensor& y, const Tensor& perm, const Tensor& topk_w) {
  TANDEM_OP(out, combine_forward, out, y, perm, topk_w);
}

void combine_backward(const Tensor& dy, const Tensor& dtopk_w, const Tensor& dout, const Tensor& y,
                      const Tensor& perm, const Tensor& topk_w) {
  TANDEM_OP(dy, combine_backward, dy, dtopk_w, dout, y, perm, topk_w);
}

double cross_entropy_forward(const Tensor& logits, const Tensor& targets) {
  TANDEM_OP(logits, cross_entropy_forward, logits, targets);
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            double scale) {
  TANDEM_OP(dlogits, cross_entropy_backward, dlogits, logits, targets, scale);
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWParams& hp) {
  TANDEM_OP(param, adamw_step, param, grad, m, v, hp);
}

void adamw_step_flat(const Tensor& param, const Tensor& m, const Tensor& v,
                     const Tensor& param_bf16, const Tensor& grad,
                     const std::vector<int64_t>& decayed, double grad_scale,
                     const AdamWParams& hp) {
  // The weight-decay ranges, checked once for both backends: ascending [begin, end) pairs.
  TANDEM_CHECK(decayed.size() % 2 == 0, "adamw_step_flat: decayed holds ", decayed.size(),
               " bounds; expected [begin, end) pairs");
  int64_t last = 0;
  for (size_t i = 0; i < decayed.size(); ++i) {
    TANDEM_CHECK(decayed[i] >= last && decayed[i] <= param.numel(), "adamw_step_flat: decayed[", i,
                 "] is ", decayed[i], "; expected ascending bounds within [", last, ", ",
                 param.numel(), "]");
    last = decayed[i];
  }
  TANDEM_OP(param, adamw_step_flat, param, m, v, param_bf16, grad, decayed, grad_scale, hp);
}

double lm_head_ce_forward(const Tensor& lse, const Tensor& x, const Tensor& w,
                          const Tensor& targets) {
  TANDEM_OP(lse, lm_head_ce_forward, lse, x, w, targets);
}

void lm_head_ce_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                         const Tensor& targets, const Tensor& lse, double scale,
                         Accumulate acc_dw) {
  TANDEM_OP(dx, lm_head_ce_backward, dx, dw, x, w, targets, lse, scale, acc_dw);
}

PendingScalar lm_head_ce_forward_backward(const Tensor& dx, const Tensor& dw, const Tensor& lse,
                                          const Tensor& x, const Tensor& w, const Tensor& targets,
                                          double scale, Accumulate acc_dw) {
  TANDEM_OP(dx, lm_head_ce_forward_backward, dx, dw, lse, x, w, targets, scale, acc_dw);
}

#undef TANDEM_OP

}  // namespace tandem::ops
