// CUDA elementwise ops and reductions, dtype conversion, embedding lookup and SwiGLU
// (docs/cuda.md "Op dtypes"). Elementwise kernels move 16-byte vectors where every pointer is
// 16-byte aligned and fall back to scalar loads otherwise; reductions use a fixed grid and a fixed
// combination order, so every result is bitwise reproducible run to run on one GPU.
#include <cuda_bf16.h>

#include <bit>
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/common.cuh"
#include "ops/cuda/common.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/scratch.h"

namespace tandem::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements of a vector: 16 bytes of bf16, two float4 of f32 (common.cuh)

// ---- axpy, scale ----

template <typename TY, typename TX>
__global__ void __launch_bounds__(kThreads)
    axpy_kernel(TY* y, const TX* x, float a, bool add, int64_t n, int64_t nvec) {
  for (int64_t v = global_thread(); v < nvec; v += grid_threads()) {
    float xv[kVec], yv[kVec];
    load_vec(x + v * kVec, xv);
    if (add) load_vec(y + v * kVec, yv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) yv[j] = add ? yv[j] + a * xv[j] : a * xv[j];
    store_vec(y + v * kVec, yv);
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    const float xv = load1(x + i);
    store1(y + i, add ? load1(y + i) + a * xv : a * xv);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_kernel(T* x, float a, int64_t n, int64_t nvec) {
  for (int64_t v = global_thread(); v < nvec; v += grid_threads()) {
    float xv[kVec];
    load_vec(x + v * kVec, xv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) xv[j] *= a;
    store_vec(x + v * kVec, xv);
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    store1(x + i, load1(x + i) * a);
  }
}

// Vectors of 8 when every pointer is aligned (the scalar tail covers n % 8); none otherwise.
int64_t vec_count(int64_t n, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (!aligned16(p)) return 0;
  }
  return n / kVec;
}

// Blocks for a grid-stride kernel with `nvec` vectors and a scalar tail.
unsigned elementwise_blocks(int64_t n, int64_t nvec) {
  return blocks_for(nvec > 0 ? nvec : n, kThreads);
}

// ---- sum_squares, all_finite ----

// partial[block] = sum of x^2 over the block's elements, in double.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sum_squares_kernel(double* partial, const T* x, int64_t n, int64_t nvec) {
  __shared__ double shared[32];
  double s = 0;
  for (int64_t v = global_thread(); v < nvec; v += grid_threads()) {
    float xv[kVec];
    load_vec(x + v * kVec, xv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) s += static_cast<double>(xv[j]) * xv[j];
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    const double xv = load1(x + i);
    s += xv * xv;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of partial[0, count), in a fixed order (one block).
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(double* out, const double* partial, int count) {
  __shared__ double shared[32];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    all_finite_kernel(int* bad, const T* x, int64_t n, int64_t nvec) {
  bool ok = true;
  for (int64_t v = global_thread(); v < nvec; v += grid_threads()) {
    float xv[kVec];
    load_vec(x + v * kVec, xv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) ok = ok && isfinite(xv[j]);
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    ok = ok && isfinite(load1(x + i));
  }
  if (__syncthreads_or(!ok) && threadIdx.x == 0) *bad = 1;
}

// ---- convert ----

__global__ void __launch_bounds__(kThreads)
    f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n, int64_t nvec) {
  for (int64_t v = global_thread(); v < nvec; v += grid_threads()) {
    float xv[kVec];
    load_vec(src + v * kVec, xv);
    uint4 u;
    u.x = bf16_bits(xv[0]) | (uint32_t{bf16_bits(xv[1])} << 16);
    u.y = bf16_bits(xv[2]) | (uint32_t{bf16_bits(xv[3])} << 16);
    u.z = bf16_bits(xv[4]) | (uint32_t{bf16_bits(xv[5])} << 16);
    u.w = bf16_bits(xv[6]) | (uint32_t{bf16_bits(xv[7])} << 16);
    *reinterpret_cast<uint4*>(dst + v * kVec) = u;
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    dst[i] = bf16_bits(src[i]);
  }
}

__global__ void __launch_bounds__(kThreads)
    bf16_to_f32_kernel(float* dst, const bf16* src, int64_t n, int64_t nvec) {
  for (int64_t v = global_thread(); v < nvec; v += grid_threads()) {
    float xv[kVec];
    load_vec(src + v * kVec, xv);
    store_vec(dst + v * kVec, xv);
  }
  for (int64_t i = nvec * kVec + global_thread(); i < n; i += grid_threads()) {
    dst[i] = load1(src + i);
  }
}

// ---- embedding ----

// out[r, :] = table[ids[r], :] for every valid id; the lowest row holding an id outside [0, v)
// goes to *bad_row (which starts above every row), and that row is left unwritten.
template <typename TT>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(bf16* out, int* bad_row, const int32_t* ids, const TT* table,
                             int64_t n, int64_t v, int64_t h, bool vec) {
  const int64_t row = warp_row();
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const int64_t id = ids[row];
  if (id < 0 || id >= v) {
    if (lane == 0) atomicMin(bad_row, static_cast<int>(row));
    return;
  }
  const TT* src = table + id * h;
  bf16* dst = out + row * h;
  if (vec) {
#pragma unroll 4
    for (int64_t c = lane; c < h / kVec; c += 32) {
      float xv[kVec];
      load_vec(src + c * kVec, xv);
      store_vec(dst + c * kVec, xv);
    }
  } else {
    for (int64_t c = lane; c < h; c += 32) store1(dst + c, load1(src + c));
  }
}

// keys[i] = ids[i], or v for an id outside [0, v) (sorted last and skipped); tokens[i] = i.
__global__ void __launch_bounds__(kThreads)
    embedding_keys_kernel(int32_t* keys, int32_t* tokens, const int32_t* ids, int64_t n,
                          int64_t v) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int32_t id = ids[i];
    keys[i] = id >= 0 && id < v ? id : static_cast<int32_t>(v);
    tokens[i] = static_cast<int32_t>(i);
  }
}

