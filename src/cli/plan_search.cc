// `tandem plan --search` (plan_search.h): the search space from the command line, the search
// (planner/search.h), and its table or JSON: the layouts that fit, best first, then why the
// others do not.
#include "cli/plan_search.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/options.h"
#include "cli/progress.h"
#include "core/error.h"
#include "planner/search.h"

namespace tandem::cli {
namespace {

using schedule::SearchDimension;
using schedule::SearchResult;
using schedule::SearchRow;

// Options that plan one schedule or one run, which a search of many cannot take.
constexpr const char* kOneRunOptions[] = {
    "--schedule-file",  "--svg",     "--write-schedule",    "--trace",
    "--measured-trace", "--routing", "--compare-schedules", "--num-microbatches",
};

// The user's values fix their dimensions (Note [Search dimensions] in planner/search.cc).
std::map<std::string, int64_t> fixed_values(const CLI::App& app,
                                            const schedule::PlanRequest& base) {
  std::map<std::string, int64_t> fixed;
  for (const SearchDimension& d : schedule::search_dimensions()) {
    if (app.get_option_no_throw("--" + d.option) != nullptr && app.count("--" + d.option) > 0)
      fixed[d.option] = d.read(base);
  }
  return fixed;
}

// Prints "tandem plan --search: 340 of 1210 candidates planned (4.0 s)" to stderr every few
// seconds of a long search (called under the search's lock).
struct Progress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double next_s = 2;
  void operator()(int64_t done, int64_t total) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s < next_s || done == total) return;
    next_s = s + 2;
    std::cerr << "tandem plan --search: " << done << " of " << total << " candidates planned ("
              << format_fixed(s, 1) << " s)" << std::endl;
  }
};

// A value as JSON: the number, or the label where the label is a name ("1f1b", "on").
nlohmann::json value_json(const SearchDimension& d, int64_t v) {
  const std::string label = d.label(v);
  if (label == std::to_string(v)) return v;
  return label;
}

nlohmann::json row_json(const SearchRow& r) {
  const std::vector<SearchDimension>& dims = schedule::search_dimensions();
  nlohmann::json j;
  for (size_t i = 0; i < dims.size(); ++i) j[dims[i].option] = value_json(dims[i], r.choice[i]);
  j["simulated"] = r.simulated;
  j["peak_bytes"] = r.peak_bytes;
  j["peak_rank"] = r.peak_rank;
  j["static_bytes"] = r.static_bytes;
  if (r.simulated) {
    j["activation_peak_bytes"] = r.activation_peak_bytes;
    j["tokens_per_s"] = r.tokens_per_s;
    j["full_step_s"] = r.full_step_s;
    j["bubble_fraction"] = r.bubble_fraction;
  }
  return j;
}

// The values of the dimensions that are not the layout: "mbs 1 M 8 schedule 1f1b V 1 ...".
std::string variant_label(const std::vector<int64_t>& choice) {
  const std::vector<SearchDimension>& dims = schedule::search_dimensions();
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].layout) continue;
    out += detail::concat(out.empty() ? "" : " ", dims[i].column, " ", dims[i].label(choice[i]));
  }
  return out;
}

// Each layout with no variant that fits, and its variant of the lowest peak (the search's order).
std::vector<const SearchRow*> layouts_over(const SearchResult& res) {
  std::map<std::string, const SearchRow*> fitting, lowest;
  std::vector<std::string> order;
  for (const SearchRow& r : res.fits) fitting[schedule::layout_label(r.choice)] = &r;
  for (const SearchRow& r : res.over_limit) {
    const std::string key = schedule::layout_label(r.choice);
    if (fitting.count(key) > 0) continue;
    auto [it, added] = lowest.emplace(key, &r);
    if (added) order.push_back(key);
    if (r.peak_bytes < it->second->peak_bytes) it->second = &r;
  }
  std::vector<const SearchRow*> out;
  for (const std::string& key : order) out.push_back(lowest[key]);
  return out;
}

struct RejectGroup {
  int dimension = 0;
  std::string why;
  std::vector<int64_t> values;
};

