// The planner = simulator + liveness: from the config, a schedule (built in or from a file) and
// a cost model, predicts every rank's timeline, bubble, exposed communication and memory peak,
// and writes them as a table, a JSON summary, a Chrome/Perfetto trace and an SVG chart.
#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "planner/pipeline_model.h"
#include "planner/simulator.h"
#include "schedule/action.h"
#include "schedule/generators.h"

namespace tandem::schedule {

struct PlanRequest {
  std::string schedule_name = "1f1b";  // a built-in schedule (schedule_kind_names())...
  std::string schedule_file;           // ...or, when set, a schedule file (docs/schedules.md)
  ScheduleShape shape;                 // for built-in schedules
  PlanInputs inputs;
};

struct Plan {
  Schedule schedule;
  PipelineModel model;
  SimResult sim;
  PlanInputs inputs;
};

// Builds (or loads, adding SEND/RECV to a compute-only file) and validates the schedule.
Schedule plan_schedule(const PlanRequest& request);

// plan_schedule, build_pipeline_model and simulate. Throws tandem::Error for bad input.
Plan make_plan(const PlanRequest& request);

// The global batch's tokens (micro-batches x micro-batch x data-parallel ranks x sequence) over
// the whole step (SimResult::full_step_s); none under uniform costs.
std::optional<double> planned_tokens_per_s(const Plan& plan);

// "1.168 s", "6.787 ms", "190.3 us" (uniform costs: "12.00 u"): a time of the plan.
std::string format_plan_time(double s, CostModelKind kind);

// A table with one row per rank (stages, busy, bubble, exposed communication, memory).
std::string format_plan_table(const Plan& plan);

// {"schedule", "pipeline_size", ..., "bubble_fraction", "step_time_s", "ranks": [{"rank",
//  "peak_bytes", "activation_peak_bytes", "exposed_comm_s", ...}]}
nlohmann::json plan_summary_json(const Plan& plan);

// Chrome / Perfetto trace JSON: a process per rank with a compute and a comm thread, the memory
// as a counter track. Throws tandem::Error if the file cannot be written.
void write_trace(const Plan& plan, const std::string& path);
std::string trace_json(const Plan& plan);

// Note [Planned and measured on one chart]: the events of a measured trace (`tandem train
// --trace`, read from `source`); throws tandem::Error naming `source` when it is not one.
nlohmann::json measured_trace_events(std::string_view measured_text, std::string_view source);
// The plan's trace with those events merged in, each measured rank beside its planned one.
std::string merged_trace_json(const Plan& plan, const nlohmann::json& measured_events);
// Each measured process's forward-backward: the end of its last compute or comm span, seconds.
std::map<int, double> measured_forward_backward(const nlohmann::json& measured_events,
                                                std::string_view source);
// Per pipeline rank r of the plan with a measured forward-backward: "rank 0: forward-backward
// planned 120.731 ms, measured 123.430 ms (-2.2%)" lines (the plan against the measurement).
std::string planned_against_measured(const Plan& plan, const std::map<int, double>& measured);

// SVG Gantt chart (a row per rank and stream) with each rank's memory curve beneath.
void write_svg(const Plan& plan, const std::string& path);
std::string plan_svg(const Plan& plan);

}  // namespace tandem::schedule
