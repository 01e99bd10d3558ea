// The real `tandem` program on bad command lines, run as a subprocess in an empty directory.
// Oracle: exit code 2, stderr names the bad value, and the directory is still empty afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

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
      {{"--log-json", "out.json", "--num-experts", "8", "--moe-router-topk", "9"},
       "--moe-router-topk 9"},
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

// Every environment variable the program reads (a getenv or beside_program call in src/) is
// named in `train --help` or `convert --help`: the launcher's (OMPI_*, PMI*, MPI_*, LOCAL_*)
// under "OMPI_COMM_WORLD_*", the rest by name; the test-fault switches, read by
// src/core/test_faults.cc alone, are tandem's (TANDEM_*) and named nowhere.
TEST(TandemProgram, HelpNamesEveryEnvironmentVariable) {
  TempDir work, capture;
  const RunResult train = run_train({"--help"}, work.path(), capture.path());
  const RunResult convert = run_tandem({"convert", "--help"}, work.path(), capture.path());
  ASSERT_EQ(train.exit_code, 0) << train.err;
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  std::string help = train.out + convert.out;
  help.erase(std::remove(help.begin(), help.end(), '\n'), help.end());
  EXPECT_NE(help.find("OMPI_COMM_WORLD_*"), std::string::npos) << help;
  const std::regex read(R"re((getenv|beside_program)\("([A-Z][A-Z0-9_]*)")re");
  int names = 0;
  for (const auto& f : fs::recursive_directory_iterator(std::string(TANDEM_SOURCE_DIR) + "/src")) {
    const std::string ext = f.path().extension().string();
    if (ext != ".cc" && ext != ".h" && ext != ".cu") continue;
    const std::string text = tandem::test::slurp(f.path());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), read);
         it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[2];
      ++names;
      if (f.path().filename() == "test_faults.cc") {
        EXPECT_TRUE(name.starts_with("TANDEM_")) << name;
        continue;
      }
      if (name.starts_with("OMPI_") || name.starts_with("PMI") || name.starts_with("MPI_") ||
          name.starts_with("LOCAL_")) {
        continue;
      }
      EXPECT_NE(help.find(name), std::string::npos) << name << " (" << f.path() << ")";
    }
  }
  EXPECT_GE(names, 8);
}

}  // namespace