// One warp per position of the id-sorted order; the warp at the start of each id's run adds that
// id's dout rows into its dtable row in token order (the CPU's order: bitwise the same sums).
// Each dtable row has one writer, so no atomics and no run-to-run variation.
__global__ void __launch_bounds__(kThreads)
    embedding_backward_kernel(float* dtable, const bf16* dout, const int32_t* keys,
                              const int32_t* tokens, int64_t n, int64_t v, int64_t h, bool vec) {
  const int64_t i = warp_row();
  const int lane = threadIdx.x & 31;
  if (i >= n) return;
  const int32_t key = keys[i];
  if (key >= v || (i > 0 && keys[i - 1] == key)) return;
  // The run's end: the first position past i whose key differs, searched 32 at a time.
  int64_t end = i + 1;
  for (;; end += 32) {
    const int64_t p = end + lane;
    const unsigned differs = __ballot_sync(0xffffffffu, p >= n || keys[p] != key);
    if (differs) {
      end += __ffs(differs) - 1;
      break;
    }
  }
  float* dst = dtable + key * h;
  if (vec) {
    for (int64_t c = lane; c < h / kVec; c += 32) {
      float acc[kVec];
      load_vec(dst + c * kVec, acc);
#pragma unroll 4
      for (int64_t j = i; j < end; ++j) {
        float d[kVec];
        load_vec(dout + int64_t{tokens[j]} * h + c * kVec, d);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += d[e];
      }
      store_vec(dst + c * kVec, acc);
    }
  } else {
    for (int64_t c = lane; c < h; c += 32) {
      float acc = dst[c];
      for (int64_t j = i; j < end; ++j) acc += load1(dout + int64_t{tokens[j]} * h + c);
      dst[c] = acc;
    }
  }
}

// ---- SwiGLU ----

__device__ __forceinline__ float sigmoid(float g) { return __frcp_rn(1.0f + __expf(-g)); }

// gate_up rows are (gate | up), 2f wide; out rows f wide. With `vec` (f % kVec == 0 and every
// base 16-byte aligned, so every row's start is too) each thread takes vectors of one row;
// otherwise single elements.
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(bf16* out, const bf16* gate_up, int64_t m, int64_t f, bool vec) {
  if (vec) {
    const int64_t per_row = f / kVec;
    for (int64_t v = global_thread(); v < m * per_row; v += grid_threads()) {
      const int64_t row = v / per_row, col = (v - row * per_row) * kVec;
      const bf16* gate = gate_up + row * 2 * f + col;
      float g[kVec], u[kVec];
      load_vec(gate, g);
      load_vec(gate + f, u);
#pragma unroll
      for (int j = 0; j < kVec; ++j) g[j] = g[j] * sigmoid(g[j]) * u[j];
      store_vec(out + row * f + col, g);
    }
    return;
  }
  for (int64_t i = global_thread(); i < m * f; i += grid_threads()) {
    const int64_t row = i / f, col = i - row * f;
    const float g = load1(gate_up + row * 2 * f + col);
    store1(out + i, g * sigmoid(g) * load1(gate_up + row * 2 * f + f + col));
  }
}

