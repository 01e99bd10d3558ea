// The CUDA caching allocator (DESIGN.md "Stream safety"). Statistics count requested bytes per
// category exactly as the CPU allocator does (core/allocator.h), so the planner's prediction and
// the measurement compare byte for byte on the GPU too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

#include "core/allocator.h"

namespace tandem::cuda {

class CudaAllocator final : public Allocator {
 public:
  CudaAllocator();
  ~CudaAllocator() override;
  Device device() const override { return Device::kCUDA; }
  void* allocate(int64_t bytes, MemCategory category, std::string_view tag) override;
  void deallocate(void* ptr, int64_t bytes, MemCategory category, std::string_view tag) override;

  // Notes that `stream` uses the block holding `ptr` (PyTorch's record_stream): when the block is
  // freed, it is reused only after the work enqueued on `stream` until the free has completed.
  void record_stream(void* ptr, cudaStream_t stream);
  // Bytes held from the driver (cached blocks included), and the peak of that.
  int64_t reserved_bytes() const;
  int64_t peak_reserved_bytes() const;
  // Returns every cached block that is free and whose pending uses have completed to the driver.
  void empty_cache();
};

// The process-wide CUDA allocator (created by cuda::initialize()).
CudaAllocator& cuda_allocator();

}  // namespace tandem::cuda
