// Measured routing on disk: `tandem train --routing-out FILE` writes every rank's pipeline table
// (Note [Measured routing] in pipeline_model.h) and `tandem plan --routing FILE` reads one back,
// so the planner's expert-parallel memory is that step's, not balanced routing's.
//
// {"num_microbatches": M, "num_layers": L,
//  "ranks": [{"rank": 0, "expert_rows": [M * L integers, micro-batch-major]}, ...]}
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "schedule/pipeline_model.h"

namespace tandem::schedule {

// The file's text for `tables[r]`, world rank r's pipeline table (all of one shape).
std::string routing_file_text(const std::vector<RoutingCounts>& tables);

// World rank `rank`'s table from the file's text; throws tandem::Error naming `source` and what
// is wrong (not JSON, a missing key, a rank not in the file, a table of the wrong size, a
// negative count).
RoutingCounts parse_routing_file(std::string_view text, std::string_view source, int rank);
RoutingCounts load_routing_file(const std::string& path, int rank);

}  // namespace tandem::schedule
