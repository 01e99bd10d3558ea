// Checked CUDA and cuBLAS(Lt) calls: a failing call throws tandem::InternalError naming the call
// and the library's own error text, at the file, line and function of the call
// (docs/design.md "Errors"). Out of memory is not reported here: the caching allocator throws
// tandem::Error for it, naming the tensor (cuda_allocator.cc).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace tandem::cuda {
const char* cublas_status_name(cublasStatus_t status);
}  // namespace tandem::cuda

#define TANDEM_CUDA_CHECK(expr)                                                       \
  do {                                                                                \
    const cudaError_t tandem_cuda_status_ = (expr);                                   \
    if (tandem_cuda_status_ != cudaSuccess)                                           \
      TANDEM_INTERNAL_ERROR("CUDA call ", #expr,                                      \
                            " failed: ", cudaGetErrorName(tandem_cuda_status_), " (", \
                            cudaGetErrorString(tandem_cuda_status_), ")");            \
  } while (false)

#define TANDEM_CUBLAS_CHECK(expr)                                                       \
  do {                                                                                  \
    const cublasStatus_t tandem_cublas_status_ = (expr);                                \
    if (tandem_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                 \
      TANDEM_INTERNAL_ERROR("cuBLAS call ", #expr, " failed: ",                         \
                            ::tandem::cuda::cublas_status_name(tandem_cublas_status_)); \
  } while (false)

// After a kernel launch: reports a bad launch configuration at once.
#define TANDEM_CUDA_CHECK_LAUNCH() TANDEM_CUDA_CHECK(cudaGetLastError())
