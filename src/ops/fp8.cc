// The FP8 products of Note [FP8 products] (ops/fp8.h) and the device dispatch of the round trip.
#include "ops/fp8.h"

namespace tandem::ops {

Fp8Tiles Fp8Tiles::tensorwise(fp8::Format format, int64_t rows, int64_t cols) {
  return {format, rows > 0 ? rows : 1, cols > 0 ? cols : 1, false};
}

Fp8Tiles Fp8Tiles::blocks(fp8::Format format, int64_t tile_rows, int64_t tile_cols) {
  return {format, tile_rows, tile_cols, true};
}

void fp8_round_trip(const Tensor& out, const Tensor& x, const Fp8Tiles& tiles) {
#if TANDEM_WITH_CUDA
  if (x.defined() && x.device() == Device::kCUDA) return cuda::fp8_round_trip(out, x, tiles);
#endif
  cpu::fp8_round_trip(out, x, tiles);
}

namespace {

// How an operand of a product is cut: along its rows (the product sums over its columns), along
// its columns (it sums over its rows), or in blocks (a weight, either way).
enum class Cut : uint8_t { kRows, kColumns, kBlocks };

// `t` taken through its FP8 codes, in a temporary beside it.
Tensor rounded(const Tensor& t, const Fp8Linear& fp8, fp8::Format format, Cut cut,
               const char* tag) {
  TANDEM_ASSERT(t.dim() == 2, tag, " has ", t.dim(), " dimensions");
  Tensor out = Tensor::empty(t.shape(), t.dtype(), MemCategory::kOther, tag, t.device());
  Fp8Tiles tiles = Fp8Tiles::tensorwise(format, t.size(0), t.size(1));
  if (fp8.recipe == Fp8Recipe::kBlockwise) {
    constexpr int64_t kTile = 128;
    tiles = cut == Cut::kRows      ? Fp8Tiles::blocks(format, 1, kTile)
            : cut == Cut::kColumns ? Fp8Tiles::blocks(format, kTile, 1)
                                   : Fp8Tiles::blocks(format, kTile, kTile);
  }
  fp8_round_trip(out, t, tiles);
  return out;
}

}  // namespace

void fp8_linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Fp8Linear& fp8,
                        Accumulate acc) {
  linear_forward(y, rounded(x, fp8, fp8.forward, Cut::kRows, "fp8.x"),
                 rounded(w, fp8, fp8.forward, Cut::kBlocks, "fp8.w"), acc);
}

void fp8_linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w,
                               const Fp8Linear& fp8, Accumulate acc) {
  linear_backward_input(dx, rounded(dy, fp8, fp8.backward, Cut::kRows, "fp8.dy"),
                        rounded(w, fp8, fp8.forward, Cut::kBlocks, "fp8.w"), acc);
}

void fp8_linear_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x,
                                const Fp8Linear& fp8, Accumulate acc) {
  linear_backward_weight(dw, rounded(dy, fp8, fp8.backward, Cut::kColumns, "fp8.dy"),
                         rounded(x, fp8, fp8.forward, Cut::kColumns, "fp8.x"), acc);
}

}  // namespace tandem::ops
