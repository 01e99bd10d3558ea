// Allocators with exact statistics. Bytes are counted as requested (no rounding), per category,
// so that the planner's prediction and the measurement can agree byte for byte.
//
// Note [Memory categories]: every allocation names what it is for. Parameters, gradients and
// optimizer state live for the whole run; activations are what a micro-batch's forward leaves
// for its backward plus the tensors flowing between nodes; communication is all-to-all and
// pipeline buffers; other is op workspace and everything else.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace tandem {

enum class MemCategory : uint8_t {
  kParameter,
  kGradient,
  kOptimizer,
  kActivation,
  kCommunication,
  kOther,
};
inline constexpr EnumName<MemCategory> kMemCategoryNames[] = {
    {MemCategory::kParameter, "parameter"},         {MemCategory::kGradient, "gradient"},
    {MemCategory::kOptimizer, "optimizer"},         {MemCategory::kActivation, "activation"},
    {MemCategory::kCommunication, "communication"}, {MemCategory::kOther, "other"}};
constexpr std::span<const EnumName<MemCategory>> enum_names(MemCategory) {
  return kMemCategoryNames;
}
constexpr int kNumMemCategories = 6;
std::string_view category_name(MemCategory c);

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> in_use{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_in_use = 0;
  int64_t total_peak = 0;
  int64_t num_allocs = 0;

  int64_t in_use_of(MemCategory c) const { return in_use[static_cast<int>(c)]; }
  int64_t peak_of(MemCategory c) const { return peak[static_cast<int>(c)]; }
};

// One allocation or free, in order; `bytes` is negative for a free.
struct MemEvent {
  int64_t seq;
  double time;  // seconds on the steady clock
  int64_t bytes;
  MemCategory category;
  std::string tag;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns memory for `bytes` (>= 0) bytes; throws tandem::Error when none is left.
  virtual void* allocate(int64_t bytes, MemCategory category, std::string_view tag) = 0;
  // `tag` names the freed storage in the trace.
  virtual void deallocate(void* ptr, int64_t bytes, MemCategory category, std::string_view tag) = 0;

  MemoryStats stats() const;
  // Counts `bytes` already allocated under `from` as `to` from now on (a tensor handed over).
  void move_category(int64_t bytes, MemCategory from, MemCategory to);
  // Starts the peaks again from what is in use now.
  void reset_peaks();
  // Records every allocation and free from now on, when on; clears the record.
  void set_trace(bool on);
  std::vector<MemEvent> trace() const;

 protected:
  void note_alloc(int64_t bytes, MemCategory category, std::string_view tag);
  void note_free(int64_t bytes, MemCategory category, std::string_view tag);

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
  bool tracing_ = false;
  int64_t seq_ = 0;
  std::vector<MemEvent> trace_;
};

// Seconds on the steady clock (the time base of MemEvent and of measured timelines).
double now_seconds();

// The process-wide CPU allocator (64-byte aligned, from the system heap).
Allocator& cpu_allocator();

}  // namespace tandem
