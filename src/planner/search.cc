// The layout search (search.h): the dimensions, the enumeration of candidates and their plans,
// on as many threads as the machine has.
#include "planner/search.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"

namespace tandem::schedule {

// Note [Search dimensions]
// The search space is a list of dimensions (search_dimensions()), each one choice of the run:
// PP, DP, EP, the micro-batch size, the micro-batches, the schedule, its stages per rank, the
// last stage's layers (Note [Searched last stage]), the paired first forwards, recomputation. They
// are chosen in that order; each dimension offers values given the earlier choices (DP is world /
// PP; EP a divisor of DP) and says why a value is not possible there (EP must divide the experts,
// PP x V the layers). A value the user fixed (the option given on the command line) is the
// dimension's only value. Every path through the list is a candidate. Adding a choice to the search
// (another optimizer layout, activation offload) is one entry in the list: its values, the check,
// how it sets the PlanRequest and reads it back (a value the user gave), its label; the lower bound
// below reads the pipeline model's static bytes, so a choice that changes them prunes as the others
// do.
//
// Each candidate is planned as `tandem plan` would plan it, in two steps, so that the search
// stays cheap on hundreds of ranks:
//   1. The pipeline model alone (no simulation) gives each rank's weights, gradients and
//      optimizer state, and each of its stages' activations of one micro-batch. Every schedule
//      runs one micro-batch's forward of a stage to its end before that stage's first backward,
//      so the two together are a lower bound on the rank's peak. A candidate whose bound is over
//      the limit is over it, unsimulated (SearchRow::simulated false; its peak is the bound).
//   2. The rest are simulated: the peak and tokens/s of the plan.
// Candidates are independent, so they are planned on several threads; the result's order does
// not depend on them.

namespace {

int64_t num_layers(const PlanRequest& r) { return r.inputs.model.num_layers; }

std::string on_off(int64_t v) { return v != 0 ? "on" : "off"; }
std::string number(int64_t v) { return std::to_string(v); }

// The divisors of n, ascending: each pair (d, n / d) found by d up to sqrt(n).
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

using Values = std::vector<int64_t>;

// check_supported's message for the request's schedule and shape, or "".
std::string unsupported(const PlanRequest& r, const ScheduleShape& shape) {
  try {
    check_supported(parse_schedule_kind(r.schedule_name), shape);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Whether `layers` split into `stages` stages with these first and last stage counts
// (Note [Uneven stages] in core/config.h: 0 is "as the rest").
bool splits(int64_t layers, int64_t stages, int64_t first, int64_t last) {
  try {
    (void)stage_layer_counts(layers, stages, first, last);
  } catch (const Error&) {
    return false;
  }
  return true;
}

constexpr const char* kLastStageOption = "decoder-last-pipeline-num-layers";

// Note [Searched last stage]: where the user gives neither the first nor the last stage's layer
// count, the search gives stage counts the layers do not divide a shorter last stage, as
// Megatron-LM's --decoder-last-pipeline-num-layers does (DeepSeek-V3's 61 layers on 8 stages: 8
// each and 5 last). The one count searched is the most even: every other stage holds
// ceil(layers / stages) and the last the rest, when that leaves it at least one layer; 0 where
// the layers divide evenly.
bool last_stage_searched(const SearchSpace& s, const PlanRequest& r) {
  return s.fixed.count(kLastStageOption) == 0 && r.inputs.first_stage_layers == 0;
}

// The searched last stage's layers for `stages` stages (0: even), or -1 when there is none.
int64_t searched_last_stage(int64_t layers, int64_t stages) {
  if (stages <= 1 || layers % stages == 0) return 0;
  const int64_t each = (layers + stages - 1) / stages, last = layers - (stages - 1) * each;
  return last >= 1 ? last : -1;
}

// Whether the request's layers split into `stages` stages: as its first and last stage counts
// ask, or, where the search chooses the last stage's, with the count it would choose.
bool layers_split(const SearchSpace& s, const PlanRequest& r, int64_t stages) {
  const int64_t last = last_stage_searched(s, r) ? searched_last_stage(num_layers(r), stages)
                                                 : r.inputs.last_stage_layers;
  return last >= 0 && splits(num_layers(r), stages, r.inputs.first_stage_layers, last);
}

// Why the request's layers do not split into `what` ("that many stages"): how they were asked to.
std::string no_split(const SearchSpace& s, const PlanRequest& r, const char* what) {
  if (last_stage_searched(s, r)) {
    return detail::concat("the ", num_layers(r), " layers do not split into ", what,
                          ", evenly or with a shorter last stage");
  }
  return detail::concat("the ", num_layers(r), " layers do not split ",
                        r.inputs.first_stage_layers || r.inputs.last_stage_layers
                            ? "as the first and last stage counts ask"
                            : "evenly",
                        " into ", what);
}

SearchDimension pipeline_dimension() {
  return {
      .option = "pipeline-model-parallel-size",
      .column = "PP",
      .layout = true,
      .values = [](const SearchSpace& s, const PlanRequest&) { return divisors(s.world_size); },
      .check = [](const SearchSpace& s, const PlanRequest& r, int64_t pp) -> std::string {
        if (pp < 1 || s.world_size % pp != 0)
          return detail::concat("not a divisor of the ", s.world_size, " ranks");
        if (!layers_split(s, r, pp)) return no_split(s, r, "that many stages");
        return "";
      },
      .apply = [](PlanRequest& r, int64_t pp) { r.shape.pipeline_size = static_cast<int32_t>(pp); },
      .read = [](const PlanRequest& r) -> int64_t { return r.shape.pipeline_size; },
      .label = number,
  };
}

// comm::ParallelLayout: the ranks of a stage are the dense part's data-parallel ranks.
SearchDimension data_parallel_dimension() {
  return {
      .option = "data-parallel-size",
      .column = "DP",
      .layout = true,
      .values = [](const SearchSpace& s,
                   const PlanRequest& r) { return Values{s.world_size / r.shape.pipeline_size}; },
      .check = [](const SearchSpace& s, const PlanRequest& r, int64_t dp) -> std::string {
        if (dp * r.shape.pipeline_size != s.world_size)
          return detail::concat("DP x PP ", r.shape.pipeline_size, " is not the ", s.world_size,
                                " ranks");
        return "";
      },
      .apply = [](PlanRequest& r, int64_t dp) { r.inputs.data_parallel_size = dp; },
      .read = [](const PlanRequest& r) { return resolved_data_parallel_size(r.inputs); },
      .label = number,
  };
}

// comm::ParallelLayout: expert parallelism is carved out of data parallelism.
SearchDimension expert_dimension() {
  return {
      .option = "expert-model-parallel-size",
      .column = "EP",
      .layout = true,
      .values = [](const SearchSpace&,
                   const PlanRequest& r) { return divisors(r.inputs.data_parallel_size); },
      .check = [](const SearchSpace&, const PlanRequest& r, int64_t ep) -> std::string {
        const ModelConfig& m = r.inputs.model;
        if (ep < 1 || r.inputs.data_parallel_size % ep != 0)
          return "not a divisor of DP (the expert ranks are data-parallel ranks)";
        if (!m.is_moe() && ep > 1) return "the model is dense";
        if (m.is_moe() && m.num_experts % ep != 0)
          return detail::concat("not a divisor of the ", m.num_experts, " experts");
        return "";
      },
      .apply = [](PlanRequest& r, int64_t ep) { r.inputs.expert_parallel_size = ep; },
      .read = [](const PlanRequest& r) { return r.inputs.expert_parallel_size; },
      .label = number,
  };
}

SearchDimension micro_batch_dimension() {
  return {
      .option = "micro-batch-size",
      .column = "mbs",
      .values =
          [](const SearchSpace&, const PlanRequest&) {
            return Values{1, 2, 4};
          },
      .check = [](const SearchSpace& s, const PlanRequest& r, int64_t mbs) -> std::string {
        if (mbs < 1 || s.global_batch_size % (mbs * r.inputs.data_parallel_size) != 0)
          return detail::concat("mbs x DP ", r.inputs.data_parallel_size,
                                " does not divide the global batch of ", s.global_batch_size);
        return "";
      },
      .apply = [](PlanRequest& r, int64_t mbs) { r.inputs.micro_batch_size = mbs; },
      .read = [](const PlanRequest& r) { return r.inputs.micro_batch_size; },
      .label = number,
  };
}

// Micro-batches a data-parallel rank runs per step: the global batch over mbs x DP.
SearchDimension microbatches_dimension() {
  return {
      .option = "num-microbatches",
      .column = "M",
      .values =
          [](const SearchSpace& s, const PlanRequest& r) {
            return Values{s.global_batch_size /
                          (r.inputs.micro_batch_size * r.inputs.data_parallel_size)};
          },
      .check = [](const SearchSpace& s, const PlanRequest& r, int64_t m) -> std::string {
        if (m * r.inputs.micro_batch_size * r.inputs.data_parallel_size != s.global_batch_size)
          return detail::concat("M x mbs x DP is not the global batch of ", s.global_batch_size);
        return "";
      },
      .apply = [](PlanRequest& r,
                  int64_t m) { r.shape.num_microbatches = static_cast<int32_t>(m); },
      .read = [](const PlanRequest& r) -> int64_t { return r.shape.num_microbatches; },
      .label = number,
  };
}

SearchDimension schedule_dimension() {
  return {
      .option = "schedule",
      .column = "schedule",
      .values =
          [](const SearchSpace&, const PlanRequest&) {
            Values out;
            for (int k = 0; k < kNumScheduleKinds; ++k) out.push_back(k);
            return out;
          },
      .check = [](const SearchSpace&, const PlanRequest&, int64_t k) -> std::string {
        if (k < 0 || k >= kNumScheduleKinds) return "no schedule";
        return "";
      },
      .apply =
          [](PlanRequest& r, int64_t k) {
            r.schedule_name = std::string(schedule_kind_name(static_cast<ScheduleKind>(k)));
          },
      .read = [](const PlanRequest& r) -> int64_t {
        return static_cast<int64_t>(parse_schedule_kind(r.schedule_name));
      },
      .label =
          [](int64_t k) { return std::string(schedule_kind_name(static_cast<ScheduleKind>(k))); },
  };
}

SearchDimension virtual_stages_dimension() {
  return {
      .option = "virtual-pipeline-model-parallel-size",
      .column = "V",
      .values =
          [](const SearchSpace&, const PlanRequest&) {
            return Values{1, 2, 3, 4};
          },
      .check = [](const SearchSpace& s, const PlanRequest& r, int64_t v) -> std::string {
        if (v < 1 || !layers_split(s, r, r.shape.pipeline_size * v))
          return no_split(s, r, "PP x V stages");
        ScheduleShape shape = r.shape;
        shape.virtual_stages = static_cast<int32_t>(v);
        return unsupported(r, shape);
      },
      .apply = [](PlanRequest& r, int64_t v) { r.shape.virtual_stages = static_cast<int32_t>(v); },
      .read = [](const PlanRequest& r) -> int64_t { return r.shape.virtual_stages; },
      .label = number,
  };
}

// Note [Searched last stage]: the last stage's layers for the PP x V stages chosen; a count the
// user gives is its one value, and with a first stage count given it stays as given.
SearchDimension last_stage_dimension() {
  return {
      .option = kLastStageOption,
      .column = "last",
      .values =
          [](const SearchSpace& s, const PlanRequest& r) {
            if (!last_stage_searched(s, r)) return Values{r.inputs.last_stage_layers};
            return Values{searched_last_stage(
                num_layers(r), int64_t{r.shape.pipeline_size} * r.shape.virtual_stages)};
          },
      .check = [](const SearchSpace&, const PlanRequest& r, int64_t last) -> std::string {
        const int64_t stages = int64_t{r.shape.pipeline_size} * r.shape.virtual_stages;
        if (last < 0 || !splits(num_layers(r), stages, r.inputs.first_stage_layers, last))
          return detail::concat("the ", num_layers(r), " layers do not split into ", stages,
                                " stages with a last stage of ", last);
        return "";
      },
      .apply = [](PlanRequest& r, int64_t last) { r.inputs.last_stage_layers = last; },
      .read = [](const PlanRequest& r) -> int64_t { return r.inputs.last_stage_layers; },
      .label = [](int64_t last) { return last == 0 ? std::string("-") : number(last); },
  };
}

// Note [Paired forwards] in action.h: combined-1f1b on one stage only.
SearchDimension paired_forwards_dimension() {
  return {
      .option = "pair-first-forwards",
      .column = "pair",
      .values =
          [](const SearchSpace&, const PlanRequest&) {
            return Values{0, 1};
          },
      .check = [](const SearchSpace&, const PlanRequest& r, int64_t v) -> std::string {
        ScheduleShape shape = r.shape;
        shape.pair_first_forwards = v != 0;
        return unsupported(r, shape);
      },
      .apply = [](PlanRequest& r, int64_t v) { r.shape.pair_first_forwards = v != 0; },
      .read = [](const PlanRequest& r) -> int64_t { return r.shape.pair_first_forwards ? 1 : 0; },
      .label = on_off,
  };
}

SearchDimension recompute_dimension() {
  return {
      .option = "recompute-experts",
      .column = "recompute",
      .values =
          [](const SearchSpace&, const PlanRequest& r) {
            return r.inputs.model.is_moe() ? Values{0, 1} : Values{0};
          },
      .check = [](const SearchSpace&, const PlanRequest& r, int64_t v) -> std::string {
        if (v != 0 && !r.inputs.model.is_moe()) return "the model has no experts";
        return "";
      },
      .apply = [](PlanRequest& r, int64_t v) { r.inputs.recompute_experts = v != 0; },
      .read = [](const PlanRequest& r) -> int64_t { return r.inputs.recompute_experts ? 1 : 0; },
      .label = on_off,
  };
}

// --use-distributed-optimizer: the Adam moments split over the ranks that replicate each weight;
// nothing to split without data parallelism.
SearchDimension distributed_optimizer_dimension() {
  return {
      .option = "use-distributed-optimizer",
      .column = "dist-opt",
      .values =
          [](const SearchSpace&, const PlanRequest& r) {
            return resolved_data_parallel_size(r.inputs) > 1 ? Values{0, 1} : Values{0};
          },
      .check = [](const SearchSpace&, const PlanRequest&, int64_t) -> std::string { return ""; },
      .apply = [](PlanRequest& r, int64_t v) { r.inputs.distributed_optimizer = v != 0; },
      .read = [](const PlanRequest& r) -> int64_t {
        return r.inputs.distributed_optimizer ? 1 : 0;
      },
      .label = on_off,
  };
}

// --offload-activations: off, or every node kind the model has whose saved tensors can wait in
// host memory (Note [Offload in the plan] in simulator_state.cc); a list the user gives is its
// one value.
uint32_t all_offload_kinds(const ModelConfig& m) {
  uint32_t kinds = 0;
  for (const OffloadKind& k : offload_kinds()) {
    if (offload_kind_absent(k.kind, m) == nullptr) kinds |= 1u << static_cast<unsigned>(k.kind);
  }
  return kinds;
}

std::string offload_label(int64_t v) {
  std::string out;
  for (const OffloadKind& k : offload_kinds()) {
    if (offloads(static_cast<uint32_t>(v), k.kind))
      out += (out.empty() ? "" : ",") + std::string(k.name);
  }
  return out.empty() ? "off" : out;
}

SearchDimension offload_dimension() {
  return {
      .option = "offload-activations",
      .column = "offload",
      .values =
          [](const SearchSpace&, const PlanRequest& r) {
            return Values{0, static_cast<int64_t>(all_offload_kinds(r.inputs.model))};
          },
      .check = [](const SearchSpace&, const PlanRequest&, int64_t) -> std::string { return ""; },
      .apply = [](PlanRequest& r, int64_t v) { r.inputs.offload_kinds = static_cast<uint32_t>(v); },
      .read = [](const PlanRequest& r) -> int64_t { return r.inputs.offload_kinds; },
      .label = offload_label,
  };
}

struct Enumeration {
  std::vector<std::vector<int64_t>> candidates;
  std::vector<SearchReject> rejects;
};

void enumerate(const SearchSpace& space, size_t dim, const PlanRequest& req,
               std::vector<int64_t>& choice, Enumeration& out) {
  const std::vector<SearchDimension>& dims = search_dimensions();
  if (dim == dims.size()) {
    out.candidates.push_back(choice);
    return;
  }
  const SearchDimension& d = dims[dim];
  const auto fixed = space.fixed.find(d.option);
  const Values values = fixed != space.fixed.end() ? Values{fixed->second} : d.values(space, req);
  for (const int64_t v : values) {
    choice.push_back(v);
    const std::string why = d.check(space, req, v);
    if (!why.empty()) {
      out.rejects.push_back({static_cast<int>(dim), choice, why});
    } else {
      PlanRequest next = req;
      d.apply(next, v);
      enumerate(space, dim + 1, next, choice, out);
    }
    choice.pop_back();
  }
}

// Step 1 of Note [Search dimensions]: each rank's static bytes and one micro-batch of its
// smallest stage; the highest rank's sum.
void bound_peak(const PipelineModel& pm, SearchRow& row) {
  row.peak_bytes = -1;
  for (size_t r = 0; r < pm.ranks.size(); ++r) {
    int64_t act = -1;
    for (const Stage& st : pm.stages) {
      // Offloaded nodes' bytes may all be in host memory then (Note [Offload in the plan]).
      int64_t held = st.activation_bytes;
      for (const StageNode& n : st.nodes) held -= n.offloaded ? n.saved_bytes : 0;
      if (st.rank == static_cast<int32_t>(r) && (act < 0 || held < act)) act = held;
    }
    const int64_t bound = pm.ranks[r].static_bytes() + std::max<int64_t>(act, 0);
    if (bound > row.peak_bytes) {
      row.peak_bytes = bound;
      row.peak_rank = static_cast<int32_t>(r);
      row.static_bytes = pm.ranks[r].static_bytes();
    }
  }
}

SearchRow plan_candidate(const PlanRequest& base, const SearchSpace& space,
                         const std::vector<int64_t>& choice) {
  SearchRow row;
  row.choice = choice;
  Plan plan;
  try {
    const PlanRequest req = search_request(base, space, choice);
    plan.schedule = plan_schedule(req);
    plan.inputs = req.inputs;
    plan.model = build_pipeline_model(plan.schedule, req.inputs);
  } catch (const Error& e) {
    row.error = e.what();
    return row;
  }
  bound_peak(plan.model, row);
  if (row.peak_bytes > space.memory_limit) {
    row.outcome = SearchOutcome::kOverLimit;
    return row;
  }
  plan.sim = simulate(plan.schedule, plan.model);
  row.simulated = true;
  row.peak_bytes = -1;
  for (const RankResult& r : plan.sim.ranks) {
    if (r.peak_bytes > row.peak_bytes) {
      row.peak_bytes = r.peak_bytes;
      row.peak_rank = r.rank;
      row.static_bytes = r.static_memory.static_bytes();
      row.activation_peak_bytes = r.activation_peak_bytes;
    }
  }
  row.tokens_per_s = planned_tokens_per_s(plan).value_or(0.0);
  row.full_step_s = plan.sim.full_step_s;
  row.bubble_fraction = plan.sim.bubble_fraction;
  row.outcome =
      row.peak_bytes <= space.memory_limit ? SearchOutcome::kFits : SearchOutcome::kOverLimit;
  return row;
}

// Plans every candidate on `threads` threads; rows[i] is candidates[i]'s.
std::vector<SearchRow> plan_all(const PlanRequest& base, const SearchSpace& space,
                                const std::vector<std::vector<int64_t>>& candidates) {
  const auto n = static_cast<int64_t>(candidates.size());
  std::vector<SearchRow> rows(candidates.size());
  std::atomic<int64_t> next{0};
  int64_t done = 0;
  std::mutex mu;
  std::exception_ptr failure;
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) {
      try {
        rows[static_cast<size_t>(i)] = plan_candidate(base, space, candidates[i]);
      } catch (...) {  // an internal error: stop every thread, rethrow on the caller's
        const std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        next = n;
      }
      const std::lock_guard<std::mutex> lock(mu);
      ++done;
      if (space.progress) space.progress(done, n);
    }
  };
  const unsigned hw = std::max(1U, std::thread::hardware_concurrency());
  const int64_t threads =
      std::min<int64_t>(n, space.threads > 0 ? space.threads : static_cast<int64_t>(hw));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  return rows;
}

std::string no_candidate_message(const SearchSpace& space, std::vector<SearchReject> rejects) {
  const std::vector<SearchDimension>& dims = search_dimensions();
  auto is_layout = [&](const SearchReject& r) {
    return dims[static_cast<size_t>(r.dimension)].layout;
  };
  std::stable_partition(rejects.begin(), rejects.end(), is_layout);
  std::string why;
  for (size_t i = 0; i < rejects.size(); ++i) {
    if (i == 8) {
      why += detail::concat("; and ", rejects.size() - 8, " more");
      break;
    }
    const SearchReject& r = rejects[i];
    why += detail::concat(why.empty() ? "" : "; ", choice_label(r.prefix), ": ", r.why);
  }
  return detail::concat("no layout of ", space.world_size, " ranks and a global batch of ",
                        space.global_batch_size, " runs this model: ", why);
}

}  // namespace

const std::vector<SearchDimension>& search_dimensions() {
  static const std::vector<SearchDimension> dims = {
      pipeline_dimension(),
      data_parallel_dimension(),
      expert_dimension(),
      micro_batch_dimension(),
      microbatches_dimension(),
      schedule_dimension(),
      virtual_stages_dimension(),
      last_stage_dimension(),
      paired_forwards_dimension(),
      recompute_dimension(),
      distributed_optimizer_dimension(),
      offload_dimension(),
  };
  return dims;
}

int search_dimension_index(const std::string& option) {
  const std::vector<SearchDimension>& dims = search_dimensions();
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i].option == option) return static_cast<int>(i);
  return -1;
}

