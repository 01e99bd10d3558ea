// Temporary device memory of one CUDA op, carved from the current stream's cuBLASLt workspace
// (Note [Op scratch]). Host only; private to src/ops/cuda.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cuda/context.h"
#include "ops/cuda/common.h"

namespace tandem::ops::cuda {

// Note [Op scratch]: an op that needs temporary device memory borrows the current stream's
// cuBLASLt workspace (core/cuda/context.h). Ops are serial per stream, so nothing else touches it
// between this op's launches, and nothing is allocated (or counted against the memory plan). An
// op that also runs matrix products while its scratch is live keeps the scratch within the first
// kPointerArrayBytes and calls gemm_batched, whose kernels work past them (ops/cuda/gemm.h).
//
// One Scratch per op call: take() hands out consecutive 256-byte-aligned pieces and throws
// tandem::Error (naming `op`) when the workspace is too small.
class Scratch {
 public:
  explicit Scratch(const char* op)
      : op_(op),
        base_(static_cast<char*>(tandem::cuda::cublaslt_workspace(stream()))),
        capacity_(tandem::cuda::cublaslt_workspace_bytes()) {}
  template <typename T>
  T* take(int64_t count) {
    const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 255) / 256 * 256;
    TANDEM_CHECK(used_ + bytes <= capacity_, op_, ": needs more than the ", capacity_,
                 " bytes of the stream's scratch workspace");
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += bytes;
    return p;
  }
  void* take_bytes(size_t bytes) { return take<char>(static_cast<int64_t>(bytes)); }

 private:
  const char* op_;
  char* base_;
  size_t capacity_;
  size_t used_ = 0;
};

}  // namespace tandem::ops::cuda
