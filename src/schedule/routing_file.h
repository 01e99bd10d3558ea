// Measured routing on disk: `tandem train --routing-out FILE` writes every rank's pipeline table
// (Note [Measured routing] below) and `tandem plan --routing FILE` reads one back,
// so the planner's expert-parallel memory is that step's, not balanced routing's.
//
// {"num_microbatches": M, "num_layers": L,
//  "ranks": [{"rank": 0, "expert_rows": [M * L integers, micro-batch-major]}, ...]}
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::schedule {

// Note [Measured routing]: with EP > 1, or with an expert capacity but no padding
// (Note [Expert capacity] in core/footprint.h), the rows a rank's experts receive depend on the
// router, so the balanced figure (S rows, FootprintShape::expert_rows) is only an estimate. A
// RoutingCounts table, recorded by the runtime during a step (PipelineTrainer::routing_counts),
// gives the rows the experts of one pipeline (one data-parallel / expert-parallel rank's
// pipeline) received for each (micro-batch, global layer); the layer names the stage and the
// experts node. Only those rows depend on the routing: the attention, dispatch and combine
// nodes' saved tensors are sized by the S slots and the expert count (with EP = 1 combine keeps
// the experts' output, R rows). The node times keep balanced routing.
struct RoutingCounts {
  int32_t num_microbatches = 0;      // per data-parallel rank (the schedule's)
  int32_t num_layers = 0;            // the model's, all stages
  std::vector<int64_t> expert_rows;  // [micro-batch * num_layers + layer]; -1: not measured

  RoutingCounts() = default;
  RoutingCounts(int32_t microbatches, int32_t layers)
      : num_microbatches(microbatches),
        num_layers(layers),
        expert_rows(static_cast<size_t>(microbatches) * layers, -1) {}
  bool empty() const { return expert_rows.empty(); }
  int64_t& at(int32_t mb, int32_t layer) {
    return expert_rows[static_cast<size_t>(mb) * num_layers + layer];
  }
  int64_t at(int32_t mb, int32_t layer) const {
    return expert_rows[static_cast<size_t>(mb) * num_layers + layer];
  }
};

// One layer's expert work on one rank of an expert-parallel group, against the group's mean
// rows (Note [Slowest expert rank] in routing_file.h): own scales the rank's experts times, wait
// times the experts' time is how long the all-to-all after them waits for the slowest rank.
struct ExpertPace {
  double own = 1, wait = 0;
};

// The file's text for `tables[r]`, world rank r's pipeline table (all of one shape).
std::string routing_file_text(const std::vector<RoutingCounts>& tables);

// World rank `rank`'s table from the file's text; throws tandem::Error naming `source` and what
// is wrong (not JSON, a missing key, a rank not in the file, a table of the wrong size, a
// negative count).
RoutingCounts parse_routing_file(std::string_view text, std::string_view source, int rank);
// Every rank's table, by world rank (the same checks).
std::map<int, RoutingCounts> parse_routing_tables(std::string_view text, std::string_view source);
std::map<int, RoutingCounts> load_routing_tables(const std::string& path);
// `rank`'s table of those; throws naming `source` and the ranks the file has when it is missing.
RoutingCounts routing_table_of(const std::map<int, RoutingCounts>& tables, int rank,
                               std::string_view source);

// Note [Slowest expert rank]: an all-to-all finishes when its slowest rank reaches it. So on
// each rank of an expert-parallel group a layer's experts run at the rank's own pace (its rows),
// and the all-to-all right after them (combine's forward; dispatch's input-gradient backward)
// waits, beyond its own transfer, until the group's slowest rank has finished its experts too.
// Measured node times are means over ranks (rows near the mean), so for each global layer, with
// sums over micro-batches: own = the rank's rows / the group's mean rows, and wait = (the
// group's largest rows - the rank's) / the mean (PlanInputs::expert_pace). The slowest rank
// waits for nobody, the others for the difference; own + wait is the group's pace (1 when the
// routing is balanced). Unmeasured entries (-1: layers of other stages) are skipped.
std::vector<ExpertPace> expert_pace(const std::vector<RoutingCounts>& group, size_t me);

// How unevenly a step's routed rows fell on the ranks of an expert-parallel group, as the most
// loaded rank's rows over the group's mean (1: even): over the step (each layer's rows summed
// over the micro-batches; sum over layers of the largest over sum of the means) and per
// (micro-batch, layer), which is what each all-to-all waits for (the median and the largest).
// Unmeasured entries (-1) are skipped; every figure is -1 when nothing was measured.
struct RowsSpread {
  double step = -1, microbatch_median = -1, microbatch_max = -1;
};
RowsSpread expert_rows_spread(const std::vector<RoutingCounts>& group);

}  // namespace tandem::schedule
