// Where a deferred optimizer update runs beside the all-to-alls: one rule that the runtime
// (runtime/stream_executor.cc) follows and the planner (planner/simulator.cc) simulates.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::schedule {

// Note [Deferred update in the plan] (planner/simulator.cc), the runtime's and the plan's one rule:
// in a forward that runs alone, beside all-to-all node k the deferred update reaches the weights of
// the next compute node and half of those of the one after it. ends[i]: the end of the weights
// node i and the nodes before it read; is_comm(i): node i is an all-to-all; total: all the
// stage's weights.
template <typename IsComm>
int64_t update_beside_all_to_all(const std::vector<int64_t>& ends, size_t k, int64_t total,
                                 IsComm is_comm) {
  auto next_compute = [&](size_t i) {
    while (i < ends.size() && is_comm(i)) ++i;
    return i;
  };
  const size_t j = next_compute(k + 1);
  if (j >= ends.size()) return total;
  const size_t j2 = next_compute(j + 1);
  const int64_t a = ends[j], b = j2 < ends.size() ? ends[j2] : total;
  return a + (b - a) / 2;
}

}  // namespace tandem::schedule
