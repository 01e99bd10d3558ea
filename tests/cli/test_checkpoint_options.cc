// Options a --load checkpoint fixes (Note [Options from a checkpoint]), --nan-policy and
// --keep-checkpoints, parsed in-process with a stand-in checkpoint reader. Oracle: the values
// the reader returned, the command line's and the config file's, and which one the note says
// wins; for conflicts, a message naming the option and both values.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/options.h"
#include "core/error.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

// A stand-in checkpoint: 2 layers, hidden 64, seed 7 (fixed); lr 0.5 (default).
nlohmann::json fake_checkpoint(const std::string& /*load_dir*/) {
  return {{"fixed", {{"num-layers", 2}, {"hidden-size", 64}, {"seed", 7}}},
          {"defaults", {{"lr", 0.5}, {"nan-policy", "skip"}}}};
}

RunOptions parse(const std::vector<std::string>& args) {
  CLI::App app{"tandem test"};
  RunOptions opts;
  add_run_options(app, opts);
  std::vector<const char*> argv = {"tandem"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  finalize_run_options(app, opts, fake_checkpoint);
  return opts;
}

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string load_dir() { return fs::temp_directory_path().string(); }  // readable; not read

// Note [Tensor parallelism] (core/config_tp.cc): a checkpoint holds whole tensors, which a run at
// TP > 1 does not split yet: refused by name.
TEST(CheckpointOptions, TensorParallelLoadIsRefusedByName) {
  const std::string e =
      error_of({"--load", load_dir(), "--num-experts", "0", "--tensor-model-parallel-size", "2"});
  EXPECT_NE(
      e.find("--tensor-model-parallel-size 2 with --load " + load_dir() + " is not built yet"),
      std::string::npos)
      << e;
  EXPECT_EQ(error_of({"--load", load_dir(), "--num-experts", "0"}), "");
}

TEST(CheckpointOptions, AbsentOptionsComeFromTheCheckpoint) {
  const RunOptions o = parse({"--load", load_dir()});
  EXPECT_EQ(o.model.num_layers, 2);
  EXPECT_EQ(o.model.hidden_size, 64);
  EXPECT_EQ(o.train.seed, 7u);
  EXPECT_EQ(o.train.lr, 0.5);
  EXPECT_EQ(o.train.non_finite_policy, NonFinitePolicy::kSkip);
  EXPECT_EQ(o.model.num_experts, 0);  // not in the checkpoint: the default stays
}

TEST(CheckpointOptions, WithoutLoadNothingIsRead) {
  const RunOptions o = parse({});
  EXPECT_EQ(o.model.num_layers, 4);
  EXPECT_EQ(o.train.lr, 3e-3);
  EXPECT_EQ(o.train.non_finite_policy, NonFinitePolicy::kStop);
}

TEST(CheckpointOptions, GivenValuesWinOverDefaultsAndMustEqualFixedOnes) {
  const RunOptions o =
      parse({"--load", load_dir(), "--lr", "0.25", "--num-layers", "2", "--nan-policy", "stop"});
  EXPECT_EQ(o.train.lr, 0.25);
  EXPECT_EQ(o.model.num_layers, 2);
  EXPECT_EQ(o.train.non_finite_policy, NonFinitePolicy::kStop);
  const std::string err = error_of({"--load", load_dir(), "--num-layers", "3"});
  EXPECT_NE(err.find("--num-layers 3 (given on the command line) differs from the checkpoint's "
                     "num-layers 2"),
            std::string::npos)
      << err;
  EXPECT_NE(error_of({"--load", load_dir(), "--seed", "8"}).find("checkpoint's seed 7"),
            std::string::npos);
}

TEST(CheckpointOptions, ConfigFileConflictNamesFileAndLine) {
  const std::string dir = fs::temp_directory_path() / "tandem_ckpt_opts_XXXXXX";
  std::string pattern = dir;
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string toml = pattern + "/run.toml";
  std::ofstream(toml) << "lr = 0.1\nhidden-size = 32\n";
  const std::string err = error_of({"--load", load_dir(), "--config", toml});
  fs::remove_all(pattern);
  EXPECT_NE(err.find("--hidden-size 32 (given in " + toml + ", line 2)"), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint's hidden-size 64"), std::string::npos) << err;
}

TEST(CheckpointOptions, PolicyAndRetentionOptions) {
  EXPECT_EQ(parse({"--nan-policy", "skip"}).train.non_finite_policy, NonFinitePolicy::kSkip);
  EXPECT_EQ(parse({}).keep_checkpoints, 0);  // every checkpoint kept, as Megatron-LM does
  EXPECT_EQ(parse({"--keep-checkpoints", "5"}).keep_checkpoints, 5);
  EXPECT_THROW(parse({"--keep-checkpoints", "-1"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--nan-policy", "ignore"}), Error);
}

// Megatron-LM's names of settings tandem holds under its own, and a run by samples.
TEST(CheckpointOptions, MegatronNamesSetTandemsSettings) {
  EXPECT_EQ(parse({"--distributed-timeout-minutes", "3"}).parallel.comm_timeout_s, 180.0);
  EXPECT_EQ(parse({"--distributed-timeout-minutes", "3", "--comm-timeout", "180"})
                .parallel.comm_timeout_s,
            180.0);
  EXPECT_NE(error_of({"--distributed-timeout-minutes", "3", "--comm-timeout", "60"})
                .find("--distributed-timeout-minutes 3 and --comm-timeout 60 disagree"),
            std::string::npos);
  EXPECT_EQ(parse({"--no-check-for-nan-in-loss-and-grad"}).train.non_finite_policy,
            NonFinitePolicy::kContinue);
  EXPECT_EQ(parse({"--no-check-for-nan-in-loss-and-grad", "--nan-policy", "continue"})
                .train.non_finite_policy,
            NonFinitePolicy::kContinue);
  EXPECT_NE(error_of({"--no-check-for-nan-in-loss-and-grad", "--nan-policy", "skip"})
                .find("--nan-policy skip disagree"),
            std::string::npos);
  // 100 samples of 16 a step: 6 steps, the last 4 samples unused (Megatron's floor).
  const RunOptions by_samples =
      parse({"--train-samples", "100", "--micro-batch-size", "4", "--global-batch-size", "16"});
  EXPECT_EQ(by_samples.train.train_iters, 6);
  EXPECT_NE(error_of({"--train-samples", "100", "--train-iters", "6"})
                .find("--train-samples 100 and --train-iters 6 both set the run's length"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::cli
