// When a pipeline message's send buffer goes on the CPU: at the sender's first receive that
// proves the message delivered (Note [Send buffers released when known delivered]). The runtime
// (runtime/pipeline_messages.cc) and the planner (planner/simulator.cc) both follow this rule.
#pragma once

#include <cstdint>
#include <vector>

#include "schedule/action.h"

namespace tandem::schedule {

// Per rank, per action of its list: the indices (in the same list) of the SENDs whose buffers go
// once that action, a RECV, has completed. A SEND listed under no RECV goes at the end of the
// step's forward-backward. `schedule` must be validated (every RECV has its SEND).
using SendReleases = std::vector<std::vector<std::vector<int32_t>>>;
SendReleases send_releases(const Schedule& schedule);

}  // namespace tandem::schedule
