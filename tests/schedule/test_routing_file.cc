// Routing tables on disk (schedule/routing_file.h): what routing_file_text writes,
// parse_routing_file reads back for any rank, and every malformed file is refused naming the
// file and what is wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "schedule/routing_file.h"

namespace tandem::schedule {
namespace {

RoutingCounts table(int32_t mbs, int32_t layers, int64_t base) {
  RoutingCounts t(mbs, layers);
  for (size_t i = 0; i < t.expert_rows.size(); ++i) t.expert_rows[i] = base + int64_t(i);
  return t;
}

TEST(RoutingFile, RoundTripsEveryRank) {
  const std::vector<RoutingCounts> tables = {table(3, 2, 10), table(3, 2, 100)};
  const std::string text = routing_file_text(tables);
  for (int r = 0; r < 2; ++r) {
    const RoutingCounts back = parse_routing_file(text, "r.json", r);
    EXPECT_EQ(back.num_microbatches, 3);
    EXPECT_EQ(back.num_layers, 2);
    EXPECT_EQ(back.expert_rows, tables[r].expert_rows) << "rank " << r;
  }
}

std::string error_of(const std::string& text, int rank) {
  try {
    parse_routing_file(text, "r.json", rank);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RoutingFile, RefusesMalformedFilesNamingWhatIsWrong) {
  const std::string ok_head = R"({"num_microbatches": 2, "num_layers": 1, "ranks": )";
  const struct {
    std::string text;
    int rank;
    std::vector<std::string> expect;
  } cases[] = {
      {"not json", 0, {"r.json", "not valid JSON"}},
      {R"({"ranks": []})", 0, {"r.json", "expected", "num_microbatches"}},
      {ok_head + R"([{"rank": 0, "expert_rows": [1]}]})", 0, {"rank 0 has 1 counts", "2"}},
      {ok_head + R"([{"rank": 0, "expert_rows": [1, -4]}]})", 0, {"expert_rows[1] is -4"}},
      {ok_head + R"([{"rank": 0, "expert_rows": [1, 2]}]})", 3, {"no table for rank 3", "0"}},
      {ok_head + R"([{"expert_rows": [1, 2]}]})", 0, {"{\"rank\": R"}},
      {R"({"num_microbatches": 0, "num_layers": 1, "ranks": []})", 0, {"at least 1"}},
  };
  for (const auto& c : cases) {
    const std::string err = error_of(c.text, c.rank);
    ASSERT_FALSE(err.empty()) << c.text;
    for (const std::string& e : c.expect) EXPECT_NE(err.find(e), std::string::npos) << err;
  }
}

// Note [Slowest expert rank]: per layer, the sum of the group's largest rows over the sum of
// its mean, unmeasured (-1) entries skipped; balanced routing gives 1.
TEST(RoutingFile, ExpertPacePerLayer) {
  RoutingCounts a(2, 3), b(2, 3);
  // layer 0: mb0 rows 30 / 10, mb1 20 / 24; means 20, 22 (sum 42). a: own 50/42, waits
  // 4/42 (mb1); b: own 34/42, waits 20/42 (mb0). Both: own + wait = (30 + 24) / 42.
  a.at(0, 0) = 30, b.at(0, 0) = 10, a.at(1, 0) = 20, b.at(1, 0) = 24;
  // layer 1: balanced -> own 1, wait 0
  a.at(0, 1) = b.at(0, 1) = 16, a.at(1, 1) = b.at(1, 1) = 16;
  // layer 2: only rank a measured (another stage's layer for b) -> a alone: 1, 0; b: no rows
  a.at(0, 2) = 8, a.at(1, 2) = 12;
  const std::vector<ExpertPace> pa = expert_pace({a, b}, 0), pb = expert_pace({a, b}, 1);
  ASSERT_EQ(pa.size(), 3u);
  ASSERT_EQ(pb.size(), 3u);
  EXPECT_DOUBLE_EQ(pa[0].own, 50.0 / 42);
  EXPECT_DOUBLE_EQ(pa[0].wait, 4.0 / 42);
  EXPECT_DOUBLE_EQ(pb[0].own, 34.0 / 42);
  EXPECT_DOUBLE_EQ(pb[0].wait, 20.0 / 42);
  EXPECT_DOUBLE_EQ(pa[0].own + pa[0].wait, pb[0].own + pb[0].wait);
  EXPECT_DOUBLE_EQ(pa[1].own, 1.0);
  EXPECT_DOUBLE_EQ(pa[1].wait, 0.0);
  EXPECT_DOUBLE_EQ(pa[2].own, 1.0);
  EXPECT_DOUBLE_EQ(pa[2].wait, 0.0);
  EXPECT_DOUBLE_EQ(pb[2].own, 1.0);  // nothing measured: left balanced
  EXPECT_DOUBLE_EQ(pb[2].wait, 0.0);
  EXPECT_TRUE(expert_pace({}, 0).empty());
  // Every table of the file, by rank; a rank listed twice is refused.
  b.at(0, 2) = 8, b.at(1, 2) = 12;  // files hold whole pipelines (no -1)
  const std::string text = routing_file_text({a, b});
  const auto all = parse_routing_tables(text, "r.json");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.at(1).at(0, 0), 10);
  try {
    parse_routing_tables(R"({"num_microbatches": 1, "num_layers": 1, "ranks": [)"
                         R"({"rank": 0, "expert_rows": [1]}, {"rank": 0, "expert_rows": [2]}]})",
                         "r.json");
    ADD_FAILURE() << "a rank listed twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("r.json: rank 0 appears twice"), std::string::npos);
  }
}

// Hand values: two ranks, two micro-batches, two layers and one unmeasured one.
TEST(RoutingFile, RowsSpreadOverTheStepAndPerMicroBatch) {
  RoutingCounts a(2, 3), b(2, 3);
  a.at(0, 0) = 30, b.at(0, 0) = 10;  // 1.5
  a.at(1, 0) = 10, b.at(1, 0) = 30;  // 1.5; the step's layer 0: 40 / 40, even
  a.at(0, 1) = 20, b.at(0, 1) = 20;  // 1
  a.at(1, 1) = 24, b.at(1, 1) = 16;  // 1.2; layer 1 over the step: 44 against 36
  const RowsSpread s = expert_rows_spread({a, b});
  EXPECT_DOUBLE_EQ(s.step, (40.0 + 44.0) / (40.0 + 40.0));
  EXPECT_DOUBLE_EQ(s.microbatch_median, (1.2 + 1.5) / 2);
  EXPECT_DOUBLE_EQ(s.microbatch_max, 1.5);
  const RowsSpread none = expert_rows_spread({RoutingCounts(2, 3)});
  EXPECT_EQ(none.step, -1);
  EXPECT_EQ(none.microbatch_median, -1);
  EXPECT_EQ(expert_rows_spread({}).microbatch_max, -1);
}

}  // namespace
}  // namespace tandem::schedule