PlanRequest search_request(const PlanRequest& base, const SearchSpace& space,
                           const std::vector<int64_t>& choice) {
  const std::vector<SearchDimension>& dims = search_dimensions();
  TANDEM_ASSERT(choice.size() == dims.size(), "a search candidate has ", choice.size(),
                " values for ", dims.size(), " dimensions");
  PlanRequest req = base;
  req.schedule_file.clear();
  for (size_t i = 0; i < dims.size(); ++i) dims[i].apply(req, choice[i]);
  if (space.complete) space.complete(req);
  return req;
}

namespace {

std::string label_of(const std::vector<int64_t>& choice, bool layout_only) {
  const std::vector<SearchDimension>& dims = search_dimensions();
  std::string out;
  for (size_t i = 0; i < choice.size() && i < dims.size(); ++i) {
    if (layout_only && !dims[i].layout) continue;
    out += detail::concat(out.empty() ? "" : " ", dims[i].column, " ", dims[i].label(choice[i]));
  }
  return out;
}

}  // namespace

std::string layout_label(const std::vector<int64_t>& choice) { return label_of(choice, true); }
std::string choice_label(const std::vector<int64_t>& choice) { return label_of(choice, false); }

SearchResult search_layouts(const PlanRequest& base, const SearchSpace& space) {
  TANDEM_CHECK(space.world_size >= 1, "the world size ", space.world_size,
               " is invalid: need at least 1 rank");
  TANDEM_CHECK(space.world_size <= kMaxSearchWorldSize, "the world size ", space.world_size,
               " is more ranks than the search lays out: at most ", kMaxSearchWorldSize, " (2^20)");
  Enumeration e;
  std::vector<int64_t> choice;
  enumerate(space, 0, base, choice, e);
  TANDEM_CHECK(!e.candidates.empty(), no_candidate_message(space, e.rejects));
  SearchResult res;
  res.candidates = static_cast<int64_t>(e.candidates.size());
  // A variant's value that is not possible matters only where its layout has no candidate.
  std::set<std::string> with_candidates;
  for (const std::vector<int64_t>& c : e.candidates) with_candidates.insert(layout_label(c));
  for (SearchReject& r : e.rejects) {
    if (search_dimensions()[static_cast<size_t>(r.dimension)].layout ||
        with_candidates.count(layout_label(r.prefix)) == 0)
      res.rejects.push_back(std::move(r));
  }
  for (SearchRow& row : plan_all(base, space, e.candidates)) {
    res.simulated += row.simulated ? 1 : 0;
    switch (row.outcome) {
      case SearchOutcome::kFits:
        res.fits.push_back(std::move(row));
        break;
      case SearchOutcome::kOverLimit:
        res.over_limit.push_back(std::move(row));
        break;
      case SearchOutcome::kNotPlanned:
        res.not_planned.push_back(std::move(row));
        break;
    }
  }
  std::stable_sort(res.fits.begin(), res.fits.end(), [](const SearchRow& a, const SearchRow& b) {
    if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    return a.peak_bytes < b.peak_bytes;
  });
  return res;
}

}  // namespace tandem::schedule
