// Step measurement (step_meter.h).
#include "runtime/step_meter.h"

#include <algorithm>
#include <string>

#include "runtime/alltoall_wait.h"

namespace tandem::runtime {

void StepMeter::begin_step() {
  start_ = std::chrono::steady_clock::now();
  spans_.clear();
  busy_s_ = exposed_s_ = fb_s_ = 0;
  waiting_s_ = -1;
}

double StepMeter::step_start_seconds() const {
  return std::chrono::duration<double>(start_.time_since_epoch()).count();
}

void StepMeter::record(const StepTimes& t) {
  spans_ = t.spans;
  busy_s_ = t.all_to_all_s;
  exposed_s_ = t.exposed_s;
  node_times_ = t.node_times;
  fb_s_ = t.end_s;
}

void StepMeter::record_waiting(const StepTimes& t, comm::Communicator& ep_group) {
  const std::vector<std::string> group =
      ep_group.all_gather_bytes(alltoall_durations_text(t.all_to_all));
  waiting_s_ = exposed_waiting_seconds(t.all_to_all, group, t.compute);
}

void StepMeter::record_step_end(const StepTimes& t, double step_seconds, int64_t weights,
                                bool defer_optimizer) {
  const double end = step_seconds - std::max(t.end_s, t.reduce_end_s);
  if (end > 0 && weights > 0) {
    node_times_.step_end_s_per_weight = end / static_cast<double>(weights);
  }
  node_times_.defer_optimizer = defer_optimizer;
}

}  // namespace tandem::runtime
