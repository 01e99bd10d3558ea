// make_plan: schedule (generated, or loaded and lowered), validation, pipeline model, simulation.
#include "planner/planner.h"

#include "core/error.h"
#include "schedule/validator.h"

namespace tandem::schedule {
namespace {

bool has_communication(const Schedule& s) {
  for (const auto& list : s.ranks) {
    for (const Action& a : list) {
      if (is_communication(a.kind)) return true;
    }
  }
  return false;
}

}  // namespace

Schedule plan_schedule(const PlanRequest& req) {
  Schedule s;
  if (!req.schedule_file.empty()) {
    s = load_schedule_file(req.schedule_file);
    validate_structure(s);
    // A compute-only file gets the same SEND/RECV lowering as the built-in schedules.
    if (!has_communication(s)) add_communication(s);
  } else {
    // The bounds first, before a schedule of that size is built.
    const ScheduleKind kind = parse_schedule_kind(req.schedule_name);
    check_supported(kind, req.shape);
    check_planned_node_runs(req.inputs.model, req.shape.num_microbatches);
    s = generate_schedule(kind, req.shape);
  }
  validate_schedule(s);
  return s;
}

Plan make_plan(const PlanRequest& req) {
  Plan plan;
  plan.schedule = plan_schedule(req);
  plan.inputs = req.inputs;
  plan.model = build_pipeline_model(plan.schedule, req.inputs);
  plan.sim = simulate(plan.schedule, plan.model);
  return plan;
}

}  // namespace tandem::schedule