// `tandem plan --device cuda` plans the GPU trainer: the weights' bf16 copy in the static memory
// (2 bytes per parameter beside the f32 master's 4), and bf16 activations, so less activation
// memory than the f32 plan of the same run; --recompute-experts plans less activation memory.
TEST(TandemProgram, PlanForTheGpuCountsTheWeightCopyAndBf16Activations) {
  TempDir work, capture;
  auto plan = [&](bool gpu, bool recompute = false) {
    std::vector<std::string> args = {"plan",
                                     "--json",
                                     "--pipeline-model-parallel-size",
                                     "2",
                                     "--num-layers",
                                     "4",
                                     "--num-experts",
                                     "8",
                                     "--global-batch-size",
                                     "8"};
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
    // Two ranks, two micro-batches each (as `mpirun -np 2 tandem train` would run it).
    std::vector<std::string> args = {"plan",
                                     "--json",
                                     "--device",
                                     "cuda",
                                     "--num-experts",
                                     "8",
                                     "--expert-model-parallel-size",
                                     "2",
                                     "--schedule",
                                     "combined-1f1b",
                                     "--global-batch-size",
                                     "32"};
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

// Note [Distributed optimizer in the plan]: `tandem plan --use-distributed-optimizer` plans each
// rank's Adam moments for its part of the weights (every unit divides by 2 here: exactly half),
// and nothing else changes but the peak, by as much; with one rank a stage it changes nothing.
// (tests/dist/test_distributed_optimizer.cc holds the planned bytes to the allocated ones.)
TEST(TandemProgram, PlanDividesTheOptimizerStateOfTheDistributedOptimizer) {
  TempDir work, capture;
  auto plan = [&](const char* dp, bool distributed) {
    std::istringstream words(
        "plan --json --pipeline-model-parallel-size 2 --num-layers 4 --global-batch-size 32");
    std::vector<std::string> args;
    for (std::string w; words >> w;) args.push_back(w);
    args.insert(args.end(), {"--data-parallel-size", dp});
    if (distributed) args.push_back("--use-distributed-optimizer");
    const RunResult r = run_tandem(args, work.path(), capture.path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json plain = plan("2", false), split = plan("2", true);
  for (size_t r = 0; r < 2; ++r) {
    const nlohmann::json& p = plain.at("ranks")[r];
    const nlohmann::json& s = split.at("ranks")[r];
    const int64_t saved = p.at("optimizer_bytes").get<int64_t>() / 2;
    EXPECT_GT(saved, 0);
    EXPECT_EQ(s.at("optimizer_bytes").get<int64_t>(), saved);
    EXPECT_EQ(s.at("param_bytes"), p.at("param_bytes"));
    EXPECT_EQ(s.at("peak_bytes").get<int64_t>(), p.at("peak_bytes").get<int64_t>() - saved);
  }
  EXPECT_EQ(split.at("step_time_s"), plain.at("step_time_s"));
  EXPECT_EQ(plan("1", true).dump(), plan("1", false).dump());
}

// Note [Gradient reduction in the plan]: `tandem plan --data-parallel-size N` divides the global
// batch as `tandem train` on N ranks a stage does and plans the gradient all-reduce: beside the
// backward by default, after it with --overlap-grad-reduce=false; neither moves the
// forward-backward. Bad sizes get an error that names them.
// `tandem plan --tensor-model-parallel-size 2` plans one tensor-parallel rank of a dense model
// (Note [Tensor parallelism] in core/config_tp.cc): the run is two ranks, each holding half of
// the attention's and the SwiGLU's weights, and each layer's all-reduces make its step longer
// than the shard's alone (Note [Tensor-parallel all-reduces in the plan]).
TEST(TandemProgram, PlanOfTensorParallelRanks) {
  TempDir work, capture;
  const std::vector<std::string> dense = {
      "plan", "--num-experts",         "0", "--num-layers",       "2", "--hidden-size",
      "64",   "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size",
      "128"};
  const auto plan = [&](std::vector<std::string> more) {
    std::vector<std::string> args = dense;
    args.insert(args.end(), more.begin(), more.end());
    const RunResult r = run_tandem(args, work.path(), capture.path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  };
  const std::string text = plan({"--tensor-model-parallel-size", "2"});
  EXPECT_NE(text.find(", TP 2,"), std::string::npos) << text;
  EXPECT_NE(text.find("tokens/s on 2 ranks"), std::string::npos) << text;
  const nlohmann::json one = nlohmann::json::parse(plan({"--json"}));
  const nlohmann::json two =
      nlohmann::json::parse(plan({"--json", "--tensor-model-parallel-size", "2"}));
  EXPECT_EQ(one.at("tensor_parallel_size"), 1);
  EXPECT_EQ(two.at("tensor_parallel_size"), 2);
  // Half the attention and SwiGLU weights (and their gradients and moments) a rank.
  EXPECT_LT(two.at("ranks")[0].at("param_bytes").get<double>(),
            one.at("ranks")[0].at("param_bytes").get<double>());
  // The shard itself at TP 1 (a repeated option takes its last value): the same weights, no
  // all-reduces, a shorter step.
  const nlohmann::json shard =
      nlohmann::json::parse(plan({"--json", "--num-attention-heads", "2", "--num-query-groups", "1",
                                  "--kv-channels", "16", "--ffn-hidden-size", "64"}));
  EXPECT_EQ(shard.at("ranks")[0].at("param_bytes"), two.at("ranks")[0].at("param_bytes"));
  EXPECT_LT(shard.at("full_step_s").get<double>(), two.at("full_step_s").get<double>());
  EXPECT_TRUE(fs::is_empty(work.path()));
}

TEST(TandemProgram, PlanModelsTheDataParallelGradientReduction) {
  TempDir work, capture;
  auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> args = {"plan",
                                     "--json",
                                     "--untie-embeddings-and-output-weights",
                                     "--pipeline-model-parallel-size",
                                     "2",
                                     "--num-layers",
                                     "4",
                                     "--num-experts",
                                     "8",
                                     "--global-batch-size",
                                     "32"};
    args.insert(args.end(), more.begin(), more.end());
    return run_tandem(args, work.path(), capture.path());
  };
  auto plan = [&](std::vector<std::string> more) {
    const RunResult r = run(std::move(more));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json one = plan({}), beside = plan({"--data-parallel-size", "2"}),
                       at_end = plan({"--data-parallel-size", "2", "--overlap-grad-reduce=false"});
  EXPECT_EQ(one.at("data_parallel_size"), 1);
  EXPECT_EQ(one.at("num_microbatches"), 4);  // 32 / micro-batch 8
  EXPECT_EQ(one.at("step_with_reduce_s"), one.at("step_time_s"));
  EXPECT_EQ(beside.at("data_parallel_size"), 2);
  EXPECT_EQ(beside.at("num_microbatches"), 2);  // 32 / (8 x 2)
  EXPECT_EQ(beside.at("step_time_s"), at_end.at("step_time_s"));
  EXPECT_GT(beside.at("step_with_reduce_s").get<double>(), beside.at("step_time_s").get<double>());
  EXPECT_LT(beside.at("step_with_reduce_s").get<double>(),
            at_end.at("step_with_reduce_s").get<double>());
  // The whole step (Note [The step's end in the plan]) and the tokens it trains: 32 x 128.
  EXPECT_GT(beside.at("full_step_s").get<double>(), beside.at("step_with_reduce_s").get<double>());
  EXPECT_NEAR(beside.at("tokens_per_s").get<double>() * beside.at("full_step_s").get<double>(),
              32.0 * 128, 1e-6);
  EXPECT_NEAR(one.at("tokens_per_s").get<double>() * one.at("full_step_s").get<double>(),
              32.0 * 128, 1e-6);
  for (size_t r = 0; r < 2; ++r) {
    const nlohmann::json& b = beside.at("ranks")[r];
    const nlohmann::json& e = at_end.at("ranks")[r];
    EXPECT_EQ(one.at("ranks")[r].at("grad_reduce_s"), 0);
    EXPECT_GT(b.at("grad_reduce_s").get<double>(), 0);
    EXPECT_DOUBLE_EQ(b.at("grad_reduce_s").get<double>(), e.at("grad_reduce_s").get<double>());
    EXPECT_DOUBLE_EQ(e.at("grad_reduce_tail_s").get<double>(), e.at("grad_reduce_s").get<double>());
    EXPECT_LT(b.at("grad_reduce_tail_s").get<double>(), e.at("grad_reduce_tail_s").get<double>());
  }
  const RunResult text = run_tandem({"plan", "--pipeline-model-parallel-size", "2", "--num-layers",
                                     "4", "--global-batch-size", "32", "--data-parallel-size", "2"},
                                    work.path(), capture.path());
  EXPECT_NE(text.out.find("data-parallel size 2: gradient all-reduce"), std::string::npos)
      << text.out;
  const RunResult odd = run({"--expert-model-parallel-size", "2", "--data-parallel-size", "3"});
  EXPECT_EQ(odd.exit_code, 2);
  EXPECT_NE(odd.err.find("--data-parallel-size 3 is invalid"), std::string::npos) << odd.err;
  EXPECT_NE(odd.err.find("multiple of --expert-model-parallel-size 2"), std::string::npos);
  const RunResult batch = run({"--data-parallel-size", "8"});
  EXPECT_EQ(batch.exit_code, 2);
  EXPECT_NE(batch.err.find("valid global batch sizes are multiples of 64"), std::string::npos)
      << batch.err;
}

namespace {

// `tandem train` plans its memory before the first step (plan_training_run): a line on stdout,
// each JSON line's planned peaks, and the summary's. On the CPU the activation peak and the whole
// peak are planned to the byte (docs/memory.md, "Planned and measured").
TEST(TandemProgram, TrainPrintsAndLogsItsPlannedMemory) {
  TempDir work, capture;
  const RunResult r = run_train(
      {"--num-layers",       "2",  "--hidden-size",      "32",       "--num-attention-heads", "4",
       "--num-query-groups", "2",  "--ffn-hidden-size",  "48",       "--num-experts",         "4",
       "--seq-length",       "16", "--micro-batch-size", "2",        "--global-batch-size",   "6",
       "--train-iters",      "2",  "--log-json",         "log.jsonl"},
      work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("memory as planned (tandem plan): peak "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" (planned "), std::string::npos) << r.out;  // the summary
  std::istringstream lines(tandem::test::slurp(work.path() / "log.jsonl"));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("planned_activation_peak_bytes"), j.at("activation_peak_bytes")) << line;
    EXPECT_GT(j.at("planned_peak_bytes").get<int64_t>(), 0);
    EXPECT_EQ(j.at("planned_peak_bytes"), j.at("mem_peak_bytes")) << line;
  }
  EXPECT_EQ(n, 2);
}

}  // namespace

namespace {

// `tandem plan --compare-schedules`: one row per built-in schedule, each the plan that
// `--schedule NAME` gives alone (or why it does not fit the layout), and an error for the
// options that take one schedule.
TEST(TandemProgram, PlanComparesEverySchedule) {
  TempDir work, capture;
  const std::vector<std::string> layout = {"plan",
                                           "--json",
                                           "--pipeline-model-parallel-size",
                                           "2",
                                           "--num-layers",
                                           "2",
                                           "--global-batch-size",
                                           "32"};
  auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> args = layout;
    args.insert(args.end(), more.begin(), more.end());
    return run_tandem(args, work.path(), capture.path());
  };
  const RunResult all = run({"--compare-schedules"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const nlohmann::json rows = nlohmann::json::parse(all.out).at("schedules");
  ASSERT_EQ(rows.size(), 6u);
  int planned = 0;
  for (const nlohmann::json& row : rows) {
    const std::string name = row.at("schedule");
    if (row.contains("error")) {
      // Two layers on PP 2: no room for two stages a rank.
      EXPECT_EQ(row.at("virtual_stages"), 2) << name;
      EXPECT_NE(row.at("error").get<std::string>().find("--num-layers 2"), std::string::npos);
      continue;
    }
    ++planned;
    const RunResult one = run({"--schedule", name});
    ASSERT_EQ(one.exit_code, 0) << name << ": " << one.err;
    const nlohmann::json j = nlohmann::json::parse(one.out);
    EXPECT_EQ(row.at("step_time_s"), j.at("step_time_s")) << name;
    EXPECT_EQ(row.at("full_step_s"), j.at("full_step_s")) << name;
    int64_t peak = 0;
    for (const nlohmann::json& r : j.at("ranks")) {
      peak = std::max(peak, r.at("peak_bytes").get<int64_t>());
    }
    EXPECT_EQ(row.at("peak_bytes"), peak) << name;
  }
  EXPECT_EQ(planned, 4);  // gpipe, 1f1b, combined-1f1b, zb-h1
  const RunResult svg = run({"--compare-schedules", "--svg", "x.svg"});
  EXPECT_EQ(svg.exit_code, 2);
  EXPECT_NE(svg.err.find("--compare-schedules plans every built-in schedule"), std::string::npos)
      << svg.err;
  EXPECT_FALSE(fs::exists(work.path() / "x.svg"));
  // A chart's name without an extension gets .svg, the file a browser opens as one.
  const RunResult chart = run({"--svg", "chart"});
  ASSERT_EQ(chart.exit_code, 0) << chart.err;
  EXPECT_TRUE(fs::exists(work.path() / "chart.svg"));
  EXPECT_FALSE(fs::exists(work.path() / "chart"));
}

}  // namespace

namespace {

// `tandem plan --measured-trace FILE`: a measured step (`tandem train --trace`) beside the plan
// of the same run, each rank's forward-backward planned and measured, and with --trace one
// chart holding both (Note [Planned and measured on one chart]); a file that is no trace is
// named in the error.
TEST(TandemProgram, PlanSetsAMeasuredStepBesideThePlan) {
  TempDir work, capture;
  const std::vector<std::string> model = {"--num-layers",
                                          "2",
                                          "--hidden-size",
                                          "32",
                                          "--num-attention-heads",
                                          "4",
                                          "--num-query-groups",
                                          "2",
                                          "--ffn-hidden-size",
                                          "48",
                                          "--num-experts",
                                          "4",
                                          "--seq-length",
                                          "16",
                                          "--micro-batch-size",
                                          "2",
                                          "--global-batch-size",
                                          "4",
                                          "--quiet"};
  std::vector<std::string> train = {"--train-iters", "2", "--trace", "run.json"};
  train.insert(train.end(), model.begin(), model.end());
  ASSERT_EQ(run_train(train, work.path(), capture.path()).exit_code, 0);
  std::vector<std::string> plan = {"plan", "--measured-trace", "run.json", "--trace", "both.json"};
  plan.insert(plan.end(), model.begin(), model.end());
  const RunResult r = run_tandem(plan, work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rank 0: forward-backward planned "), std::string::npos) << r.out;
  const nlohmann::json both = nlohmann::json::parse(tandem::test::slurp(work.path() / "both.json"));
  bool planned = false, measured = false;
  for (const nlohmann::json& e : both.at("traceEvents")) {
    if (e.value("name", "") != "process_name") continue;
    planned = planned || e.at("args").at("name") == "rank 0 (planned, stages 0)";
    measured = measured || (e.at("pid") == 1000 && e.at("args").at("name") == "rank 0 (measured)");
  }
  EXPECT_TRUE(planned && measured) << both.dump().substr(0, 600);
  {
    std::ofstream bad(work.path() / "bad.json");
    bad << "{\"events\": []}";
  }
  plan[2] = "bad.json";
  const RunResult b = run_tandem(plan, work.path(), capture.path());
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.err.find("bad.json: not a trace"), std::string::npos) << b.err;
}

}  // namespace

namespace {

// `tandem plan --memory-limit SIZE`: which ranks' planned peaks go over it (JSON "fits", a line
// under the table), which schedules fit under --compare-schedules, and a clear error for a size
// that is none.
TEST(TandemProgram, PlanChecksAMemoryLimit) {
  TempDir work, capture;
  auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> args = {
        "plan", "--pipeline-model-parallel-size", "2", "--num-layers", "4", "--global-batch-size",
        "32"};
    args.insert(args.end(), more.begin(), more.end());
    return run_tandem(args, work.path(), capture.path());
  };
  const RunResult plain = run({"--json"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const nlohmann::json ranks = nlohmann::json::parse(plain.out).at("ranks");
  const int64_t high =
      std::max(ranks[0].at("peak_bytes").get<int64_t>(), ranks[1].at("peak_bytes").get<int64_t>());
  const int64_t low =
      std::min(ranks[0].at("peak_bytes").get<int64_t>(), ranks[1].at("peak_bytes").get<int64_t>());
  ASSERT_LT(low, high);
  const std::string between = std::to_string((low + high) / 2);
  const nlohmann::json j = nlohmann::json::parse(run({"--json", "--memory-limit", between}).out);
  EXPECT_EQ(j.at("memory_limit_bytes"), (low + high) / 2);
  for (const nlohmann::json& r : j.at("ranks")) {
    EXPECT_EQ(r.at("fits"), r.at("peak_bytes").get<int64_t>() == low);
  }
  EXPECT_NE(run({"--memory-limit", between}).out.find("over --memory-limit "), std::string::npos);
  EXPECT_NE(run({"--memory-limit", "1TiB"}).out.find("every rank within --memory-limit 1.0 TiB"),
            std::string::npos);
  const nlohmann::json rows =
      nlohmann::json::parse(run({"--json", "--compare-schedules", "--memory-limit", between}).out)
          .at("schedules");
  int over = 0;
  for (const nlohmann::json& row : rows) {
    if (row.contains("fits")) over += row.at("fits").get<bool>() ? 0 : 1;
  }
  EXPECT_GT(over, 0);  // 1f1b itself goes over
  const RunResult bad = run({"--memory-limit", "lots"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--memory-limit lots is not a size"), std::string::npos) << bad.err;
}

}  // namespace

// Note [Node times at another shape]: a node-times file that says where it was measured plans
// another micro-batch size (scaled: twice the tokens take longer than the file's times as they
// are), and a plan of another width is refused with exit 2, naming the setting and both values.
TEST(TandemProgram, PlanScalesNodeTimesOrRefusesAnotherWidth) {
  TempDir work, capture;
  const auto file = [&](const std::string& name, int64_t hidden, bool with_shape) {
    nlohmann::json nodes = nlohmann::json::object();
    for (const char* n : {"embed", "attention", "dispatch", "experts", "combine", "loss"}) {
      nodes[n] = {{"forward", 1e-4}};
    }
    nodes["attention"] = {{"forward", 3e-4}};
    nodes["experts"] = {{"forward", 6e-4}};
    nlohmann::json j = {{"nodes", nodes}};
    if (with_shape) {
      j["measured_at"] = {{"micro-batch-size", 2},
                          {"expert-model-parallel-size", 1},
                          {"activation-bytes", 4},
                          {"model", {{"hidden-size", hidden}, {"num-experts", 8}}}};
    }
    std::ofstream(work / name) << j.dump();
    return work / name;
  };
  const auto plan = [&](const std::string& times, const std::string& micro_batch) {
    return run_tandem({"plan", "--json", "--node-times", times, "--micro-batch-size", micro_batch,
                       "--global-batch-size", "8", "--num-experts", "8"},
                      work.path(), capture.path());
  };
  const std::string same = file("same.json", 256, true), unscaled = file("bare.json", 256, false);
  const RunResult at2 = plan(same, "2"), bare2 = plan(unscaled, "2");
  const RunResult at4 = plan(same, "4"), bare4 = plan(unscaled, "4");
  for (const RunResult* r : {&at2, &bare2, &at4, &bare4}) ASSERT_EQ(r->exit_code, 0) << r->err;
  const auto step = [](const RunResult& r) {
    return nlohmann::json::parse(r.out).at("step_time_s").get<double>();
  };
  EXPECT_DOUBLE_EQ(step(at2), step(bare2));  // the measured shape: the file's times
  EXPECT_GT(step(at4), 1.2 * step(bare4));   // micro-batch 4: each node does more work
  const RunResult wide = plan(file("wide.json", 512, true), "2");
  EXPECT_EQ(wide.exit_code, 2);
  EXPECT_NE(wide.err.find("measured with --hidden-size 512; this plan has --hidden-size 256"),
            std::string::npos)
      << wide.err;
}
