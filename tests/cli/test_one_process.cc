// `tandem train` in one process without mpirun runs the same trainer and loop as under mpirun, so
// every option means the same there: --schedule (and --virtual-pipeline-model-parallel-size),
// --defer-optimizer, --routing-out and --node-times-out. Oracles: the reference trainer
// (runtime::ReferenceTrainer, the sequential step the one process used to run) on the same
// options, in this process; `mpirun -np 1` of the same command line (the same losses, bit for
// bit, and the same routing file); for --node-times-out on the CPU, the same refusal under
// mpirun.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/options.h"
#include "common/reference_trainer.h"
#include "data/addition.h"
#include "dist/mpi_process.h"
#include "schedule/routing_file.h"

namespace tandem::test {
namespace {

// Untied: the reference ties the output layer its own way, adding the table's two gradients in
// another order (Note [Tying in the reference] in tests/common/reference_trainer.cc), so a tied f32
// curve agrees with it to rounding, not bit for bit (tests/dist compares tied runs in f64).
std::vector<std::string> untied(std::vector<std::string> args) {
  args.push_back("--untie-embeddings-and-output-weights");
  return args;
}
const std::vector<std::string> kModel =
    untied({"--num-layers",          "4",  "--hidden-size",      "32", "--num-attention-heads", "4",
            "--num-query-groups",    "2",  "--ffn-hidden-size",  "48", "--num-experts",         "4",
            "--seq-length",          "32", "--micro-batch-size", "2",  "--global-batch-size",   "8",
            "--addition-max-digits", "2",  "--train-iters",      "4"});

std::string joined(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += " " + a;
  return out;
}

// `tandem train` with kModel and `more`, in one process or under `mpirun -np 1`.
Result train(const std::vector<std::string>& more, bool mpirun = false) {
  const std::string command = std::string(TANDEM_BIN) + " train" + joined(kModel) + joined(more);
  return run(mpirun ? kMpirun + " -np 1 " + command : command);
}

std::vector<double> losses(const std::string& log) {
  std::vector<double> out;
  for (const auto& j : json_lines(log)) out.push_back(j.at("loss").get<double>());
  return out;
}

// The loss curve of the reference trainer on kModel's options (the built-in addition task).
std::vector<double> reference_losses() {
  CLI::App app{"tandem test"};
  cli::RunOptions o;
  cli::add_run_options(app, o);
  std::vector<const char*> argv = {"tandem"};
  for (const std::string& a : kModel) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  cli::finalize_run_options(app, o);
  const data::AdditionDataset data(o.train.seed, static_cast<int>(o.addition_max_digits));
  runtime::ReferenceTrainer trainer(o.model, o.train, data);
  std::vector<double> out;
  for (int64_t i = 0; i < o.train.train_iters; ++i) out.push_back(trainer.step().loss);
  return out;
}

void expect_same_curve(const std::vector<double>& got, const std::vector<double>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-12 * std::abs(want[i])) << what << ", step " << i + 1;
  }
}

// The plain run trains as the reference trainer did, and as mpirun -np 1 does, bit for bit.
TEST(OneProcess, TrainsAsTheReferenceAndAsMpirunWithOneRank) {
  const std::string dir = temp_dir("one_process_plain");
  const Result one = train({"--quiet", "--log-json", dir + "/one.jsonl"});
  ASSERT_EQ(one.code, 0) << one.output;
  const Result mpi = train({"--quiet", "--log-json", dir + "/mpi.jsonl"}, /*mpirun=*/true);
  ASSERT_EQ(mpi.code, 0) << mpi.output;
  const std::vector<double> curve = losses(dir + "/one.jsonl");
  expect_same_curve(curve, reference_losses(), "against the reference trainer");
  EXPECT_EQ(curve, losses(dir + "/mpi.jsonl"));
}

// --schedule and --virtual-pipeline-model-parallel-size are honoured without mpirun (the run
// says which schedule it ran) and train as the plain run, as every schedule must.
TEST(OneProcess, TakesTheScheduleAndVirtualStages) {
  const std::string dir = temp_dir("one_process_schedule");
  ASSERT_EQ(train({"--quiet", "--log-json", dir + "/plain.jsonl"}).code, 0);
  const std::vector<double> plain = losses(dir + "/plain.jsonl");
  const std::vector<std::vector<std::string>> schedules = {
      {"--schedule", "combined-1f1b"},
      {"--schedule", "combined-1f1b", "--pair-first-forwards"},
      {"--schedule", "interleaved-1f1b", "--virtual-pipeline-model-parallel-size", "2"},
      {"--schedule", "zb-h1"}};
  for (const std::vector<std::string>& schedule : schedules) {
    std::vector<std::string> args = schedule;
    args.insert(args.end(), {"--log-interval", "4", "--log-json", dir + "/s.jsonl"});
    const Result r = train(args);
    ASSERT_EQ(r.code, 0) << joined(schedule) << "\n" << r.output;
    EXPECT_NE(r.output.find("; schedule " + schedule[1]), std::string::npos) << r.output;
    expect_same_curve(losses(dir + "/s.jsonl"), plain, joined(schedule));
  }
}

// --defer-optimizer moves each step's update into the next step's first forward: accepted
// without mpirun, the same values.
TEST(OneProcess, DefersTheOptimizerUpdate) {
  const std::string dir = temp_dir("one_process_defer");
  ASSERT_EQ(train({"--quiet", "--log-json", dir + "/plain.jsonl"}).code, 0);
  const Result r = train({"--log-json", dir + "/deferred.jsonl", "--defer-optimizer", "--schedule",
                          "combined-1f1b", "--log-interval", "4"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(--defer-optimizer)"), std::string::npos) << r.output;
  EXPECT_EQ(losses(dir + "/deferred.jsonl"), losses(dir + "/plain.jsonl"));
}

// --routing-out writes the last step's routing without mpirun, the file mpirun -np 1 writes.
TEST(OneProcess, WritesTheRoutingAsMpirunDoes) {
  const std::string dir = temp_dir("one_process_routing");
  const Result one = train({"--quiet", "--routing-out", dir + "/one.json"});
  ASSERT_EQ(one.code, 0) << one.output;
  const Result mpi = train({"--quiet", "--routing-out", dir + "/mpi.json"}, /*mpirun=*/true);
  ASSERT_EQ(mpi.code, 0) << mpi.output;
  const std::string text = slurp(dir + "/one.json");
  const schedule::RoutingCounts table = schedule::parse_routing_file(text, "one.json", 0);
  EXPECT_EQ(table.num_layers, 4);
  EXPECT_EQ(table.num_microbatches, 4);
  EXPECT_EQ(text, slurp(dir + "/mpi.json"));
}

// --node-times-out is measured with CUDA events: on the CPU it is refused alike with and without
// mpirun, before anything is written.
TEST(OneProcess, RefusesNodeTimesOnTheCpuAsMpirunDoes) {
  const std::string dir = temp_dir("one_process_node_times");
  const std::vector<std::string> args = {"--quiet", "--node-times-out", dir + "/nodes.json"};
  const Result one = train(args), mpi = train(args, /*mpirun=*/true);
  EXPECT_EQ(one.code, 2) << one.output;
  EXPECT_NE(one.output.find("--device cuda"), std::string::npos) << one.output;
  EXPECT_NE(mpi.code, 0) << mpi.output;
  const std::string message = one.output.substr(0, one.output.find('\n'));
  EXPECT_NE(mpi.output.find(message), std::string::npos) << mpi.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/nodes.json"));
}

}  // namespace
}  // namespace tandem::test
