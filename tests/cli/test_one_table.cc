// One table of options for `tandem train` and `tandem plan`, and one name table per enumeration
// (Note [One name table per enumeration] in core/enum_names.h). Oracles: train's own plan of its
// run (the planned peaks in --log-json) against `tandem plan --json` of the same command line;
// each enum's table for the valid names a refusal must list; a checkpoint's JSON read back.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/enum_names.h"
#include "data/file_dataset.h"
#include "planner/cost_model.h"
#include "runtime/checkpoint.h"
#include "runtime/comm_overlap.h"
#include "schedule/generators.h"
#include "tandem_process.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using test::run_tandem;
using test::RunResult;
using test::TempDir;

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A small MoE model, with options of every kind: sizes, a double, flags, enums (--nan-policy,
// --comm-overlap, --schedule) and a TOML file.
const std::vector<std::string> kModel = {"--num-layers",       "2",   "--hidden-size", "64",
                                         "--ffn-hidden-size",  "128", "--seq-length",  "32",
                                         "--micro-batch-size", "2",   "--vocab-size",  "300"};

// The help line of each option of `command` (from "  --name" to the next option).
std::vector<std::string> option_lines(const std::string& help) {
  std::vector<std::string> lines;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  --", 0) == 0) lines.push_back(line);
  }
  return lines;
}

// Every option `tandem train` has is in `tandem plan` with the same type, help and default: one
// declaration serves both.
TEST(OneTable, PlanHasEveryTrainOptionAsTrainHasIt) {
  TempDir work, capture;
  const RunResult train = run_tandem({"train", "--help"}, work.path(), capture.path());
  const RunResult plan = run_tandem({"plan", "--help"}, work.path(), capture.path());
  ASSERT_EQ(train.exit_code, 0) << train.err;
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::vector<std::string> train_lines = option_lines(train.out);
  const std::vector<std::string> plan_lines = option_lines(plan.out);
  ASSERT_GT(train_lines.size(), 40u);
  for (const std::string& line : train_lines) {
    EXPECT_NE(std::find(plan_lines.begin(), plan_lines.end(), line), plan_lines.end())
        << "plan lacks or differs on: " << line;
  }
}

// The same command line under train and plan means the same run: train's own plan of it (the
// planned peaks it logs) equals `tandem plan --json`'s, for options of every kind.
TEST(OneTable, AValueMeansTheSameUnderTrainAndPlan) {
  TempDir work, capture;
  const std::string config = work / "run.toml";
  std::ofstream(config) << "nan-policy = \"skip\"\ncomm-overlap = \"off\"\nmoe-router-topk = 1\n";
  const std::vector<std::vector<std::string>> cases = {
      {"--global-batch-size", "4", "--num-experts", "4"},
      {"--global-batch-size", "8", "--num-experts", "4", "--recompute-experts", "--nan-policy",
       "skip"},
      {"--global-batch-size", "4", "--num-experts", "4", "--schedule", "combined-1f1b",
       "--comm-overlap", "off", "--pair-first-forwards"},
      {"--global-batch-size", "8", "--num-experts", "4", "--kv-channels", "32", "--config", config},
      {"--global-batch-size", "4", "--num-experts", "0"},
  };
  for (const std::vector<std::string>& c : cases) {
    const std::vector<std::string> args = with(kModel, c);
    std::string line;
    for (const std::string& a : args) line += " " + a;
    const RunResult plan = run_tandem(with({"plan", "--json"}, args), work.path(), capture.path());
    ASSERT_EQ(plan.exit_code, 0) << line << "\n" << plan.err;
    const nlohmann::json planned = nlohmann::json::parse(plan.out)["ranks"][0];
    const std::string log = work / "log.jsonl";
    const RunResult train =
        run_tandem(with({"train", "--quiet", "--train-iters", "1", "--log-json", log}, args),
                   work.path(), capture.path());
    ASSERT_EQ(train.exit_code, 0) << line << "\n" << train.err;
    std::ifstream in(log);
    std::string first;
    std::getline(in, first);
    const nlohmann::json logged = nlohmann::json::parse(first);
    EXPECT_EQ(logged["planned_peak_bytes"], planned["peak_bytes"]) << line;
    EXPECT_EQ(logged["planned_activation_peak_bytes"], planned["activation_peak_bytes"]) << line;
  }
}

template <class E>
std::vector<std::string> names() {
  return enum_name_list<E>();
}

