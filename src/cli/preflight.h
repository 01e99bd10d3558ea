// The pre-flight memory check of `tandem train` (Note [Pre-flight memory check] in
// preflight.cc): each rank's planned peak against what its device has, before anything of the
// run is allocated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cli/options.h"
#include "planner/planner.h"

namespace tandem::cli {

// What a rank may hold, and where that figure comes from ("the GPU's free memory ...").
struct MemoryAvailable {
  int64_t bytes = 0;
  std::string source;
  bool known() const { return !source.empty(); }
};

// --memory-available in bytes; nothing when it is not given. Throws tandem::Error naming it when
// it is not a size, and, for a command other than train (`command`: "plan", "eval"), when it is
// given at all: only train checks memory before it runs.
std::optional<int64_t> memory_available_option(const RunOptions& o,
                                               const std::string& command = "train");

// The host's memory for one rank: the least of the machine's available memory (MemAvailable)
// and its cgroup's limit left, each shared by the ranks on the machine, and the process's
// address-space and data limits (ulimit -v, -d) less what it holds of them already. Not known
// (source empty) where none of these can be read.
MemoryAvailable host_memory_available();
// The device's memory for one rank: --memory-available when given; on the GPU its free memory
// and what the allocator holds live; on the CPU host_memory_available().
MemoryAvailable device_memory_available(const RunOptions& o);

// Throws tandem::Error when pipeline rank `pipeline_rank`'s planned peak (or, offloading, its
// planned host memory) is above what is available: the message says planned against available,
// what the peak is made of, and the layouts of `world_size` ranks that fit (schedule's layout
// search, as `tandem plan --search`). `base` is the run's plan request (run_request).
void check_planned_memory_fits(const RunOptions& o, const schedule::PlanRequest& base,
                               const schedule::Plan& plan, int32_t pipeline_rank,
                               int64_t world_size);

}  // namespace tandem::cli
