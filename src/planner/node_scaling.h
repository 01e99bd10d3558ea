// Node times measured at one shape, planned at another: the node-times file says where it was
// measured ("measured_at"), and each node's time is scaled by its work.
// See Note [Node times at another shape] in node_scaling.cc.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "core/config.h"
#include "core/footprint.h"
#include "planner/cost_model.h"

namespace tandem::schedule {

// Throws tandem::Error naming the first setting in which `model` and `activation_elem_bytes`
// differ from `at` that the scaling cannot carry (a width, a dtype), and what would be valid.
void check_transferable(const MeasuredShape& at, const ModelConfig& model,
                        int64_t activation_elem_bytes);

// The times of `kind` at `shape` (of `cfg`, expert-parallel size `ep`) from the table's times at
// its measured_at (which must be set).
NodePhaseTimes scaled_node_times(const CostModel& cost, NodeKind kind, const ModelConfig& cfg,
                                 const FootprintShape& shape, int64_t ep);

// The line t = fixed_s + slope * work through the file's compute node phases at the measured
// shape: fixed_s the fit's intercept (at least 0; the file's node_overhead_s when it has one),
// slope the seconds a roofline second of work takes (the least-squares slope through that fixed
// part, at least 0). `planned` gives the layout flags (fused LM head, MoE layer).
struct NodeLine {
  double fixed_s = 0;
  double slope = 0;
};
NodeLine node_line(const CostModel& cost, const FootprintShape& planned);
// node_line's fixed_s: what a node costs beyond its work.
double node_overhead_s(const CostModel& cost, const FootprintShape& planned);

}  // namespace tandem::schedule