// An unknown value of an enumeration exits 2, names the value and lists every valid name, under
// either command, on the command line and in the config file.
TEST(OneTable, AnUnknownEnumValueExitsTwoNamingTheValidSet) {
  struct Case {
    std::string command, option;
    std::vector<std::string> valid;
  };
  std::vector<Case> cases;
  for (const std::string command : {"train", "plan"}) {
    cases.push_back({command, "device", names<Device>()});
    cases.push_back({command, "nan-policy", names<NonFinitePolicy>()});
    cases.push_back({command, "comm-overlap", names<runtime::CommOverlap>()});
    cases.push_back({command, "schedule", names<schedule::ScheduleKind>()});
    cases.push_back({command, "data-format", names<data::DatasetFormat>()});
  }
  cases.push_back({"plan", "cost-model", {"roofline", "uniform"}});
  TempDir capture;
  for (const Case& c : cases) {
    for (const bool in_file : {false, true}) {
      if (in_file && c.option == "cost-model") continue;  // plan's own, not a run option
      TempDir work;
      std::vector<std::string> args = {c.command, "--" + c.option, "sometimes"};
      if (in_file) {
        std::ofstream(work / "run.toml") << c.option << " = \"sometimes\"\n";
        args = {c.command, "--config", work / "run.toml"};
      }
      const RunResult r = run_tandem(args, work.path(), capture.path());
      EXPECT_EQ(r.exit_code, 2) << c.command << " " << c.option << "\n" << r.err;
      EXPECT_NE(r.err.find("sometimes"), std::string::npos) << r.err;
      std::string listed;
      for (const std::string& n : c.valid) listed += (listed.empty() ? "" : ", ") + n;
      EXPECT_NE(r.err.find("one of: " + listed), std::string::npos) << r.err;
    }
  }
}

// A script's repeated option takes its last value, as Megatron's argparse does (`$BASE
// --train-iters 1` over a $BASE that sets it), under train and plan alike.
TEST(OneTable, ARepeatedOptionTakesItsLastValue) {
  TempDir work, capture;
  const std::string log = work / "log.jsonl";
  const RunResult train =
      run_tandem(with({"train", "--quiet", "--train-iters", "5", "--log-json", log, "--num-experts",
                       "4", "--global-batch-size", "4", "--train-iters", "1"},
                      kModel),
                 work.path(), capture.path());
  ASSERT_EQ(train.exit_code, 0) << train.err;
  std::ifstream in(log);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 1);
  const std::vector<std::string> base = with(kModel, {"--global-batch-size", "4", "--json"});
  const RunResult two =
      run_tandem(with({"plan", "--num-layers", "8"}, with(base, {"--num-layers", "2"})),
                 work.path(), capture.path());
  const RunResult plain = run_tandem(with({"plan"}, base), work.path(), capture.path());
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(nlohmann::json::parse(two.out)["ranks"], nlohmann::json::parse(plain.out)["ranks"]);
}

// Every value of every enumeration a checkpoint's JSON holds comes back from it.
TEST(OneTable, CheckpointJsonRoundTripsEveryEnum) {
  for (const EnumName<NonFinitePolicy>& n : enum_names(NonFinitePolicy{})) {
    TrainConfig t;
    t.non_finite_policy = n.value;
    const nlohmann::json j = runtime::config_to_json(t);
    EXPECT_EQ(j["nan_policy"], n.name);
    EXPECT_EQ(runtime::train_config_from_json(j, "test: ").non_finite_policy, n.value) << n.name;
  }
  TrainConfig t;
  nlohmann::json j = runtime::config_to_json(t);
  j["nan_policy"] = "sometimes";
  try {
    runtime::train_config_from_json(j, "test: ");
    ADD_FAILURE() << "nan_policy \"sometimes\" was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected one of: stop, skip"), std::string::npos)
        << e.what();
  }
}

// A checkpoint that records document_positions under Megatron-LM's name, reset_position_ids,
// resumes with its positions restarted; the table's own key wins where both are present.
TEST(OneTable, CheckpointJsonReadsDocumentPositionsByTheirOlderName) {
  TrainConfig t;
  t.eod_token_id = 5;  // what the document options split on
  nlohmann::json j = runtime::config_to_json(t);
  j.erase("document_positions");
  EXPECT_FALSE(runtime::train_config_from_json(j, "test: ").document_positions);
  j["reset_position_ids"] = true;
  EXPECT_TRUE(runtime::train_config_from_json(j, "test: ").document_positions);
  j["document_positions"] = false;
  EXPECT_FALSE(runtime::train_config_from_json(j, "test: ").document_positions);
}

// Each table names every value once, and each name parses back to its value.
TEST(OneTable, EveryNameParsesBackToItsValue) {
  const auto check = [](auto tag) {
    using E = decltype(tag);
    std::vector<std::string> seen;
    for (const EnumName<E>& n : enum_names(E{})) {
      EXPECT_EQ(parse_enum<E>(n.name), n.value) << n.name;
      EXPECT_EQ(enum_name(n.value), n.name);
      EXPECT_EQ(std::count(seen.begin(), seen.end(), n.name), 0) << n.name;
      seen.emplace_back(n.name);
    }
    EXPECT_FALSE(parse_enum<E>("sometimes").has_value());
  };
  check(Device{});
  check(NonFinitePolicy{});
  check(runtime::CommOverlap{});
  check(schedule::ScheduleKind{});
  check(schedule::CostModelKind{});
  check(data::DatasetFormat{});
  EXPECT_EQ(std::size(schedule::kScheduleKindNames), size_t{schedule::kNumScheduleKinds});
}

}  // namespace
}  // namespace tandem