// d silu(g)/dg = s (1 + g (1 - s)) with s = sigmoid(g).
__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float& dg, float& du) {
  const float s = sigmoid(g);
  dg = d * u * s * (1.0f + g * (1.0f - s));
  du = d * g * s;
}

// The forward's layout and `vec`; d_gate_up rows are (d gate | d up).
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(bf16* d_gate_up, const bf16* dout, const bf16* gate_up, int64_t m,
                           int64_t f, bool vec) {
  if (vec) {
    const int64_t per_row = f / kVec;
    for (int64_t v = global_thread(); v < m * per_row; v += grid_threads()) {
      const int64_t row = v / per_row, col = (v - row * per_row) * kVec;
      const int64_t at = row * 2 * f + col;
      float d[kVec], g[kVec], u[kVec], dg[kVec], du[kVec];
      load_vec(dout + row * f + col, d);
      load_vec(gate_up + at, g);
      load_vec(gate_up + at + f, u);
#pragma unroll
      for (int j = 0; j < kVec; ++j) swiglu_grad(d[j], g[j], u[j], dg[j], du[j]);
      store_vec(d_gate_up + at, dg);
      store_vec(d_gate_up + at + f, du);
    }
    return;
  }
  for (int64_t i = global_thread(); i < m * f; i += grid_threads()) {
    const int64_t row = i / f, col = i - row * f, at = row * 2 * f + col;
    float dg, du;
    swiglu_grad(load1(dout + i), load1(gate_up + at), load1(gate_up + at + f), dg, du);
    store1(d_gate_up + at, dg);
    store1(d_gate_up + at + f, du);
  }
}

constexpr std::initializer_list<DType> kFloat = {DType::kF32, DType::kBF16};

}  // namespace

// ---- elementwise and reductions ----

void axpy(const Tensor& y, const Tensor& x, double alpha, Accumulate acc) {
  const char* op = "axpy";
  expect_cuda_rank(op, "y", y, kFloat, -1);
  expect_cuda(op, "x", x, kFloat, y.shape());
  const int64_t n = y.numel();
  if (n == 0) return;
  const int64_t nvec = vec_count(n, {y.raw_data(), x.raw_data()});
  dispatch_act(y.dtype(), [&](auto ty) {
    using TY = typename decltype(ty)::type;
    dispatch_act(x.dtype(), [&](auto tx) {
      using TX = typename decltype(tx)::type;
      axpy_kernel<TY, TX><<<elementwise_blocks(n, nvec), kThreads, 0, stream()>>>(
          static_cast<TY*>(y.raw_data()), static_cast<const TX*>(x.raw_data()),
          static_cast<float>(alpha), acc == Accumulate::kAdd, n, nvec);
      TANDEM_CUDA_CHECK_LAUNCH();
    });
  });
}

void scale(const Tensor& x, double alpha) {
  expect_cuda_rank("scale", "x", x, kFloat, -1);
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t nvec = vec_count(n, {x.raw_data()});
  dispatch_act(x.dtype(), [&](auto tx) {
    using T = typename decltype(tx)::type;
    scale_kernel<T><<<elementwise_blocks(n, nvec), kThreads, 0, stream()>>>(
        static_cast<T*>(x.raw_data()), static_cast<float>(alpha), n, nvec);
    TANDEM_CUDA_CHECK_LAUNCH();
  });
}

PendingScalar sum_squares_start(const Tensor& x) {
  const char* op = "sum_squares";
  expect_cuda_rank(op, "x", x, kFloat, -1);
  const int64_t n = x.numel();
  if (n == 0) return PendingScalar(0.0);
  const int64_t nvec = vec_count(n, {x.raw_data()});
  const unsigned blocks = elementwise_blocks(n, nvec);
  Scratch scratch(op);
  double* partial = scratch.take<double>(blocks);
  const Tensor total =
      Tensor::empty({1}, DType::kF64, MemCategory::kOther, "sum_squares.total", Device::kCUDA);
  dispatch_act(x.dtype(), [&](auto tx) {
    using T = typename decltype(tx)::type;
    sum_squares_kernel<T>
        <<<blocks, kThreads, 0, stream()>>>(partial, static_cast<const T*>(x.raw_data()), n, nvec);
    TANDEM_CUDA_CHECK_LAUNCH();
  });
  sum_partials_kernel<<<1, kThreads, 0, stream()>>>(total.data<double>(), partial,
                                                    static_cast<int>(blocks));
  TANDEM_CUDA_CHECK_LAUNCH();
  return PendingScalar(HostRead(total), 1.0);
}

