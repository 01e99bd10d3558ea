// CPU allocator and the shared statistics every allocator keeps (Note [Memory categories]).
#include "core/allocator.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>

#include "core/error.h"

namespace tandem {

std::string_view category_name(MemCategory c) { return enum_name(c); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Allocator::move_category(int64_t bytes, MemCategory from, MemCategory to) {
  if (from == to) return;
  std::lock_guard lock(mutex_);
  const int f = static_cast<int>(from), t = static_cast<int>(to);
  stats_.in_use[f] -= bytes;
  stats_.in_use[t] += bytes;
  stats_.peak[t] = std::max(stats_.peak[t], stats_.in_use[t]);
  TANDEM_ASSERT(stats_.in_use[f] >= 0, "category ", category_name(from), " went negative");
  if (tracing_) {
    const double now = now_seconds();
    trace_.push_back({seq_++, now, -bytes, from, {}});
    trace_.push_back({seq_++, now, bytes, to, {}});
  }
}

void Allocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  stats_.peak = stats_.in_use;
  stats_.total_peak = stats_.total_in_use;
}

void Allocator::set_trace(bool on) {
  std::lock_guard lock(mutex_);
  tracing_ = on;
  trace_.clear();
}

std::vector<MemEvent> Allocator::trace() const {
  std::lock_guard lock(mutex_);
  return trace_;
}

void Allocator::note_alloc(int64_t bytes, MemCategory category, std::string_view tag) {
  std::lock_guard lock(mutex_);
  const int c = static_cast<int>(category);
  stats_.in_use[c] += bytes;
  stats_.peak[c] = std::max(stats_.peak[c], stats_.in_use[c]);
  stats_.total_in_use += bytes;
  stats_.total_peak = std::max(stats_.total_peak, stats_.total_in_use);
  ++stats_.num_allocs;
  if (tracing_) trace_.push_back({seq_, now_seconds(), bytes, category, std::string(tag)});
  ++seq_;
}

void Allocator::note_free(int64_t bytes, MemCategory category, std::string_view tag) {
  std::lock_guard lock(mutex_);
  const int c = static_cast<int>(category);
  stats_.in_use[c] -= bytes;
  stats_.total_in_use -= bytes;
  TANDEM_ASSERT(stats_.in_use[c] >= 0, "category ", category_name(category), " went negative");
  if (tracing_) trace_.push_back({seq_, now_seconds(), -bytes, category, std::string(tag)});
  ++seq_;
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    // Keep freed blocks in the heap for reuse: by default glibc maps every large block afresh
    // and unmaps it on free, so each training step would page-fault its activations back in.
    // The statistics count requested bytes either way.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }

  Device device() const override { return Device::kCPU; }

  void* allocate(int64_t bytes, MemCategory category, std::string_view tag) override {
    TANDEM_ASSERT(bytes >= 0);
    // Round the system request (not the statistics) up to the alignment aligned_alloc needs.
    const size_t rounded = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    TANDEM_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes for ", tag);
    note_alloc(bytes, category, tag);
    return p;
  }

  void deallocate(void* ptr, int64_t bytes, MemCategory category, std::string_view tag) override {
    std::free(ptr);
    note_free(bytes, category, tag);
  }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator instance;
  return instance;
}

}  // namespace tandem
