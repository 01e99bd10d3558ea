// `tandem plan`'s own settings, beside the run's (Note [Every setting declared once] in
// core/settings.h): the schedule file, the cost model and device, the outputs, the search.
#pragma once

#include <cstdint>
#include <string>

#include "core/settings.h"
#include "planner/cost_model.h"

namespace tandem::cli {

struct SearchOptions {
  bool search = false;     // --search
  int64_t world_size = 0;  // --world-size: ranks (GPUs) to lay out; 0: not given
  int64_t top = 10;        // --search-top: fitting rows printed; 0: all
};

struct PlanOptions {
  std::string schedule_file;
  schedule::CostModelKind cost_model = schedule::CostModelKind::kRoofline;
  std::string node_times;
  std::string routing;       // --routing FILE (tandem train --routing-out)
  int64_t routing_rank = 0;  // --routing-rank: whose pipeline's table
  std::string svg;
  std::string write_schedule;
  std::string measured_trace;  // --measured-trace FILE (tandem train --trace)
  bool json = false;           // --json: a JSON summary instead of the table
  bool compare_schedules = false;
  std::string memory_limit_text;  // --memory-limit SIZE
  double memory_limit = 0;        // ... in bytes; 0: none
  int64_t activation_bytes = 4;
  int64_t data_parallel_size = 0;  // 0: --expert-model-parallel-size
  int64_t num_microbatches = 0;    // 0: derived from the batch sizes
  schedule::DeviceDesc device;
  SearchOptions search;
};

// The rows of `p`'s settings (SettingGroup::kPlan).
Settings plan_settings(PlanOptions& p);

}  // namespace tandem::cli
