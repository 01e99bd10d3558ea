// The layout search (src/planner/search.h). Oracle: a brute force written here from the layout
// rules of comm::ParallelLayout (PP divides the ranks, EP divides DP = ranks / PP and the experts,
// the global batch is M x mbs x DP), which asks make_plan for every schedule, stage count,
// paired-forwards and recompute choice and keeps what it plans within the limit: the search must
// list exactly those, with the same peaks and tokens/s, best first, whatever its pruning and
// threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "core/error.h"
#include "planner/planner.h"
#include "planner/search.h"

namespace tandem::schedule {
namespace {

constexpr int64_t kWorld = 8;
constexpr int64_t kGlobalBatch = 16;

// 4 layers of 8 wide experts (top 2): the experts' weights dominate, so a rank's memory falls
// with PP and EP and the one-rank layout (PP 1 EP 1) holds the most; with 512 tokens a sample
// the activations of the micro-batches in flight are a good part of a rank's peak too.
PlanRequest base_request() {
  PlanRequest req;
  req.inputs.model = {.vocab_size = 256,
                      .hidden_size = 64,
                      .num_layers = 4,
                      .num_attention_heads = 4,
                      .num_query_groups = 2,
                      .ffn_hidden_size = 512,
                      .num_experts = 8,
                      .moe_router_topk = 2,
                      .seq_length = 512};
  return req;
}

// A candidate by its settings: PP, DP, EP, mbs, M, schedule, V, paired forwards, recompute,
// the distributed optimizer, the offloaded node kinds.
using Key = std::tuple<int32_t, int64_t, int64_t, int64_t, int32_t, std::string, int32_t, bool,
                       bool, bool, uint32_t>;
Key key_of(const PlanRequest& r) {
  return {
      r.shape.pipeline_size,          r.inputs.data_parallel_size, r.inputs.expert_parallel_size,
      r.inputs.micro_batch_size,      r.shape.num_microbatches,    r.schedule_name,
      r.shape.virtual_stages,         r.shape.pair_first_forwards, r.inputs.recompute_experts,
      r.inputs.distributed_optimizer, r.inputs.offload_kinds};
}

struct Planned {
  int64_t peak = 0;
  double tokens_per_s = 0;
};

int64_t highest_peak(const Plan& p) {
  int64_t peak = 0;
  for (const RankResult& r : p.sim.ranks) peak = std::max(peak, r.peak_bytes);
  return peak;
}

// Every candidate make_plan accepts on kWorld ranks, with its plan's peak and tokens/s.
std::map<Key, Planned> brute_force(const PlanRequest& base) {
  std::map<Key, Planned> out;
  const ModelConfig& m = base.inputs.model;
  for (int32_t pp = 1; pp <= kWorld; ++pp) {
    if (kWorld % pp != 0) continue;
    const int64_t dp = kWorld / pp;
    for (int64_t ep = 1; ep <= dp; ++ep) {
      if (dp % ep != 0 || m.num_experts % ep != 0) continue;
      for (int64_t mbs : {1, 2, 4}) {
        if (kGlobalBatch % (mbs * dp) != 0) continue;
        const auto mb = static_cast<int32_t>(kGlobalBatch / (mbs * dp));
        for (int k = 0; k < kNumScheduleKinds; ++k) {
          for (int32_t v = 1; v <= 4; ++v) {
            for (bool pair : {false, true}) {
              for (int split : {0, 1}) {
                for (bool recompute : {false, true}) {
                  for (const char* offload : {"", "attention,experts,combine"}) {
                    if (split == 1 && dp == 1) continue;  // nothing to split
                    PlanRequest r = base;
                    r.inputs.offload_kinds = parse_offload_kinds(offload, m);
                    r.inputs.distributed_optimizer = split == 1;
                    r.schedule_name = std::string(schedule_kind_name(static_cast<ScheduleKind>(k)));
                    r.shape = {pp, v, mb, pair};
                    r.inputs.data_parallel_size = dp;
                    r.inputs.expert_parallel_size = ep;
                    r.inputs.micro_batch_size = mbs;
                    r.inputs.recompute_experts = recompute;
                    try {
                      const Plan p = make_plan(r);
                      out[key_of(r)] = {highest_peak(p), planned_tokens_per_s(p).value_or(0)};
                    } catch (const Error&) {
                      // not a schedule of this shape, or layers that do not split: no candidate
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

SearchSpace space_with(int64_t limit) {
  SearchSpace s;
  s.world_size = kWorld;
  s.global_batch_size = kGlobalBatch;
  s.memory_limit = limit;
  return s;
}

bool is_one_rank_layout(const Key& k) { return std::get<0>(k) == 1 && std::get<2>(k) == 1; }

// The search under `limit` against the brute force's candidates within it.
void expect_search_finds(const PlanRequest& base, const std::map<Key, Planned>& all,
                         int64_t limit) {
  SCOPED_TRACE("limit " + std::to_string(limit));
  std::map<Key, Planned> expected;
  for (const auto& [k, p] : all)
    if (p.peak <= limit) expected[k] = p;
  ASSERT_GT(expected.size(), 10u);
  ASSERT_LT(expected.size(), all.size());
  const SearchSpace space = space_with(limit);
  const SearchResult res = search_layouts(base, space);
  std::map<Key, Planned> listed;
  double previous = 1e300;
  for (const SearchRow& row : res.fits) {
    const PlanRequest r = search_request(base, space, row.choice);
    EXPECT_EQ(r.shape.pipeline_size * r.inputs.data_parallel_size, kWorld);
    EXPECT_EQ(r.inputs.data_parallel_size % r.inputs.expert_parallel_size, 0);
    EXPECT_EQ(r.shape.num_microbatches * r.inputs.micro_batch_size * r.inputs.data_parallel_size,
              kGlobalBatch);
    EXPECT_LE(row.peak_bytes, limit);
    EXPECT_LE(row.tokens_per_s, previous);
    previous = row.tokens_per_s;
    listed[key_of(r)] = {row.peak_bytes, row.tokens_per_s};
  }
  EXPECT_EQ(listed.size(), expected.size());
  for (const auto& [k, p] : expected) {
    const auto it = listed.find(k);
    ASSERT_NE(it, listed.end()) << "missing: PP " << std::get<0>(k) << " EP " << std::get<2>(k)
                                << " mbs " << std::get<3>(k) << " " << std::get<5>(k) << " V "
                                << std::get<6>(k) << " recompute " << std::get<8>(k);
    EXPECT_EQ(it->second.peak, p.peak);
    EXPECT_DOUBLE_EQ(it->second.tokens_per_s, p.tokens_per_s);
  }
  EXPECT_TRUE(res.not_planned.empty());
}

// Under limits between the candidates' peaks, where the lower bound prunes and where only the
// simulation decides, the search lists exactly the brute force's candidates within the limit.
// See Note [Search dimensions] (src/planner/search.cc).
TEST(LayoutSearch, ListsExactlyTheCandidatesThatFitBestFirst) {
  const PlanRequest base = base_request();
  const std::map<Key, Planned> all = brute_force(base);
  std::vector<int64_t> peaks;
  for (const auto& [k, p] : all) peaks.push_back(p.peak);
  std::sort(peaks.begin(), peaks.end());
  for (double q : {0.1, 0.3, 0.5, 0.7}) {
    expect_search_finds(base, all,
                        peaks[static_cast<size_t>(q * static_cast<double>(peaks.size()))]);
  }
}

// Just below the lowest peak of PP 1 EP 1, that layout is over the limit in every variant and
// listed nowhere; some candidates were not simulated at all.
TEST(LayoutSearch, ALayoutThatDoesNotFitIsOverTheLimit) {
  const PlanRequest base = base_request();
  int64_t one_rank = INT64_MAX;
  for (const auto& [k, p] : brute_force(base))
    if (is_one_rank_layout(k)) one_rank = std::min(one_rank, p.peak);
  ASSERT_LT(one_rank, INT64_MAX);
  const SearchSpace space = space_with(one_rank - 1);
  const SearchResult res = search_layouts(base, space);
  EXPECT_LT(res.simulated, res.candidates);
  ASSERT_FALSE(res.fits.empty());
  for (const SearchRow& row : res.fits)
    EXPECT_FALSE(is_one_rank_layout(key_of(search_request(base, space, row.choice))));
  int one_rank_rows = 0;
  for (const SearchRow& row : res.over_limit) {
    if (!is_one_rank_layout(key_of(search_request(base, space, row.choice)))) continue;
    ++one_rank_rows;
    EXPECT_GT(row.peak_bytes, space.memory_limit);
    EXPECT_EQ(layout_label(row.choice), "PP 1 DP 8 EP 1");
  }
  EXPECT_GT(one_rank_rows, 0);
}

TEST(LayoutSearch, SameRowsOnOneThreadAndOnSeveral) {
  const PlanRequest base = base_request();
  SearchSpace one = space_with(int64_t{1} << 40), several = one;
  one.threads = 1;
  several.threads = 3;
  const SearchResult a = search_layouts(base, one), b = search_layouts(base, several);
  ASSERT_EQ(a.fits.size(), b.fits.size());
  for (size_t i = 0; i < a.fits.size(); ++i) {
    EXPECT_EQ(a.fits[i].choice, b.fits[i].choice);
    EXPECT_EQ(a.fits[i].peak_bytes, b.fits[i].peak_bytes);
  }
}

TEST(LayoutSearch, AFixedValueIsTheOnlyOne) {
  const PlanRequest base = base_request();
  SearchSpace space = space_with(int64_t{1} << 40);
  space.fixed["pipeline-model-parallel-size"] = 2;
  space.fixed["schedule"] = static_cast<int64_t>(ScheduleKind::kZbH1);
  const SearchResult res = search_layouts(base, space);
  ASSERT_FALSE(res.fits.empty());
  for (const SearchRow& row : res.fits) {
    const PlanRequest r = search_request(base, space, row.choice);
    EXPECT_EQ(r.shape.pipeline_size, 2);
    EXPECT_EQ(r.schedule_name, "zb-h1");
  }
}

TEST(LayoutSearch, NamesTheValuesNoLayoutTakes) {
  const PlanRequest base = base_request();
  SearchSpace space = space_with(int64_t{1} << 40);
  space.world_size = 16;
  const SearchResult res = search_layouts(base, space);
  bool ep16 = false, pp8 = false;
  const int ep = search_dimension_index("expert-model-parallel-size");
  const int pp = search_dimension_index("pipeline-model-parallel-size");
  for (const SearchReject& r : res.rejects) {
    if (r.dimension == ep && r.prefix.back() == 16) {
      ep16 = true;
      EXPECT_EQ(r.why, "not a divisor of the 8 experts");
    }
    if (r.dimension == pp && r.prefix.back() == 8) {
      pp8 = true;
      EXPECT_EQ(r.why,
                "the 4 layers do not split into that many stages, evenly or with a shorter last "
                "stage");
    }
  }
  EXPECT_TRUE(ep16);
  EXPECT_TRUE(pp8);
  for (const SearchRow& row : res.fits) {
    const PlanRequest r = search_request(base, space, row.choice);
    EXPECT_EQ(r.shape.pipeline_size * r.inputs.data_parallel_size, 16);
  }
}

// Note [Searched last stage]: 7 layers on 8 ranks. Without the user's counts every stage count
// the layers do not divide gets the most even shorter last stage (2 stages: 4 and 3; 4 stages: 2,
// 2, 2 and 1), 8 stages none (named why); every row's split is one the trainer takes. A last
// stage count the user gives is every row's.
TEST(LayoutSearch, GivesAShorterLastStageWhereTheLayersDoNotDivide) {
  PlanRequest base = base_request();
  base.inputs.model.num_layers = 7;
  SearchSpace space = space_with(int64_t{1} << 40);
  const int pp = search_dimension_index("pipeline-model-parallel-size");
  const int last = search_dimension_index("decoder-last-pipeline-num-layers");
  ASSERT_GE(last, 0);
  const SearchResult res = search_layouts(base, space);
  std::map<int64_t, int64_t> last_by_stages;
  for (const SearchRow& row : res.fits) {
    const PlanRequest r = search_request(base, space, row.choice);
    const int64_t stages = int64_t{r.shape.pipeline_size} * r.shape.virtual_stages;
    EXPECT_NO_THROW((void)stage_layer_counts(7, stages, 0, r.inputs.last_stage_layers));
    EXPECT_EQ(row.choice[static_cast<size_t>(last)], r.inputs.last_stage_layers);
    last_by_stages[stages] = r.inputs.last_stage_layers;
  }
  EXPECT_EQ(last_by_stages.at(1), 0);  // one stage: all 7
  EXPECT_EQ(last_by_stages.at(2), 3);
  EXPECT_EQ(last_by_stages.at(4), 1);
  EXPECT_EQ(last_by_stages.count(8), 0u);
  bool pp8 = false;
  for (const SearchReject& r : res.rejects) {
    if (r.dimension != pp || r.prefix.back() != 8) continue;
    pp8 = true;
    EXPECT_EQ(r.why,
              "the 7 layers do not split into that many stages, evenly or with a shorter last "
              "stage");
  }
  EXPECT_TRUE(pp8);

  base.inputs.last_stage_layers = 1;
  space.fixed["decoder-last-pipeline-num-layers"] = 1;
  const SearchResult given = search_layouts(base, space);
  ASSERT_FALSE(given.fits.empty());
  for (const SearchRow& row : given.fits) {
    const PlanRequest r = search_request(base, space, row.choice);
    EXPECT_EQ(r.inputs.last_stage_layers, 1);
    EXPECT_NO_THROW(
        (void)stage_layer_counts(7, int64_t{r.shape.pipeline_size} * r.shape.virtual_stages, 0, 1));
  }
}

// A layout whose every variant is not possible (DP 8 divides no global batch of 12) is named
// with why; a value not possible in a layout that has candidates is not.
TEST(LayoutSearch, NamesTheLayoutsLeftWithoutACandidate) {
  const PlanRequest base = base_request();
  SearchSpace space = space_with(int64_t{1} << 40);
  space.global_batch_size = 12;
  const SearchResult res = search_layouts(base, space);
  const int mbs = search_dimension_index("micro-batch-size");
  int dp8 = 0;
  for (const SearchReject& r : res.rejects) {
    if (r.dimension != mbs) continue;
    // Not PP 2 DP 4's mbs 2 and 4: that layout runs mbs 1.
    EXPECT_EQ(layout_label(r.prefix).substr(0, 13), "PP 1 DP 8 EP ") << r.why;
    EXPECT_EQ(r.why, "mbs x DP 8 does not divide the global batch of 12");
    ++dp8;
  }
  EXPECT_EQ(dp8, 12);  // mbs 1, 2, 4 under EP 1, 2, 4, 8
  for (const SearchRow& row : res.fits) EXPECT_NE(layout_label(row.choice).substr(0, 5), "PP 1 ");
}

TEST(LayoutSearch, RefusesASpaceWithNoCandidate) {
  const PlanRequest base = base_request();
  SearchSpace space = space_with(int64_t{1} << 40);
  space.world_size = 3;  // PP 1 (3 does not divide 4 layers), DP 3 divides no batch of 16
  try {
    search_layouts(base, space);
    FAIL() << "a search of 3 ranks found candidates";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no layout of 3 ranks and a global batch of 16"), std::string::npos)
        << what;
    EXPECT_NE(what.find("does not divide the global batch of 16"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace tandem::schedule
