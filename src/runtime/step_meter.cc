// Step measurement (step_meter.h).
#include "runtime/step_meter.h"

#include <algorithm>
#include <cstddef>
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
  // Note [Node times over steps]: the first step aside, the last kNodeSteps.
  if (steps_++ > 0) {
    if (node_steps_.size() == kNodeSteps) node_steps_.erase(node_steps_.begin());
    node_steps_.push_back(t.node_times.nodes);
  }
  fb_s_ = t.end_s;
}

// Note [Node times over steps]: a node phase's time in the node-times file is its median over
// the run's steps (the last kNodeSteps), the first left out when there are more (it tunes every
// product it meets,
// Note [Tuned algorithms] in ops/cuda/gemm.cc). A later step can still meet a product shape
// the run has not tuned yet (an expert receiving more rows than ever before: a new bucket of
// Note [Algorithm buckets]) and spend tens of milliseconds tuning inside one node; the last
// step alone, or a mean, would carry that into the plan.
schedule::NodeTimesTable StepMeter::node_times() const {
  schedule::NodeTimesTable out = node_times_;  // one step: its own
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  for (size_t k = 0; k < out.nodes.size(); ++k) {
    std::vector<double> f, bi, bw;
    for (const auto& step : node_steps_) {
      if (!step[k]) continue;
      f.push_back(step[k]->forward_s);
      bi.push_back(step[k]->backward_input_s);
      bw.push_back(step[k]->backward_weight_s);
    }
    if (f.empty()) continue;
    out.nodes[k] = schedule::NodePhaseTimes{median(f), median(bi), median(bw)};
  }
  return out;
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