bool all_finite(const Tensor& x) {
  const char* op = "all_finite";
  expect_cuda_rank(op, "x", x, kFloat, -1);
  const int64_t n = x.numel();
  if (n == 0) return true;
  const int64_t nvec = vec_count(n, {x.raw_data()});
  Scratch scratch(op);
  int* bad = scratch.take<int>(1);
  TANDEM_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), stream()));
  dispatch_act(x.dtype(), [&](auto tx) {
    using T = typename decltype(tx)::type;
    all_finite_kernel<T><<<elementwise_blocks(n, nvec), kThreads, 0, stream()>>>(
        bad, static_cast<const T*>(x.raw_data()), n, nvec);
    TANDEM_CUDA_CHECK_LAUNCH();
  });
  int result = 0;
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(&result, bad, sizeof(int), cudaMemcpyDeviceToHost, stream()));
  tandem::cuda::wait_stream(stream(), "the finiteness check");
  return result == 0;
}

void convert(const Tensor& dst, const Tensor& src) {
  const char* op = "convert";
  expect_cuda_rank(op, "dst", dst, kFloat, -1);
  expect_cuda_rank(op, "src", src, kFloat, -1);
  TANDEM_CHECK(dst.numel() == src.numel(), op, ": dst has ", dst.numel(), " elements, src ",
               src.numel());
  const int64_t n = src.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype()) {
    if (dst.raw_data() == src.raw_data()) return;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(),
                                      static_cast<size_t>(dst.nbytes()), cudaMemcpyDeviceToDevice,
                                      stream()));
    return;
  }
  const int64_t nvec = vec_count(n, {dst.raw_data(), src.raw_data()});
  if (dst.dtype() == DType::kBF16) {
    f32_to_bf16_kernel<<<elementwise_blocks(n, nvec), kThreads, 0, stream()>>>(
        static_cast<uint16_t*>(dst.raw_data()), static_cast<const float*>(src.raw_data()), n, nvec);
  } else {
    bf16_to_f32_kernel<<<elementwise_blocks(n, nvec), kThreads, 0, stream()>>>(
        static_cast<float*>(dst.raw_data()), static_cast<const bf16*>(src.raw_data()), n, nvec);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

// ---- embedding ----

void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table, IdCheck check) {
  const char* op = "embedding_forward";
  expect_cuda_rank(op, "table", table, kFloat, 2);
  expect_cuda_rank(op, "ids", ids, {DType::kI32}, 1);
  const int64_t n = ids.size(0), v = table.size(0), h = table.size(1);
  expect_cuda(op, "out", out, {DType::kBF16}, {n, h});
  constexpr int kNoRow = 0x7f7f7f7f;  // what a memset of 0x7f bytes leaves in an int
  TANDEM_CHECK(n < kNoRow, op, ": ", n, " ids; at most ", kNoRow - 1, " are supported");
  if (n == 0 || h == 0) return;
  const bool vec = h % kVec == 0 && aligned16(out.raw_data()) && aligned16(table.raw_data());
  Scratch scratch(op);
  int* bad_row = scratch.take<int>(1);
  TANDEM_CUDA_CHECK(cudaMemsetAsync(bad_row, 0x7f, sizeof(int), stream()));
  const unsigned blocks = row_blocks(n, kThreads);
  dispatch_act(table.dtype(), [&](auto tt) {
    using TT = typename decltype(tt)::type;
    embedding_forward_kernel<TT><<<blocks, kThreads, 0, stream()>>>(
        static_cast<bf16*>(out.raw_data()), bad_row, ids.data<int32_t>(),
        static_cast<const TT*>(table.raw_data()), n, v, h, vec);
    TANDEM_CUDA_CHECK_LAUNCH();
  });
  if (check == IdCheck::kCheckedByCaller) return;
  int bad = 0;
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(&bad, bad_row, sizeof(int), cudaMemcpyDeviceToHost, stream()));
  tandem::cuda::wait_stream(stream(), "the embedding's check of the token ids");
  if (bad < n) {
    int32_t id = 0;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(&id, ids.data<int32_t>() + bad, sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream()));
    tandem::cuda::wait_stream(stream(), "the copy of a bad token id to the host");
    TANDEM_CHECK(false, op, ": id ", id, " at row ", bad, " is outside [0, ", v, ")");
  }
}