// The rejected values of layout dimensions, one group per dimension and reason.
std::vector<RejectGroup> reject_groups(const SearchResult& res) {
  std::vector<RejectGroup> groups;
  for (const schedule::SearchReject& r : res.rejects) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const RejectGroup& g) {
      return g.dimension == r.dimension && g.why == r.why;
    });
    if (it == groups.end()) it = groups.insert(groups.end(), {r.dimension, r.why, {}});
    const int64_t v = r.prefix.back();
    if (std::find(it->values.begin(), it->values.end(), v) == it->values.end())
      it->values.push_back(v);
  }
  return groups;
}

std::string over_line(const SearchRow& r, int64_t limit) {
  const std::string head = detail::concat(
      schedule::layout_label(r.choice), ": ", r.simulated ? "" : "at least ",
      format_bytes(r.peak_bytes), " on rank ", r.peak_rank, " > ", format_bytes(limit),
      " (weights, gradients and optimizer state ", format_bytes(r.static_bytes));
  if (!r.simulated) return head + " and what one micro-batch's activations keep on the device)";
  return detail::concat(head, "; the lowest of its variants: ", variant_label(r.choice), ")");
}

std::string fits_table(const SearchResult& res, int64_t top, schedule::CostModelKind kind) {
  const std::vector<SearchDimension>& dims = schedule::search_dimensions();
  const size_t rows =
      top > 0 ? std::min<size_t>(res.fits.size(), static_cast<size_t>(top)) : res.fits.size();
  std::vector<size_t> width(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    width[i] = dims[i].column.size();
    for (size_t r = 0; r < rows; ++r)
      width[i] = std::max(width[i], dims[i].label(res.fits[r].choice[i]).size());
  }
  std::ostringstream out;
  char cell[96];
  for (size_t i = 0; i < dims.size(); ++i)
    out << (i ? " " : "") << std::string(width[i] - dims[i].column.size(), ' ') << dims[i].column;
  std::snprintf(cell, sizeof cell, " %12s %10s %8s %10s %4s\n", "tokens/s", "step", "bubble%",
                "peak", "rank");
  out << cell;
  for (size_t r = 0; r < rows; ++r) {
    const SearchRow& row = res.fits[r];
    for (size_t i = 0; i < dims.size(); ++i) {
      const std::string label = dims[i].label(row.choice[i]);
      out << (i ? " " : "") << std::string(width[i] - label.size(), ' ') << label;
    }
    std::snprintf(cell, sizeof cell, " %12.0f %10s %8.1f %10s %4d\n", row.tokens_per_s,
                  schedule::format_plan_time(row.full_step_s, kind).c_str(),
                  100 * row.bubble_fraction, format_bytes(row.peak_bytes).c_str(), row.peak_rank);
    out << cell;
  }
  if (rows < res.fits.size()) {
    out << "(" << res.fits.size() - rows
        << " more fit: --search-top 0 prints them all, --json gives every row)\n";
  }
  return out.str();
}

void print_table(const SearchResult& res, const schedule::SearchSpace& space,
                 const schedule::PlanRequest& base, int64_t top) {
  std::ostringstream out;
  out << "tandem plan --search: " << space.world_size << " ranks, global batch "
      << space.global_batch_size << " x " << base.inputs.model.seq_length << " tokens, "
      << "--memory-limit " << format_bytes(space.memory_limit) << " a rank, cost model "
      << schedule::cost_model_name(base.inputs.cost.kind) << "\n"
      << res.candidates << " candidates: " << res.simulated << " simulated, "
      << res.candidates - res.simulated - static_cast<int64_t>(res.not_planned.size())
      << " over the limit by their weights and one micro-batch alone; " << res.fits.size()
      << " fit\n";
  if (!res.fits.empty()) out << fits_table(res, top, base.inputs.cost.kind);
  const std::vector<const SearchRow*> over = layouts_over(res);
  if (!over.empty()) {
    out << "layouts of which nothing fits (each one's lowest peak):\n";
    for (const SearchRow* r : over) out << "  " << over_line(*r, space.memory_limit) << "\n";
  }
  const std::vector<RejectGroup> groups = reject_groups(res);
  if (!groups.empty()) out << "not layouts of this model on " << space.world_size << " ranks:\n";
  for (const RejectGroup& g : groups) {
    const SearchDimension& d = schedule::search_dimensions()[static_cast<size_t>(g.dimension)];
    std::string values;
    for (int64_t v : g.values) values += (values.empty() ? "" : ", ") + d.label(v);
    out << "  " << d.column << " " << values << ": " << g.why << "\n";
  }
  if (!res.not_planned.empty()) {
    out << res.not_planned.size() << " candidates the planner refused, e.g. "
        << schedule::choice_label(res.not_planned.front().choice) << ": "
        << res.not_planned.front().error << "\n";
  }
  std::cout << out.str() << std::flush;
}

