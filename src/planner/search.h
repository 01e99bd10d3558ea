// The layout search of `tandem plan --search`: every way to lay a model out on a number of ranks
// (pipeline, data and expert parallel sizes, micro-batch size, schedule, stages per rank,
// recomputation) that tandem can run, planned, and kept when every rank's planned peak fits a
// memory limit. Note [Search dimensions] says how the space is built and pruned.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "planner/planner.h"

namespace tandem::schedule {

struct SearchSpace;

// One choice the search makes (See Note [Search dimensions] in search.cc).
struct SearchDimension {
  std::string option;  // the option it stands for ("pipeline-model-parallel-size")
  std::string column;  // its column in the table ("PP")
  // A layout dimension: one that says where ranks and weights sit (PP, DP, EP). The summary
  // names each layout of which no variant fits; the other dimensions are its variants.
  bool layout = false;
  // The values to try, given the request with the earlier dimensions applied.
  std::function<std::vector<int64_t>(const SearchSpace&, const PlanRequest&)> values;
  // Why `value` is not possible after the earlier dimensions (empty: it is), for a value the user
  // fixed as well as for one of `values`.
  std::function<std::string(const SearchSpace&, const PlanRequest&, int64_t)> check;
  std::function<void(PlanRequest&, int64_t)> apply;
  // The value a request holds (apply's inverse): how a value the user gave is fixed.
  std::function<int64_t(const PlanRequest&)> read;
  std::function<std::string(int64_t)> label;  // "1f1b", "on", "8"
};

// The dimensions, in the order they are chosen (a later one's values may depend on an earlier
// one's choice): PP, DP, EP, micro-batch size, micro-batches, schedule, V, the last stage's
// layers, paired first forwards, recomputation, the distributed optimizer, activation offload.
const std::vector<SearchDimension>& search_dimensions();
// The index of the dimension standing for `option`, or -1.
int search_dimension_index(const std::string& option);

// The most ranks a search lays out: past any machine built, and few enough that the divisors
// of every dimension are found at once.
constexpr int64_t kMaxSearchWorldSize = int64_t{1} << 20;

struct SearchSpace {
  int64_t world_size = 1;         // ranks (GPUs) to lay out
  int64_t global_batch_size = 1;  // samples per optimizer step
  int64_t memory_limit = 0;       // bytes a rank may hold
  // Values the user fixed, by option name (SearchDimension::option); the others are searched.
  std::map<std::string, int64_t> fixed;
  // Settings that follow from the searched ones as a run derives them (the deferred update's
  // default), applied to each candidate before it is planned; may be empty.
  std::function<void(PlanRequest&)> complete;
  // Called now and then from the planning threads with (planned, total); may be empty.
  std::function<void(int64_t, int64_t)> progress;
  int threads = 0;  // 0: the machine's hardware threads
};

enum class SearchOutcome : uint8_t {
  kFits,       // planned; every rank's peak within the limit
  kOverLimit,  // some rank's peak (or lower bound, unsimulated) over the limit
  kNotPlanned  // the planner refused the candidate (SearchRow::error)
};

// One candidate and what its plan says.
struct SearchRow {
  std::vector<int64_t> choice;  // one value per search dimension
  SearchOutcome outcome = SearchOutcome::kNotPlanned;
  // Simulated: the plan's peak. Not simulated (Note [Search dimensions]): a lower bound on it,
  // the rank's weights, gradients and optimizer state and one micro-batch's activations.
  bool simulated = false;
  int64_t peak_bytes = 0;
  int32_t peak_rank = 0;     // the pipeline rank of peak_bytes (the highest)
  int64_t static_bytes = 0;  // of that rank: weights, gradients, optimizer state, bf16 copy
  int64_t activation_peak_bytes = 0;
  double tokens_per_s = 0;  // planned_tokens_per_s (simulated only)
  double full_step_s = 0;
  double bubble_fraction = 0;
  std::string error;  // kNotPlanned
};

// A value that is not possible: a dimension's value with the choices before it, and why.
struct SearchReject {
  int dimension = 0;
  std::vector<int64_t> prefix;  // the earlier dimensions' values, then this one's
  std::string why;
};

struct SearchResult {
  std::vector<SearchRow> fits;        // by tokens/s, highest first; then by peak
  std::vector<SearchRow> over_limit;  // in the order of the search
  std::vector<SearchRow> not_planned;
  // The values of layout dimensions no layout takes, and of the other dimensions in the layouts
  // left with no candidate (every micro-batch size of a DP that divides no global batch).
  std::vector<SearchReject> rejects;
  int64_t candidates = 0;  // planned or bounded
  int64_t simulated = 0;
};

// Every candidate of `space` for the model and costs of `base` (its schedule and shape are
// replaced), planned. Throws tandem::Error when the space holds no candidate at all, naming why
// each layout dimension's values were not possible.
SearchResult search_layouts(const PlanRequest& base, const SearchSpace& space);

// The candidate as the search plans it: `base` with every dimension's value of `choice` applied,
// then space.complete.
PlanRequest search_request(const PlanRequest& base, const SearchSpace& space,
                           const std::vector<int64_t>& choice);

// "PP 2 DP 4 EP 4": the layout dimensions' columns and values of `choice` (or of its first
// values).
std::string layout_label(const std::vector<int64_t>& choice);
// The same for every dimension: "PP 2 DP 4 EP 4 mbs 1 M 8 schedule 1f1b V 1 ...".
std::string choice_label(const std::vector<int64_t>& choice);

}  // namespace tandem::schedule
