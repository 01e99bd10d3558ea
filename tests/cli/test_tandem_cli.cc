// The real `tandem` program on bad command lines, run as a subprocess in an empty directory.
// Oracle: exit code 2, stderr names the bad value, and the directory is still empty afterwards.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem_process.h"

namespace {

namespace fs = std::filesystem;
using tandem::test::run_tandem;
using tandem::test::RunResult;
using tandem::test::TempDir;

// The subcommand that takes the run options.
constexpr const char* kCommand = "train";

// `tandem train args...` (tests/cli/tandem_process.h runs it and captures its output).
RunResult run_train(const std::vector<std::string>& args, const fs::path& cwd,
                    const fs::path& capture) {
  std::vector<std::string> all = {kCommand};
  all.insert(all.end(), args.begin(), args.end());
  return run_tandem(all, cwd, capture);
}

struct BadRun {
  std::vector<std::string> args;
  std::string expected_in_stderr;  // the bad value
};

TEST(TandemProgram, BadCommandLinesExitWithTwoAndWriteNothing) {
  const std::vector<BadRun> cases = {
      {{"--num-layers", "abc"}, "abc"},
      {{"--no-such-option", "1"}, "--no-such-option"},
      {{"--num-layers"}, "--num-layers"},
      {{"--schedule", "zigzag"}, "zigzag"},
      {{"--device", "tpu"}, "tpu"},
      // No GPU on the test machine (or no CUDA in the build): refused before anything is written.
      {{"--device", "cuda", "--save", "ckpt", "--log-json", "out.json"}, "--device cuda"},
      {{"--log-json", "out.json", "--num-layers", "-3"}, "-3"},
      {{"--log-json", "out.json", "--moe-router-topk", "9"}, "--moe-router-topk 9"},
      {{"--log-json", "out.json", "--trace", "trace.json", "--lr", "-1"}, "--lr -1"},
      {{"--save", "ckpt", "--hidden-size", "250"}, "--hidden-size 250"},
      {{"--save", "ckpt", "--global-batch-size", "20"}, "--global-batch-size 20"},
      {{"--save", "ckpt", "--log-json", "out.json", "--seed", "x1"}, "x1"},
      {{"--config", "missing.toml", "--log-json", "out.json"}, "missing.toml"},
      {{"--data-path", "nope.bin", "--save", "ckpt"}, "nope.bin"},
  };
  TempDir capture;
  for (const BadRun& c : cases) {
    std::string line;
    for (const std::string& a : c.args) line += " " + a;
    TempDir work;
    const RunResult r = run_train(c.args, work.path(), capture.path());
    EXPECT_EQ(r.exit_code, 2) << "tandem " << kCommand << line << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(c.expected_in_stderr), std::string::npos)
        << "tandem " << kCommand << line << "\nstderr: " << r.err;
    EXPECT_TRUE(fs::is_empty(work.path())) << "tandem " << kCommand << line << " wrote files";
  }
}

TEST(TandemProgram, HelpExitsWithZero) {
  TempDir work, capture;
  const RunResult r = run_train({"--help"}, work.path(), capture.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--num-layers"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_empty(work.path()));
}

}  // namespace

// `tandem plan --device cuda` plans the GPU trainer: the weights' bf16 copy in the static memory
// (2 bytes per parameter beside the f32 master's 4), and bf16 activations, so less activation
// memory than the f32 plan of the same run; --recompute-experts plans less activation memory.
TEST(TandemProgram, PlanForTheGpuCountsTheWeightCopyAndBf16Activations) {
  TempDir work, capture;
  auto plan = [&](bool gpu, bool recompute = false) {
    std::vector<std::string> args = {"plan", "--json", "--pipeline-model-parallel-size", "2",
                                     "--num-layers", "4", "--global-batch-size", "8"};
    if (gpu) args.insert(args.end(), {"--device", "cuda"});
    if (recompute) args.push_back("--recompute-experts");
    const RunResult r = run_tandem(args, work.path(), capture.path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json cpu = plan(false), gpu = plan(true), recomputed = plan(false, true);
  ASSERT_EQ(gpu.at("ranks").size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    const nlohmann::json& g = gpu.at("ranks")[r];
    const nlohmann::json& c = cpu.at("ranks")[r];
    EXPECT_EQ(g.at("compute_copy_bytes").get<int64_t>() * 2, g.at("param_bytes").get<int64_t>());
    EXPECT_EQ(c.at("compute_copy_bytes").get<int64_t>(), 0);
    EXPECT_EQ(g.at("param_bytes"), c.at("param_bytes"));
    EXPECT_LT(g.at("activation_peak_bytes").get<int64_t>(),
              c.at("activation_peak_bytes").get<int64_t>());
    // --recompute-experts: the experts keep only their input rows.
    EXPECT_LT(recomputed.at("ranks")[r].at("activation_peak_bytes").get<int64_t>(),
              c.at("activation_peak_bytes").get<int64_t>());
  }
}

// Note [Deferred update in the plan]: `tandem plan --defer-optimizer` puts the update into the
// first forward, beside its all-to-all: less of it exposed than the plan without it, and the
// compute stream busier by the update. With EP on GPUs and combined-1f1b that is the default
// (Note [Deferred update by default] in options.cc); --defer-optimizer=false plans without it.
TEST(TandemProgram, PlanModelsTheDeferredUpdate) {
  TempDir work, capture;
  auto plan = [&](const std::string& defer) {
    std::vector<std::string> args = {"plan", "--json", "--device", "cuda",
                                     "--expert-model-parallel-size", "2", "--schedule",
                                     "combined-1f1b"};
    if (!defer.empty()) args.push_back(defer);
    const RunResult r = run_tandem(args, work.path(), capture.path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out).at("ranks")[0];
  };
  const nlohmann::json end = plan("--defer-optimizer=false"), deferred = plan("--defer-optimizer");
  EXPECT_LT(deferred.at("exposed_alltoall_s").get<double>(),
            end.at("exposed_alltoall_s").get<double>());
  EXPECT_GT(deferred.at("compute_busy_s").get<double>(), end.at("compute_busy_s").get<double>());
  EXPECT_EQ(plan("").dump(), deferred.dump());  // the default
}