void print_json(const SearchResult& res, const schedule::SearchSpace& space) {
  nlohmann::json j = {{"world_size", space.world_size},
                      {"global_batch_size", space.global_batch_size},
                      {"memory_limit_bytes", space.memory_limit},
                      {"candidates", res.candidates},
                      {"simulated", res.simulated}};
  j["fits"] = nlohmann::json::array();
  for (const SearchRow& r : res.fits) j["fits"].push_back(row_json(r));
  j["layouts_over_limit"] = nlohmann::json::array();
  for (const SearchRow* r : layouts_over(res)) {
    nlohmann::json o = row_json(*r);
    o["layout"] = schedule::layout_label(r->choice);
    j["layouts_over_limit"].push_back(std::move(o));
  }
  j["over_limit_count"] = res.over_limit.size();
  j["not_layouts"] = nlohmann::json::array();
  for (const RejectGroup& g : reject_groups(res)) {
    const SearchDimension& d = schedule::search_dimensions()[static_cast<size_t>(g.dimension)];
    j["not_layouts"].push_back({{"option", d.option}, {"values", g.values}, {"why", g.why}});
  }
  j["not_planned"] = nlohmann::json::array();
  for (const SearchRow& r : res.not_planned)
    j["not_planned"].push_back(
        {{"candidate", schedule::choice_label(r.choice)}, {"error", r.error}});
  std::cout << j.dump(2) << std::endl;
}

}  // namespace

void check_search_options(const CLI::App& plan, const SearchOptions& s, double memory_limit) {
  if (!s.search) {
    for (const char* name : {"--world-size", "--search-top"}) {
      TANDEM_CHECK(plan.count(name) == 0, name,
                   " is an option of the layout search: add --search, or leave it out (one "
                   "layout's ranks a stage: --data-parallel-size)");
    }
    return;
  }
  for (const char* name : kOneRunOptions) {
    TANDEM_CHECK(plan.count(name) == 0, "--search plans many layouts and schedules: leave out ",
                 name, ", which takes one (plan the layout you choose without --search)");
  }
  TANDEM_CHECK(plan.count("--world-size") > 0,
               "--search needs --world-size N: the ranks (GPUs) to lay the model out on");
  TANDEM_CHECK(s.world_size >= 1, "--world-size ", s.world_size,
               " is invalid: the search needs at least 1 rank");
  TANDEM_CHECK(memory_limit > 0,
               "--search needs --memory-limit SIZE (e.g. 139GiB, 141e9): the memory a rank may "
               "hold, which the layouts it lists fit");
}

void run_search(const CLI::App& plan, const RunOptions& o, const schedule::PlanRequest& base,
                const SearchOptions& s, int64_t memory_limit, bool json) {
  schedule::SearchSpace space;
  space.world_size = s.world_size;
  space.global_batch_size = o.train.global_batch_size;
  space.memory_limit = memory_limit;
  space.fixed = fixed_values(plan, base);
  // As finalize_run_options sets it, for each candidate's expert ranks and schedule, unless
  // the user set it.
  if (plan.count("--defer-optimizer") == 0) {
    space.complete = [o](schedule::PlanRequest& req) {
      RunOptions run = o;
      run.parallel.expert_model_parallel_size = req.inputs.expert_parallel_size;
      run.parallel.schedule = req.schedule_name;
      run.train.use_distributed_optimizer = req.inputs.distributed_optimizer;
      req.inputs.defer_optimizer = defer_optimizer_by_default(run);
    };
  }
  Progress progress;
  space.progress = [&progress](int64_t done, int64_t total) { progress(done, total); };
  const SearchResult res = schedule::search_layouts(base, space);
  if (json) {
    print_json(res, space);
  } else {
    print_table(res, space, base, s.top);
  }
}

}  // namespace tandem::cli
