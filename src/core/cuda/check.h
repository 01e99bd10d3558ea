// Checked CUDA, cuBLAS(Lt) calls: a failing call throws tandem::Error naming the call, the file
// and line, and the library's own error text (DESIGN.md "Errors").
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace tandem::cuda {
const char* cublas_status_name(cublasStatus_t status);
}  // namespace tandem::cuda

#define TANDEM_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    const cudaError_t tandem_cuda_status_ = (expr);                                          \
    TANDEM_CHECK(tandem_cuda_status_ == cudaSuccess, "CUDA call ", #expr, " failed: ",       \
                 cudaGetErrorName(tandem_cuda_status_), " (",                                \
                 cudaGetErrorString(tandem_cuda_status_), ")");                              \
  } while (false)

#define TANDEM_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                       \
    const cublasStatus_t tandem_cublas_status_ = (expr);                                     \
    TANDEM_CHECK(tandem_cublas_status_ == CUBLAS_STATUS_SUCCESS, "cuBLAS call ", #expr,      \
                 " failed: ", ::tandem::cuda::cublas_status_name(tandem_cublas_status_));    \
  } while (false)

// After a kernel launch: reports a bad launch configuration at once.
#define TANDEM_CUDA_CHECK_LAUNCH() TANDEM_CUDA_CHECK(cudaGetLastError())
