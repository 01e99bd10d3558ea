// What attention.cu and attention_backward.cu (the tensor-core kernels, the checks, the dispatch)
// and attention_generic.cu (the warp-per-row kernels for any head dim) share: one call's
// geometry and the generic path's launchers. Private to src/ops/cuda.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace tandem::ops::cuda {

// The largest head dim the generic kernels take (each lane holds kMaxGenericDim / 32 elements).
constexpr int kMaxGenericDim = 256;

// Shapes and strides of one call. Row n of q/out/dq is token n % seq of sequence n / seq; element
// (n, head, d) of q sits at n * q_stride + head * D + d (k likewise with kv_stride); v's heads
// are v_dim wide (multi-head latent attention's differ from D), so v sits at n * v_stride +
// head * v_dim + d, and out and dout at n * o_stride + head * v_dim + d.
// key_begin: AttentionShape::key_begin on the device ([batch * seq]: the query at position i
// attends keys key_begin[n] .. i), or null for plain causal attention. A value outside [0, i] is
// the caller's error: the kernels then mask as it says (no key at all past i) but stay within
// their tensors.
struct Geometry {
  int batch, seq, heads, kv_heads, group, head_dim, v_dim;
  int64_t q_stride, kv_stride, v_stride, o_stride;
  float scale;       // the softmax scale: 1 / sqrt(D) unless the model gives its own
  float scale_log2;  // scale * log2(e): scores in the base-2 domain of exp2
  const int32_t* key_begin;
};

// The generic forward: out and lse [batch, heads, seq] of causal attention (within the document
// bounds, when given), on the current stream.
void generic_attention_forward(const Geometry& g, __nv_bfloat16* out, float* lse,
                               const __nv_bfloat16* q, const __nv_bfloat16* k,
                               const __nv_bfloat16* v);
// The generic backward: dq (and delta = rowsum(dout * out), written), then dk and dv; every
// gradient row owned by one warp, so the results are deterministic.
void generic_attention_backward(const Geometry& g, __nv_bfloat16* dq, __nv_bfloat16* dk,
                                __nv_bfloat16* dv, float* delta, const __nv_bfloat16* dout,
                                const __nv_bfloat16* q, const __nv_bfloat16* k,
                                const __nv_bfloat16* v, const __nv_bfloat16* out, const float* lse);

}  // namespace tandem::ops::cuda
