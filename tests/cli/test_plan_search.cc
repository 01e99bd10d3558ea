// `tandem plan --search` run as a program. Oracles: the layout rules themselves (PP x DP is the
// world, EP divides DP, M x mbs x DP the global batch), the order of the rows, the limit, and
// `tandem plan` of the best row's options alone (its peak and whole step must be the row's); bad
// input through the harness of tests/cli/bad_input.h (exit 2, the words, nothing written).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bad_input.h"
#include "tandem_process.h"

namespace tandem::test {
namespace {

// 4 layers of 8 wide experts, 16 samples of 512 tokens a step.
const std::vector<std::string> kModel = {
    "--num-layers",       "4",   "--hidden-size",       "64",  "--num-attention-heads", "4",
    "--num-query-groups", "2",   "--ffn-hidden-size",   "512", "--num-experts",         "8",
    "--seq-length",       "512", "--global-batch-size", "16"};

std::vector<std::string> plan_args(std::vector<std::string> more) {
  std::vector<std::string> args = {"plan"};
  args.insert(args.end(), kModel.begin(), kModel.end());
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

int64_t get(const nlohmann::json& row, const char* key) { return row.at(key).get<int64_t>(); }

bool is_one_rank_layout(const nlohmann::json& row) {
  return get(row, "pipeline-model-parallel-size") == 1 &&
         get(row, "expert-model-parallel-size") == 1;
}

// The options that plan `row` alone.
std::vector<std::string> options_of(const nlohmann::json& row) {
  std::vector<std::string> args = {
      "--pipeline-model-parallel-size",
      std::to_string(get(row, "pipeline-model-parallel-size")),
      "--data-parallel-size",
      std::to_string(get(row, "data-parallel-size")),
      "--expert-model-parallel-size",
      std::to_string(get(row, "expert-model-parallel-size")),
      "--micro-batch-size",
      std::to_string(get(row, "micro-batch-size")),
      "--schedule",
      row.at("schedule").get<std::string>(),
      "--virtual-pipeline-model-parallel-size",
      std::to_string(get(row, "virtual-pipeline-model-parallel-size"))};
  if (row.at("pair-first-forwards") == "on") args.emplace_back("--pair-first-forwards");
  if (row.at("recompute-experts") == "on") args.emplace_back("--recompute-experts");
  if (row.at("use-distributed-optimizer") == "on") args.emplace_back("--use-distributed-optimizer");
  if (row.at("offload-activations") != "off") {
    args.emplace_back("--offload-activations");
    args.emplace_back(row.at("offload-activations").get<std::string>());
  }
  return args;
}

TEST(PlanSearch, ListsTheLayoutsThatFitBestFirstAndNamesOneThatDoesNot) {
  TempDir work, capture;
  auto run = [&](std::vector<std::string> more) {
    return run_tandem(plan_args(std::move(more)), work.path(), capture.path());
  };
  // Under no real limit: the lowest peak of the one-rank layout (PP 1 EP 1).
  const RunResult all = run({"--search", "--world-size", "8", "--memory-limit", "1TiB", "--json"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  int64_t one_rank = INT64_MAX;
  const nlohmann::json every = nlohmann::json::parse(all.out);
  for (const nlohmann::json& row : every.at("fits"))
    if (is_one_rank_layout(row)) one_rank = std::min(one_rank, get(row, "peak_bytes"));
  ASSERT_LT(one_rank, INT64_MAX);
  const std::string limit = std::to_string(one_rank - 1);

  const RunResult under = run({"--search", "--world-size", "8", "--memory-limit", limit, "--json"});
  ASSERT_EQ(under.exit_code, 0) << under.err;
  const nlohmann::json j = nlohmann::json::parse(under.out);
  const nlohmann::json& fits = j.at("fits");
  ASSERT_GT(fits.size(), 5u);
  double previous = 1e300;
  for (const nlohmann::json& row : fits) {
    const int64_t pp = get(row, "pipeline-model-parallel-size"),
                  dp = get(row, "data-parallel-size");
    const int64_t ep = get(row, "expert-model-parallel-size");
    EXPECT_EQ(pp * dp, 8);
    EXPECT_EQ(dp % ep, 0);
    EXPECT_EQ(get(row, "num-microbatches") * get(row, "micro-batch-size") * dp, 16);
    EXPECT_LE(get(row, "peak_bytes"), one_rank - 1);
    EXPECT_FALSE(is_one_rank_layout(row));
    const double tokens = row.at("tokens_per_s").get<double>();
    EXPECT_LE(tokens, previous);
    previous = tokens;
  }
  bool named = false;
  for (const nlohmann::json& over : j.at("layouts_over_limit")) {
    if (over.at("layout") != "PP 1 DP 8 EP 1") continue;
    named = true;
    EXPECT_GT(get(over, "peak_bytes"), one_rank - 1);
  }
  EXPECT_TRUE(named) << under.out;

  // The best row planned alone: the same peak and whole step.
  const RunResult best = run([&] {
    std::vector<std::string> a = options_of(fits.at(0));
    a.emplace_back("--json");
    return a;
  }());
  ASSERT_EQ(best.exit_code, 0) << best.err;
  const nlohmann::json plan = nlohmann::json::parse(best.out);
  int64_t peak = 0;
  for (const nlohmann::json& r : plan.at("ranks")) peak = std::max(peak, get(r, "peak_bytes"));
  EXPECT_EQ(peak, get(fits.at(0), "peak_bytes"));
  EXPECT_DOUBLE_EQ(plan.at("full_step_s").get<double>(),
                   fits.at(0).at("full_step_s").get<double>());

  // The table says why the one-rank layout is not listed.
  const RunResult table = run({"--search", "--world-size", "8", "--memory-limit", limit});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("layouts of which nothing fits"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("\n  PP 1 DP 8 EP 1: "), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("PP 8: the 4 layers do not split into that many stages, evenly or "
                           "with a shorter last stage"),
            std::string::npos)
      << table.out;
}

TEST(PlanSearch, AnOptionGivenFixesItsDimension) {
  TempDir work, capture;
  const RunResult r =
      run_tandem(plan_args({"--search", "--world-size", "8", "--memory-limit", "1TiB", "--json",
                            "--schedule", "1f1b", "--expert-model-parallel-size", "2"}),
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json fits = nlohmann::json::parse(r.out).at("fits");
  ASSERT_FALSE(fits.empty());
  for (const nlohmann::json& row : fits) {
    EXPECT_EQ(row.at("schedule"), "1f1b");
    EXPECT_EQ(get(row, "expert-model-parallel-size"), 2);
  }
}

// DeepSeek-V3's attention and router (multi-head latent attention, the sigmoid router): the
// search plans them for the GPU.
TEST(PlanSearch, PlansDeepseekV3ForTheGpu) {
  TempDir work, capture;
  const std::vector<std::string> mla = {"--device",
                                        "cuda",
                                        "--num-layers",
                                        "2",
                                        "--hidden-size",
                                        "64",
                                        "--num-attention-heads",
                                        "4",
                                        "--num-query-groups",
                                        "4",
                                        "--ffn-hidden-size",
                                        "128",
                                        "--num-experts",
                                        "4",
                                        "--seq-length",
                                        "32",
                                        "--multi-latent-attention",
                                        "--qk-layernorm",
                                        "--kv-lora-rank",
                                        "32",
                                        "--qk-head-dim",
                                        "16",
                                        "--qk-pos-emb-head-dim",
                                        "8",
                                        "--v-head-dim",
                                        "16",
                                        "--rotary-interleaved",
                                        "--moe-router-score-function",
                                        "sigmoid",
                                        "--moe-aux-loss-coeff",
                                        "0",
                                        "--global-batch-size",
                                        "8",
                                        "--micro-batch-size",
                                        "1"};
  auto run = [&](std::string command, std::vector<std::string> more) {
    std::vector<std::string> args = {std::move(command)};
    args.insert(args.end(), mla.begin(), mla.end());
    args.insert(args.end(), more.begin(), more.end());
    return run_tandem(args, work.path(), capture.path());
  };
  const RunResult plan =
      run("plan", {"--search", "--world-size", "4", "--memory-limit", "1GiB", "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_FALSE(nlohmann::json::parse(plan.out).at("fits").empty());
}

TEST(PlanSearch, BadInputExitsWithTwoAndWritesNothing) {
  auto bad = [](std::string name, std::vector<std::string> more,
                std::vector<std::string> expected) {
    BadInput c{std::move(name), plan_args(std::move(more)), std::move(expected)};
    c.args.erase(c.args.begin());  // run_case puts the command first
    c.command = "plan";
    return c;
  };
  const std::vector<BadInput> cases = {
      bad("no ranks", {"--search", "--world-size", "0", "--memory-limit", "1GiB"},
          {"--world-size", "0"}),
      bad("a count no layout divides", {"--search", "--world-size", "3", "--memory-limit", "1GiB"},
          {"no layout of 3 ranks", "does not divide the global batch of 16"}),
      bad("no memory limit", {"--search", "--world-size", "8"}, {"--search needs --memory-limit"}),
      bad("no world size", {"--search", "--memory-limit", "1GiB"}, {"--search needs --world-size"}),
      bad("world size without search", {"--world-size", "8"},
          {"--world-size is an option of the layout search"}),
      bad("search with an svg",
          {"--search", "--world-size", "8", "--memory-limit", "1GiB", "--svg", "x.svg"},
          {"leave out --svg"}),
      bad("search with micro-batches",
          {"--search", "--world-size", "8", "--memory-limit", "1GiB", "--num-microbatches", "4"},
          {"leave out --num-microbatches"}),
  };
  EXPECT_EQ(run_cases({cases}), static_cast<int>(cases.size()));
}

}  // namespace
}  // namespace tandem::test
