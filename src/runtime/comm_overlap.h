// --comm-overlap: where a combined action's all-to-all runs (runtime/stream_executor.h issues it).
#pragma once

#include <cstdint>
#include <span>

#include "core/enum_names.h"

namespace tandem::runtime {

// Whether combined forward-backward actions run their all-to-all nodes on a communication
// stream of their own (a worker thread on the CPU, a high-priority CUDA stream on the GPU) or
// everything in order on the compute stream.
// kSplit (GPU only): as kOn, and the two halves of a pair each get a compute and a communication
// stream of their own (Note [A stream pair per half] in combined.cc).
enum class CommOverlap : uint8_t { kOff, kOn, kSplit };
// --comm-overlap's names (Note [One name table per enumeration] in core/enum_names.h).
inline constexpr EnumName<CommOverlap> kCommOverlapNames[] = {
    {CommOverlap::kOn, "on"}, {CommOverlap::kOff, "off"}, {CommOverlap::kSplit, "split"}};
constexpr std::span<const EnumName<CommOverlap>> enum_names(CommOverlap) {
  return kCommOverlapNames;
}

}  // namespace tandem::runtime
