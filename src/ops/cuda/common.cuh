// Device-side helpers of the CUDA ops, included by their .cu files only: loads and stores of f32 or
// bf16 elements (one at a time or as 16-byte vectors), warp and block
// sums, the grid-stride indices, and the host's dispatch on the storage dtype. Private to
// src/ops/cuda.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"

namespace tandem::ops::cuda {

// ---- one element ----

__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store1(float* p, float v) { *p = v; }
__device__ __forceinline__ void store1(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// cos and sin of ang (radians): reduced to [-pi, pi] in double, then the single-precision pair
// (absolute error below 2^-21.4 there). RoPE's rotations (rope.cu, mla.cu).
__device__ __forceinline__ float2 rope_cos_sin(double ang) {
  const double turns = rint(ang * 0.15915494309189535);  // 1 / (2 pi)
  const float r = static_cast<float>(fma(-turns, 6.283185307179586, ang));
  float s, c;
  __sincosf(r, &s, &c);
  return make_float2(c, s);
}

// ---- 16-byte vectors: N floats at p stored as f32 or bf16, p aligned to min(16, N * element size)
// bytes; N = 8 of f32 is two 16-byte vectors ----

// lo and hi rounded to bf16, packed with lo in the low half (its lower address in memory).
// f32 -> bf16 bits, round to nearest even, NaN kept quiet with its sign: the same bits as the
// host's bf16_from_float (core/dtype.h), so a conversion on either device agrees bit for bit
// (convert in basic.cu, the compute copy AdamW writes in adamw.cu).
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}
// The 8 bf16 of one 16-byte vector as floats.
__device__ __forceinline__ void unpack8(uint4 u, float (&v)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void load_vec(const float* p, float (&v)[4]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
__device__ __forceinline__ void load_vec(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load_vec(const __nv_bfloat16* p, float (&v)[8]) {
  unpack8(*reinterpret_cast<const uint4*>(p), v);
}

__device__ __forceinline__ void store_vec(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store_vec(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float (&v)[4]) {
  *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
}
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

// ---- indices and reductions ----

// This thread's index in a 1-D grid, and the grid's thread count (the grid-stride loops' step).
__device__ __forceinline__ int64_t global_thread() {
  return int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return int64_t{gridDim.x} * blockDim.x; }

// Warp-per-row kernels: this warp's row, each block holding blockDim.x / 32 rows (row_blocks in
// common.h launches enough blocks).
__device__ __forceinline__ int64_t warp_row() {
  return int64_t{blockIdx.x} * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

// The sum over the warp, returned to every lane (the same bits in each: the xor butterfly is
// symmetric).
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum over the block, returned to every thread (the same bits in each, as warp_sum).
// `shared` holds 32 values; the leading barrier lets callers reuse it.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  const unsigned warps = (blockDim.x + 31) / 32;
  v = (threadIdx.x & 31) < warps ? shared[threadIdx.x & 31] : T(0);
  return warp_sum(v);
}

// ---- host side ----

// Calls f(std::type_identity<float or bf16>) for a tensor's dtype (checked to be one of them).
template <typename F>
void dispatch_act(DType dt, F&& f) {
  if (dt == DType::kBF16)
    f(std::type_identity<__nv_bfloat16>{});
  else
    f(std::type_identity<float>{});
}

}  // namespace tandem::ops::cuda
