// FP8 ops: a tensor through its FP8 codes and back (Note [FP8 quantization] in core/fp8.h), on the
// CPU from core/fp8.h's arithmetic and on the GPU by a kernel that gives the same bits. The CPU
// backend emulates an FP8 product as the ordinary product of its operands so rounded; the GPU
// kernel is the quantization step of its FP8 products, checked against the CPU's
// (tests/cuda/test_cuda_elementwise.cc).
#pragma once

#include <cstdint>

#include "core/fp8.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace tandem::ops {

// How a tensor is quantized: its format, and the tile each scale covers. A tile of the whole
// tensor with a plain scale is the tensorwise recipe; 1x128 row tiles, 128x1 column tiles (the
// same tensor quantized along the other dimension for the transposed product) and 128x128 blocks
// with power-of-two scales are the blockwise recipe's.
struct Fp8Tiles {
  fp8::Format format = fp8::Format::kE4M3;
  int64_t tile_rows = 1, tile_cols = 128;
  bool power_of_two = true;
  // One tile covering a [rows, cols] tensor, scaled by max / amax.
  static Fp8Tiles tensorwise(fp8::Format format, int64_t rows, int64_t cols);
  static Fp8Tiles blocks(fp8::Format format, int64_t tile_rows, int64_t tile_cols);
};

// out = the values x's FP8 codes stand for, x [rows, cols] cut into `tiles`, each tile with its
// own scale from its own amax. out and x: the same shape and dtype (f32 or f64 on the CPU, f64
// first rounded to f32; bf16 or f32 on the GPU); out may be x.
void fp8_round_trip(const Tensor& out, const Tensor& x, const Fp8Tiles& tiles);

// Note [FP8 products]: an FP8 linear layer's three products, as Megatron-LM's recipes quantize
// their operands (Transformer Engine's linear layers), each operand along the dimension the
// product sums over:
//   forward         y = x w^T     x in 1x128 row tiles, w in 128x128 blocks, forward format;
//   input gradient  dx = dy w     dy in 1x128 row tiles (backward format), w in 128x128 blocks;
//   weight gradient dw = dy^T x   dy and x in 128x1 column tiles (the sum runs over the tokens).
// The tensorwise recipe gives each operand one scale from its own amax, the same in every product.
// The forward format is E4M3; the backward format is E4M3 too, or E5M2 with --fp8-format hybrid.
// The products here take each operand through its codes (fp8_round_trip, into a temporary) and
// multiply the results as linear_forward and its backward ops do: the CPU's emulation of an FP8
// layer, and on the GPU a reference for its FP8 products (which sum the codes' products and
// scale the sum once, so they differ from it only in rounding).
enum class Fp8Recipe : uint8_t { kTensorwise, kBlockwise };
struct Fp8Linear {
  Fp8Recipe recipe = Fp8Recipe::kBlockwise;
  fp8::Format forward = fp8::Format::kE4M3;
  fp8::Format backward = fp8::Format::kE4M3;
};
// As linear_forward, linear_backward_input and linear_backward_weight (ops.h), their operands
// quantized as Note [FP8 products] says.
void fp8_linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Fp8Linear& fp8,
                        Accumulate acc = Accumulate::kOverwrite);
void fp8_linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w,
                               const Fp8Linear& fp8, Accumulate acc = Accumulate::kOverwrite);
void fp8_linear_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x,
                                const Fp8Linear& fp8, Accumulate acc = Accumulate::kAdd);

namespace cpu {
void fp8_round_trip(const Tensor& out, const Tensor& x, const Fp8Tiles& tiles);
}
namespace cuda {
void fp8_round_trip(const Tensor& out, const Tensor& x, const Fp8Tiles& tiles);
}

}  // namespace tandem::ops
