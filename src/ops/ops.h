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

// Each op below dispatches on its first tensor's device to ops::cpu or ops::cuda (which declare
// the same list).
#include "ops/op_decls.inc"

}  // namespace tandem::ops
