// `tandem plan --search`: which layouts of the model fit on --world-size ranks under
// --memory-limit, best planned tokens/s first, and why the others do not (planner/search.h).
#pragma once

#include <cstdint>

#include "cli/cli_fwd.h"
#include "cli/plan_options.h"
#include "planner/planner.h"

namespace tandem::cli {

struct RunOptions;

// Before anything is read: with --search, refuses the plan options that take one schedule or
// one run (--schedule-file, --svg, --routing, ...) and requires --world-size and --memory-limit;
// without it, refuses --world-size and --search-top. Throws tandem::Error naming the option.
void check_search_options(const CLI::App& plan, const SearchOptions& s, double memory_limit);

// Runs the search from the plan of the command line (`base`: the model, costs and device; the
// options the user gave fix their dimensions) and prints the table, or with `json` the JSON.
void run_search(const CLI::App& plan, const RunOptions& o, const schedule::PlanRequest& base,
                const SearchOptions& s, int64_t memory_limit, bool json);

}  // namespace tandem::cli