// Ids are sorted (stable, by CUB's radix sort) so each vocabulary row is summed by one warp in
// token order: deterministic, unlike atomics. An id outside [0, V) is skipped: the forward of
// the same batch has already rejected it, and checking again here would cost a host sync.
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const char* op = "embedding_backward";
  expect_cuda_rank(op, "dtable", dtable, {DType::kF32}, 2);
  expect_cuda_rank(op, "ids", ids, {DType::kI32}, 1);
  const int64_t n = ids.size(0), v = dtable.size(0), h = dtable.size(1);
  expect_cuda(op, "dout", dout, {DType::kBF16}, {n, h});
  TANDEM_CHECK(n < INT_MAX && v < INT_MAX, op, ": ", n, " ids over ", v,
               " rows; both must be below ", INT_MAX);
  if (n == 0 || h == 0) return;
  Scratch scratch(op);
  int32_t* keys_in = scratch.take<int32_t>(n);
  int32_t* keys = scratch.take<int32_t>(n);
  int32_t* tokens_in = scratch.take<int32_t>(n);
  int32_t* tokens = scratch.take<int32_t>(n);
  const int end_bit = std::bit_width(static_cast<uint64_t>(v));  // covers the sentinel v
  size_t temp_bytes = 0;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys, tokens_in,
                                                    tokens, static_cast<int>(n), 0, end_bit,
                                                    stream()));
  void* temp = scratch.take_bytes(temp_bytes);
  embedding_keys_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
      keys_in, tokens_in, ids.data<int32_t>(), n, v);
  TANDEM_CUDA_CHECK_LAUNCH();
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, tokens_in,
                                                    tokens, static_cast<int>(n), 0, end_bit,
                                                    stream()));
  const bool vec = h % kVec == 0 && aligned16(dtable.raw_data()) && aligned16(dout.raw_data());
  const unsigned blocks = row_blocks(n, kThreads);
  embedding_backward_kernel<<<blocks, kThreads, 0, stream()>>>(
      dtable.data<float>(), static_cast<const bf16*>(dout.raw_data()), keys, tokens, n, v, h, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// ---- SwiGLU ----

// F of a [M, 2F] gate_up; checks the even width.
static int64_t swiglu_width(const char* op, const Tensor& gate_up) {
  expect_cuda_rank(op, "gate_up", gate_up, {DType::kBF16}, 2);
  TANDEM_CHECK(gate_up.size(1) % 2 == 0, op, ": tensor 'gate_up' has shape ",
               shape_str(gate_up.shape()), "; expected [M, 2F] (gate then up), an even width");
  return gate_up.size(1) / 2;
}

void swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  const char* op = "swiglu_forward";
  const int64_t m = gate_up.size(0), f = swiglu_width(op, gate_up);
  expect_cuda(op, "out", out, {DType::kBF16}, {m, f});
  const int64_t n = m * f;
  if (n == 0) return;
  const bool vec = f % kVec == 0 && vec_count(kVec, {out.raw_data(), gate_up.raw_data()}) > 0;
  swiglu_forward_kernel<<<elementwise_blocks(n, vec ? n / kVec : 0), kThreads, 0, stream()>>>(
      static_cast<bf16*>(out.raw_data()), static_cast<const bf16*>(gate_up.raw_data()), m, f, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const Tensor& d_gate_up, const Tensor& dout, const Tensor& gate_up) {
  const char* op = "swiglu_backward";
  const int64_t m = gate_up.size(0), f = swiglu_width(op, gate_up);
  expect_cuda(op, "dout", dout, {DType::kBF16}, {m, f});
  expect_cuda(op, "d_gate_up", d_gate_up, {DType::kBF16}, gate_up.shape());
  const int64_t n = m * f;
  if (n == 0) return;
  const bool vec = f % kVec == 0 &&
                   vec_count(kVec, {d_gate_up.raw_data(), dout.raw_data(), gate_up.raw_data()}) > 0;
  swiglu_backward_kernel<<<elementwise_blocks(n, vec ? n / kVec : 0), kThreads, 0, stream()>>>(
      static_cast<bf16*>(d_gate_up.raw_data()), static_cast<const bf16*>(dout.raw_data()),
      static_cast<const bf16*>(gate_up.raw_data()), m, f, vec);
  TANDEM_CUDA_CHECK_LAUNCH();
}

namespace {

__global__ void count_differing_words_kernel(const uint32_t* a, const uint32_t* b, int64_t words,
                                             uint32_t* count) {
  uint32_t differing = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    differing += a[i] != b[i] ? 1u : 0u;
  }
  differing = __reduce_add_sync(0xffffffffu, differing);
  if ((threadIdx.x & 31) == 0 && differing > 0) atomicAdd(count, differing);
}

}  // namespace

void count_differing_words(const void* a, const void* b, int64_t words, uint32_t* count) {
  if (words == 0) return;
  count_differing_words_kernel<<<blocks_for(words), kThreads, 0, stream()>>>(
      static_cast<const uint32_t*>(a), static_cast<const uint32_t*>(b), words, count);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::ops::cuda
