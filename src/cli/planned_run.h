// The plan of a training run (src/schedule's planner with the run's options): what `tandem
// train` says of its memory before the first step, and the inputs `tandem plan` shares with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "planner/planner.h"

namespace tandem::cli {

struct RunOptions;
struct IterationRecord;

// What a training run with these options is, for the planner: the model, the layout, the GPU
// trainer's layout of memory (bf16 activations) or the CPU's (f32), recomputation, the deferred
// update and the gradient all-reduce (dp 0: the expert-parallel size).
schedule::PlanInputs run_inputs(const RunOptions& o, int64_t dp);

// The planner's request for a training run with these options (the schedule and shape it runs,
// dp ranks a stage).
schedule::PlanRequest run_request(const RunOptions& o, const std::string& schedule_name,
                                  const schedule::ScheduleShape& shape, int64_t dp);
// The plan of a training run with these options (the schedule and shape it runs, dp ranks a
// stage), with the roofline's costs: what `tandem train` holds in memory, planned before its
// first step (the activation peak exactly, with one expert rank; docs/parallel.md).
schedule::Plan plan_training_run(const RunOptions& o, const std::string& schedule_name,
                                 const schedule::ScheduleShape& shape, int64_t dp);
// plan_training_run, or nothing when the planner does not take the run (the run goes on
// without a plan; `why` gets the planner's error).
std::optional<schedule::Plan> plan_of_run(const RunOptions& o, const std::string& schedule_name,
                                          const schedule::ScheduleShape& shape, int64_t dp,
                                          std::string& why);
// The plan's peak and activation peak for each world rank (its pipeline rank's, as given), into
// the record's planned_* fields.
void set_planned_peaks(IterationRecord& rec, const schedule::Plan& plan,
                       const std::vector<int32_t>& pipeline_rank_of_world_rank);
// "memory as planned (tandem plan): peak 7.28 GiB, 6.53 GiB per pipeline rank, of it
// activations 1.84 GiB, 1.30 GiB".
std::string planned_memory_line(const schedule::Plan& plan);

}  // namespace tandem::cli
