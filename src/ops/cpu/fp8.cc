// FP8 round trip on the CPU (ops/fp8.h): core/fp8.h's arithmetic tile by tile, in place-safe
// order (a tile's amax is read before any of its elements is written).
#include "ops/fp8.h"

#include <cmath>

#include "ops/cpu/common.h"

namespace tandem::ops::cpu {

void fp8_round_trip(const Tensor& out, const Tensor& x, const Fp8Tiles& tiles) {
  const char* op = "fp8_round_trip";
  const DType dt = cpu::float_dtype(op, "x", x, 2);
  cpu::expect(op, "out", out, dt, x.shape());
  TANDEM_ASSERT(tiles.tile_rows > 0 && tiles.tile_cols > 0, "tiles of [", tiles.tile_rows, ", ",
                tiles.tile_cols, "]");
  const int64_t rows = x.size(0), cols = x.size(1);
  const float max = fp8::max_finite(tiles.format);
  cpu::dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    fp8::for_each_tile(
        rows, cols, tiles.tile_rows, tiles.tile_cols,
        [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
          float m = 0.0f;
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = c0; c < c1; ++c) {
              m = fp8::nan_max(m, std::fabs(static_cast<float>(in[r * cols + c])));
            }
          }
          const float scale = fp8::scale_from_amax(m, max, tiles.power_of_two);
          const float inv = 1.0f / scale;
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = c0; c < c1; ++c) {
              const float v = static_cast<float>(in[r * cols + c]) * scale;
              o[r * cols + c] = static_cast<T>(
                  fp8::to_float(fp8::from_float(v, tiles.format), tiles.format) * inv);
            }
          }
        });
  });
}

}  // namespace tandem::ops::cpu
