// Placeholder until the caching allocator lands: stream-ordered cudaMallocAsync/cudaFreeAsync on
// the current stream (correct for one stream; record_stream is a no-op here).
#include "core/cuda/cuda_allocator.h"

#include "core/cuda/check.h"
#include "core/cuda/context.h"

namespace tandem::cuda {

CudaAllocator::CudaAllocator() = default;
CudaAllocator::~CudaAllocator() = default;

void* CudaAllocator::allocate(int64_t bytes, MemCategory category, std::string_view tag) {
  void* p = nullptr;
  if (bytes > 0) TANDEM_CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(bytes), current_stream()));
  note_alloc(bytes, category, tag);
  return p;
}

void CudaAllocator::deallocate(void* ptr, int64_t bytes, MemCategory category,
                               std::string_view tag) {
  if (ptr != nullptr) TANDEM_CUDA_CHECK(cudaFreeAsync(ptr, current_stream()));
  note_free(bytes, category, tag);
}

void CudaAllocator::record_stream(void*, cudaStream_t) {}
int64_t CudaAllocator::reserved_bytes() const { return stats().total_in_use; }
int64_t CudaAllocator::peak_reserved_bytes() const { return stats().total_peak; }
void CudaAllocator::empty_cache() {}

CudaAllocator& cuda_allocator() {
  static CudaAllocator* instance = new CudaAllocator();  // outlives every static tensor
  return *instance;
}

}  // namespace tandem::cuda
