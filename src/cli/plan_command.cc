// `tandem plan`: run options -> PlanRequest -> schedule, validation, simulation -> a table per
// rank (or --json), a Chrome/Perfetto trace (--trace) and an SVG chart (--svg).
#include "cli/plan_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/options.h"
#include "cli/path_checks.h"
#include "cli/plan_options.h"
#include "cli/plan_search.h"
#include "cli/planned_run.h"
#include "cli/preflight.h"
#include "cli/progress.h"
#include "cli/sizes.h"
#include "comm/layout.h"
#include "core/error.h"
#include "io/atomic_dir.h"
#include "planner/planner.h"
#include "schedule/routing_file.h"

namespace tandem::cli {
namespace {

schedule::PlanRequest make_request(const CLI::App& app, const RunOptions& o, const PlanOptions& p) {
  schedule::PlanRequest req;
  req.schedule_name = o.parallel.schedule;
  req.schedule_file = p.schedule_file;
  int64_t v = o.parallel.virtual_pipeline_model_parallel_size;
  // dualpipev always runs two stages per rank; say so only when the user asked for another.
  if (schedule_kind(o.parallel) == schedule::ScheduleKind::kDualPipeV &&
      app.count("--virtual-pipeline-model-parallel-size") == 0)
    v = 2;
  req.inputs = run_inputs(o, p.data_parallel_size);
  schedule::PlanInputs& in = req.inputs;
  // As `tandem train` under mpirun: micro-batches per data-parallel rank (a schedule file fixes
  // them itself).
  const int64_t dp = schedule::resolved_data_parallel_size(in);
  if (p.num_microbatches == 0 && p.schedule_file.empty()) o.train.validate(dp);
  const int64_t m = p.num_microbatches > 0 ? p.num_microbatches : o.train.num_microbatches(dp);
  req.shape = {static_cast<int32_t>(o.parallel.pipeline_model_parallel_size),
               static_cast<int32_t>(v), static_cast<int32_t>(m), o.parallel.pair_first_forwards};
  // --device cuda plans the GPU trainer: bf16 activations unless --activation-bytes says else.
  if (!in.gpu || app.count("--activation-bytes") > 0) in.activation_elem_bytes = p.activation_bytes;
  in.cost.device = p.device;
  in.cost.kind = p.cost_model;
  if (!p.node_times.empty()) {
    in.cost.kind = schedule::CostModelKind::kNodeTimes;
    in.cost.table = schedule::load_node_times(p.node_times);
  }
  if (!p.routing.empty()) {
    const std::map<int, schedule::RoutingCounts> all = schedule::load_routing_tables(p.routing);
    const int rank = static_cast<int>(p.routing_rank);
    in.routing = schedule::routing_table_of(all, rank, p.routing);
    if (in.expert_parallel_size > 1) {  // Note [Slowest expert rank] in schedule/routing_file.h
      const comm::ParallelLayout layout = comm::ParallelLayout::make(
          static_cast<int>(all.size()), static_cast<int>(o.parallel.pipeline_model_parallel_size),
          static_cast<int>(in.expert_parallel_size));
      std::vector<schedule::RoutingCounts> group;
      size_t me = 0;
      for (int r : layout.ep_group(rank)) {
        if (r == rank) me = group.size();
        group.push_back(schedule::routing_table_of(all, r, p.routing));
      }
      in.expert_pace = schedule::expert_pace(group, me);
    }
  }
  return req;
}

// A schedule file fixes PP, the stages and the micro-batches; explicit options must agree.
void check_file_agrees(const CLI::App& app, const RunOptions& o, const PlanOptions& p,
                       const schedule::Schedule& s, const std::string& path) {
  const ParallelConfig& par = o.parallel;
  TANDEM_CHECK(app.count("--pipeline-model-parallel-size") == 0 ||
                   par.pipeline_model_parallel_size == s.num_ranks,
               "--pipeline-model-parallel-size ", par.pipeline_model_parallel_size,
               " disagrees with --schedule-file ", path, ", which has ", s.num_ranks,
               " ranks: drop the option or make them equal");
  TANDEM_CHECK(app.count("--virtual-pipeline-model-parallel-size") == 0 ||
                   par.virtual_pipeline_model_parallel_size * s.num_ranks == s.num_stages,
               "--virtual-pipeline-model-parallel-size ", par.virtual_pipeline_model_parallel_size,
               " disagrees with --schedule-file ", path, ", which has ", s.num_stages,
               " stages on ", s.num_ranks, " ranks");
  TANDEM_CHECK(app.count("--num-microbatches") == 0 || p.num_microbatches == s.num_microbatches,
               "--num-microbatches ", p.num_microbatches, " disagrees with --schedule-file ", path,
               ", which has ", s.num_microbatches, " micro-batches");
}

void write_text(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path);
  TANDEM_CHECK(f.good(), "cannot write the ", what, " file '", path, "'");
  f << text;
  TANDEM_CHECK(f.good(), "writing the ", what, " file '", path, "' failed");
}

// "every rank within --memory-limit 80.0 GiB (highest peak 7.3 GiB)" or "over --memory-limit
// ...: rank 0 (82.1 GiB), ...".
std::string memory_limit_line(const schedule::Plan& plan, int64_t limit) {
  std::string over;
  int64_t highest = 0;
  for (const schedule::RankResult& r : plan.sim.ranks) {
    highest = std::max(highest, r.peak_bytes);
    if (r.peak_bytes > limit) {
      over += detail::concat(over.empty() ? "" : ", ", "rank ", r.rank, " (",
                             format_bytes(r.peak_bytes), ")");
    }
  }
  if (over.empty()) {
    return detail::concat("every rank within --memory-limit ", format_bytes(limit),
                          " (highest peak ", format_bytes(highest), ")\n");
  }
  return detail::concat("over --memory-limit ", format_bytes(limit), ": ", over, "\n");
}

// Stages per rank for `kind` when the user's V does not fit it: dualpipev always 2, interleaved
// at least 2, the one-chunk schedules 1, combined 1f1b the user's.
int32_t virtual_stages_for(schedule::ScheduleKind kind, int32_t v) {
  using K = schedule::ScheduleKind;
  switch (kind) {
    case K::kDualPipeV:
      return 2;
    case K::kInterleaved1f1b:
      return std::max(v, 2);
    case K::kCombined1f1b:
      return v;
    default:
      return 1;
  }
}

// --compare-schedules: every built-in schedule on the request's layout, model and costs.
void compare_schedules(const schedule::PlanRequest& base, bool json, int64_t memory_limit) {
  nlohmann::json rows = nlohmann::json::array();
  const schedule::CostModelKind cm = base.inputs.cost.kind;
  const char* unit = cm == schedule::CostModelKind::kUniform ? "u" : "ms";
  const double scale = cm == schedule::CostModelKind::kUniform ? 1 : 1e3;
  std::ostringstream text;
  char line[256];
  std::snprintf(line, sizeof line, "%-17s %2s %12s %12s %12s %8s %13s %10s\n", "schedule", "V",
                (std::string("step ") + unit).c_str(), (std::string("whole ") + unit).c_str(),
                "tokens/s", "bubble%", "exposed a2a", "peak");
  text << line;
  for (int k = 0; k < schedule::kNumScheduleKinds; ++k) {
    const auto kind = static_cast<schedule::ScheduleKind>(k);
    schedule::PlanRequest req = base;
    req.schedule_name = std::string(schedule::schedule_kind_name(kind));
    req.shape.virtual_stages = virtual_stages_for(kind, base.shape.virtual_stages);
    req.shape.pair_first_forwards =
        kind == schedule::ScheduleKind::kCombined1f1b && base.shape.pair_first_forwards;
    nlohmann::json row = {{"schedule", req.schedule_name},
                          {"virtual_stages", req.shape.virtual_stages}};
    try {
      const schedule::Plan plan = schedule::make_plan(req);
      double exposed = 0;
      int64_t peak = 0;
      for (const schedule::RankResult& r : plan.sim.ranks) {
        exposed = std::max(exposed, r.exposed_alltoall_s);
        peak = std::max(peak, r.peak_bytes);
      }
      row["step_time_s"] = plan.sim.step_time_s;
      row["full_step_s"] = plan.sim.full_step_s;
      row["tokens_per_s"] = schedule::planned_tokens_per_s(plan).value_or(0.0);
      row["bubble_fraction"] = plan.sim.bubble_fraction;
      row["exposed_alltoall_s"] = exposed;
      row["peak_bytes"] = peak;
      if (memory_limit > 0) row["fits"] = peak <= memory_limit;
      std::snprintf(line, sizeof line, "%-17s %2d %12.3f %12.3f %12.0f %8.1f %13.3f %10s%s\n",
                    req.schedule_name.c_str(), req.shape.virtual_stages,
                    scale * plan.sim.step_time_s, scale * plan.sim.full_step_s,
                    row["tokens_per_s"].get<double>(), 100 * plan.sim.bubble_fraction,
                    scale * exposed, format_bytes(peak).c_str(),
                    memory_limit > 0 && peak > memory_limit ? "  over the limit" : "");
      text << line;
    } catch (const Error& e) {
      row["error"] = e.what();
      text << req.schedule_name << ": not on this layout: " << e.what() << "\n";
    }
    rows.push_back(std::move(row));
  }
  if (json) {
    std::cout << nlohmann::json{{"schedules", rows}}.dump(2) << std::endl;
    return;
  }
  const int64_t dp = schedule::resolved_data_parallel_size(base.inputs);
  if (memory_limit > 0) text << "(--memory-limit " << format_bytes(memory_limit) << " a rank)\n";
  std::cout << "every built-in schedule, PP " << base.shape.pipeline_size << ", "
            << base.shape.num_microbatches << " micro-batches, EP "
            << base.inputs.expert_parallel_size << ", DP " << dp << ", cost model "
            << schedule::cost_model_name(cm)
            << " (step: forward-backward; whole: with the all-reduce, norm and update; exposed "
               "a2a and peak: the highest rank's)\n"
            << text.str() << std::flush;
}

// --memory-limit's size in bytes (0 when not given); the plan's own checks.
void finalize_plan_options(const CLI::App& app, PlanOptions& p) {
  if (!p.memory_limit_text.empty()) {
    const std::optional<double> bytes = parse_size(p.memory_limit_text);
    TANDEM_CHECK(bytes && *bytes >= 1 && *bytes < 9e18, "--memory-limit ", p.memory_limit_text,
                 " is not a size of at least one byte below 9e18: use ", kSizeForms);
    p.memory_limit = *bytes;
  }
  TANDEM_CHECK(p.node_times.empty() || app.count("--cost-model") == 0, "--node-times ",
               p.node_times, " replaces the cost model: drop --cost-model ",
               schedule::cost_model_name(p.cost_model));
  TANDEM_CHECK(!p.routing.empty() || app.count("--routing-rank") == 0, "--routing-rank ",
               p.routing_rank, " needs --routing FILE");
  check_search_options(app, p.search, p.memory_limit);
  // --svg NAME without an extension writes NAME.svg, the file a browser opens as a chart.
  if (!p.svg.empty() && std::filesystem::path(p.svg).extension().empty() && p.svg.back() != '/') {
    p.svg += ".svg";
  }
}

void run_plan(const CLI::App& app, RunOptions& o, PlanOptions& p) {
  finalize_run_options(app, o, {}, plan_settings(p));
  (void)memory_available_option(o, "plan");
  finalize_plan_options(app, p);
  // Note [Outputs that are inputs]: every output checked before any is written.
  check_outputs(
      {{"--config", o.config_file},
       {"--schedule-file", p.schedule_file},
       {"--node-times", p.node_times},
       {"--routing", p.routing},
       {"--measured-trace", p.measured_trace}},
      {{"--trace", o.trace_path}, {"--svg", p.svg}, {"--write-schedule", p.write_schedule}});
  const schedule::PlanRequest req = make_request(app, o, p);
  if (p.search.search) {
    run_search(app, o, req, p.search, static_cast<int64_t>(p.memory_limit), p.json);
    return;
  }
  if (p.compare_schedules) {
    TANDEM_CHECK(p.schedule_file.empty() && p.svg.empty() && p.write_schedule.empty() &&
                     o.trace_path.empty() && p.measured_trace.empty(),
                 "--compare-schedules plans every built-in schedule: leave out --schedule-file, "
                 "--svg, --write-schedule, --trace and --measured-trace (they take one "
                 "schedule)");
    compare_schedules(req, p.json, static_cast<int64_t>(p.memory_limit));
    return;
  }
  schedule::Plan plan;
  plan.schedule = schedule::plan_schedule(req);
  if (!p.schedule_file.empty()) check_file_agrees(app, o, p, plan.schedule, p.schedule_file);
  plan.inputs = req.inputs;
  plan.model = schedule::build_pipeline_model(plan.schedule, req.inputs);
  plan.sim = schedule::simulate(plan.schedule, plan.model);
  // Note [Planned and measured on one chart] (planner/trace_export.cc).
  const bool with_measured = !p.measured_trace.empty();
  const nlohmann::json measured =
      with_measured
          ? schedule::measured_trace_events(io::read_file(p.measured_trace), p.measured_trace)
          : nlohmann::json();
  const std::map<int, double> measured_ends =
      with_measured ? schedule::measured_forward_backward(measured, p.measured_trace)
                    : std::map<int, double>();
  // Every input is read and checked by now: the writes below only write.
  if (!p.write_schedule.empty()) {
    write_text(p.write_schedule, schedule::format_schedule(plan.schedule), "schedule");
  }
  if (!o.trace_path.empty()) {
    if (with_measured) {
      write_text(o.trace_path, schedule::merged_trace_json(plan, measured), "trace");
    } else {
      schedule::write_trace(plan, o.trace_path);
    }
  }
  if (!p.svg.empty()) schedule::write_svg(plan, p.svg);
  if (p.json) {
    nlohmann::json j = schedule::plan_summary_json(plan);
    for (nlohmann::json& r : j["ranks"]) {
      const auto it = measured_ends.find(r["rank"].get<int>());
      if (it != measured_ends.end()) r["measured_forward_backward_s"] = it->second;
    }
    const auto limit = static_cast<int64_t>(p.memory_limit);
    if (limit > 0) {
      j["memory_limit_bytes"] = limit;
      for (nlohmann::json& r : j["ranks"]) r["fits"] = r["peak_bytes"].get<int64_t>() <= limit;
    }
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cout << schedule::format_plan_table(plan) << std::flush;
    if (p.memory_limit > 0) {
      std::cout << memory_limit_line(plan, static_cast<int64_t>(p.memory_limit)) << std::flush;
    }
    std::cout << schedule::planned_against_measured(plan, measured_ends) << std::flush;
  }
}

}  // namespace

void register_plan_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Predict each pipeline rank's timeline, bubble, exposed communication and memory "
      "for a schedule, before running it");
  auto opts = std::make_shared<RunOptions>();
  auto plan = std::make_shared<PlanOptions>();
  add_run_options(*sub, *opts);
  add_settings(*sub, plan_settings(*plan));
  sub->callback([sub, opts, plan] { run_plan(*sub, *opts, *plan); });
}

}  // namespace tandem::cli
