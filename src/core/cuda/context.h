// The CUDA side of core: one GPU per process, a current stream per thread, the cuBLASLt handle
// and workspace, and the hooks that let Tensor allocate, zero and copy device memory
// (core/device.h). Everything device-side goes through here; nothing else creates handles.
//
// Note [Current stream]: every op and copy is enqueued on the calling thread's current stream
// (the default stream of the process-wide context until a StreamScope says otherwise). Early
// release (core/tensor.h) records that stream's use of the block, so the caching allocator
// hands it out again only after the work enqueued so far on that stream has finished.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace tandem::cuda {

// Selects GPU `device_index`, creates the compute stream, the cuBLASLt handle and workspace, and
// registers the CUDA allocator and copy hooks with core. Idempotent for the same index; throws
// tandem::Error when there is no such GPU.
void initialize(int device_index = 0);
bool initialized();
// Number of visible GPUs (0 when the driver or the device is missing; never throws).
int device_count();
// "NVIDIA H200 (sm_90, 139.8 GiB)".
std::string device_description();
// Bytes the driver says are free on the current GPU now (cudaMemGetInfo).
int64_t free_device_bytes();

// The calling thread's current stream (Note [Current stream]).
cudaStream_t current_stream();
// The stream the process starts on (non-blocking, created by initialize()).
cudaStream_t default_stream();

// Makes `stream` current on this thread for the scope's lifetime.
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

// Waits for all work on the current stream.
void synchronize_current();

cublasLtHandle_t cublaslt_handle();
// A workspace for cuBLASLt, `workspace_bytes()` long, used only on the current stream's
// thread of ops (ops are serial per stream; the workspace is per stream).
void* cublaslt_workspace(cudaStream_t stream);
size_t cublaslt_workspace_bytes();

// Number of streaming multiprocessors of the current GPU.
int multiprocessor_count();

}  // namespace tandem::cuda
