// Every op of the model, forward and backward, one declaration each; the device of the tensors
// picks the backend (cpu/ now; cuda/ later). Ops never allocate their outputs: callers pass them.
// Argument order: outputs, inputs, then scalars. Float tensors are f32 or f64 (all of one op's
// float tensors share a dtype); index tensors are i32. Activations are row-major [N, C] with
// N = batch * seq tokens, token n at position n % seq of sequence n / seq.
// Weights are stored as Hugging Face does, [out, in]: y = x @ W^T.
#pragma once

#include <cstdint>
#include <memory>

#include "core/host_read.h"
#include "core/tensor.h"

namespace tandem::ops {

// Whether an op adds into its output or overwrites it.
enum class Accumulate : uint8_t { kOverwrite, kAdd };

// Whether embedding_forward checks its ids (on a GPU that waits for the stream) or the caller
// already has (e.g. on the host, before copying them over).
enum class IdCheck : uint8_t { kCheck, kCheckedByCaller };

// ---- shapes and hyper-parameters of the ops below ----
// Causal attention with grouped-query heads: query head h uses KV head h / (heads / kv_heads).
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

// AdamW's hyper-parameters for one step.
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};

// A scalar an op made, on its way to the host (Note [Reads to the host ahead of use] in
// core/host_read.h): scale times a one-element f64 tensor's value, its copy started; get()
// waits for it the first time. Copies share the read and its value. A CPU op's is ready at once.
class PendingScalar {
 public:
  PendingScalar() = default;
  explicit PendingScalar(double value) : value_(value) {}
  PendingScalar(HostRead read, double scale)
      : pending_(std::make_shared<Pending>(Pending{std::move(read), scale, 0})) {}
  double get() {
    if (!pending_) return value_;
    if (pending_->read.started()) {
      pending_->value = pending_->scale * pending_->read.take_as<double>().at(0);
    }
    return pending_->value;
  }

 private:
  struct Pending {
    HostRead read;
    double scale, value;
  };
  double value_ = 0;
  std::shared_ptr<Pending> pending_;
};

// Each op below dispatches on its first tensor's device to ops::cpu or ops::cuda (which declare
// the same list).
#include "ops/op_decls.inc"

// router_aux_loss_start's value, waited for.
inline double router_aux_loss(const Tensor& probs, const Tensor& counts, int64_t k,
                              double coeff) {
  return router_aux_loss_start(probs, counts, k, coeff).get();
}

}  // namespace tandem::ops
