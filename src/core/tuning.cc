// Note [Performance settings] (core/tuning.h): the process's values.
#include "core/tuning.h"

#include <atomic>
#include <string_view>

#include "core/error.h"

namespace tandem {
namespace {

Tuning& current() {
  static Tuning t;
  return t;
}
std::atomic<uint64_t> generation{0};

}  // namespace

const Tuning& tuning() { return current(); }

void validate_tuning(const Tuning& t) {
  TANDEM_CHECK(t.expert_lanes >= 1 && t.expert_lanes <= kMaxExpertLanes, "--expert-lanes ",
               t.expert_lanes, " is invalid: it must be between 1 and ", kMaxExpertLanes,
               " (Note [Lanes] in ops/ops.h)");
  bool known = false;
  std::string valid;
  for (const char* v : kExpertGroupedValues) {
    known = known || t.expert_grouped == v;
    valid += std::string(valid.empty() ? "" : ", ") + v;
  }
  TANDEM_CHECK(known, "--expert-grouped ", t.expert_grouped,
               " is invalid: it must be one of: ", valid);
}

void set_tuning(const Tuning& t) {
  validate_tuning(t);
  current() = t;
  generation.fetch_add(1, std::memory_order_relaxed);
}

uint64_t tuning_generation() { return generation.load(std::memory_order_relaxed); }

}  // namespace tandem
