// The CUDA caching allocator (docs/design.md "Stream safety"; its policy is
// Note [Caching allocator] in cuda_allocator.cc). Statistics count requested bytes per category
// exactly as the CPU allocator does (core/allocator.h), so the planner's prediction and the
// measurement compare byte for byte on the GPU too; reserved_bytes() is what the driver holds for
// us besides.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "core/allocator.h"

namespace tandem {
class Tensor;
}  // namespace tandem

namespace tandem::cuda {

class CudaAllocator final : public Allocator {
 public:
  CudaAllocator();
  ~CudaAllocator() override;
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  Device device() const override { return Device::kCUDA; }
  // Memory for `bytes` bytes, usable on the calling thread's current stream
  // (Note [Current stream] in context.h); throws tandem::Error naming the bytes and `tag` when the
  // GPU has none.
  void* allocate(int64_t bytes, MemCategory category, std::string_view tag) override;
  // Frees on the calling thread's current stream: that stream's use is recorded first, so the
  // block is reused only after the work enqueued so far on it (and on every stream recorded with
  // record_stream) has completed.
  void deallocate(void* ptr, int64_t bytes, MemCategory category, std::string_view tag) override;

  // Notes that `stream` uses the block starting at `ptr` (PyTorch's record_stream): when the
  // block is freed, it is reused only after the work enqueued on `stream` until the free has
  // completed. `ptr` must be a live allocation of this allocator; a null `ptr` is ignored.
  void record_stream(void* ptr, cudaStream_t stream);
  // Bytes held from the driver (cached blocks included), and the peak of that.
  int64_t reserved_bytes() const;
  int64_t peak_reserved_bytes() const;
  // Returns to the driver every cached segment that is wholly free and whose pending uses have
  // completed (it waits for the GPU first when there is any to return).
  void empty_cache();

  struct State;  // the pools and segments (cuda_allocator.cc)

 private:
  // Destroying an allocator returns nothing to the driver: the process-wide one never is.
  std::unique_ptr<State> state_;
};

// The process-wide CUDA allocator (registered with core by cuda::initialize()).
CudaAllocator& cuda_allocator();

// Records `stream`'s use of a device tensor's block (CudaAllocator::record_stream); a no-op for
// an undefined or CPU tensor. Throws tandem::Error for a released one (Note [Early release]).
void record_stream(const Tensor& t, cudaStream_t stream);

}  // namespace tandem::cuda
