// `tandem train --save/--load` and --nan-policy under mpirun, the real program. Oracles: the
// uninterrupted run of the same layout (a stopped and resumed run's last losses, gradient norms
// and saved files are bitwise equal to it); the one-rank run, which a pipeline-only layout
// matches bit for bit when clipping is off (the global norm sums in another order, and clipping
// would carry that into the weights); the exit code, message and files of a stopped run.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mpi_process.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

// A tiny MoE model; the lr schedule ends at iteration 4 whatever --train-iters says, so a
// shorter first run and its resumed continuation follow one schedule.
const std::string kModel =
    " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --num-query-groups 2"
    " --ffn-hidden-size 48 --num-experts 4 --seq-length 16 --micro-batch-size 2"
    " --global-batch-size 8 --lr-warmup-iters 2 --lr-decay-iters 4 --addition-max-digits 2"
    " --quiet";
const std::string kPp2Ep2 = " --pipeline-model-parallel-size 2 --expert-model-parallel-size 2";

std::string tandem_on(int ranks) {
  return ranks == 1 ? std::string(TANDEM_BIN) + " train"
                    : kMpirun + " -np " + std::to_string(ranks) + " " + TANDEM_BIN + " train";
}

// Whether the gradient norms of two runs are compared bit for bit: across layouts the global
// sum of squares adds the ranks' parts in another order.
enum class Norms : uint8_t { kBitwise, kRounding };

// The last `n` lines of a log equal `want`'s last `n`: losses bitwise, norms as `norms` says.
void expect_same_tail(const std::string& got_path, const std::string& want_path, size_t n,
                      Norms norms = Norms::kBitwise) {
  const auto got = json_lines(got_path), want = json_lines(want_path);
  ASSERT_EQ(got.size(), n) << got_path;
  ASSERT_GE(want.size(), n) << want_path;
  for (size_t i = 0; i < n; ++i) {
    const auto& w = want[want.size() - n + i];
    EXPECT_EQ(got[i]["iter"], w["iter"]);
    EXPECT_EQ(got[i]["loss"].get<double>(), w["loss"].get<double>()) << "iter " << w["iter"];
    const double got_norm = got[i]["grad_norm"].get<double>();
    const double want_norm = w["grad_norm"].get<double>();
    if (norms == Norms::kBitwise) {
      EXPECT_EQ(got_norm, want_norm) << "iter " << w["iter"];
    } else {
      EXPECT_NEAR(got_norm, want_norm, 1e-12 * want_norm) << "iter " << w["iter"];
    }
  }
}

void expect_same_files(const std::string& a, const std::string& b,
                       const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    EXPECT_EQ(slurp(a + "/" + f), slurp(b + "/" + f)) << a << " and " << b << ": " << f;
  }
}

const std::vector<std::string> kAllFiles = {"model.safetensors", "optimizer.safetensors",
                                            "config.json", "trainer_state.json"};

// Train 4 steps; separately 2, stop, resume (no model or optimizer option: they come from the
// checkpoint), 2 more: the last 2 losses and gradient norms and every file of iteration 4 are
// bitwise those of the uninterrupted run.
void check_exact_resume(const std::string& name, const std::string& layout) {
  const std::string dir = temp_dir(name);
  Result r = run(tandem_on(4) + kModel + layout + " --train-iters 4 --save " + dir +
                 "/full --log-json " + dir + "/full.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(tandem_on(4) + kModel + layout + " --train-iters 2 --save " + dir +
          "/ck --save-interval 1");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(tandem_on(4) + layout + " --load " + dir + "/ck --train-iters 4 --save " + dir +
          "/ck --addition-max-digits 2 --log-json " + dir + "/resumed.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir + "/ck/iter_0000002 at iteration 2 (2 optimizer"),
            std::string::npos)
      << r.output;
  expect_same_tail(dir + "/resumed.jsonl", dir + "/full.jsonl", 2);
  expect_same_files(dir + "/ck/iter_0000004", dir + "/full/iter_0000004", kAllFiles);
}

TEST(CheckpointMpi, StopAndResumeIsBitwiseUnderPp2Ep2) {
  check_exact_resume("resume_pp2ep2", kPp2Ep2 + " --schedule combined-1f1b");
}

// Note [Rebalancing experts]: the checkpoint holds each expert by its global name wherever it
// runs; the resumed run starts from the contiguous placement, measures afresh, and still follows
// the uninterrupted run bit for bit (no result depends on the placement).
TEST(CheckpointMpi, StopAndResumeIsBitwiseWithExpertsReplacedEveryStep) {
  check_exact_resume("resume_rebalance",
                     kPp2Ep2 + " --schedule combined-1f1b --rebalance-experts 1");
}

// Note [The update beside the first forward]: with --defer-optimizer each step's update runs in
// the next step's first forward; a save finishes it first. Stopped and resumed, the run follows
// its uninterrupted self bit for bit, and both follow the run that updates at each step's end:
// the same losses and norms every step, the same files at iteration 4.
TEST(CheckpointMpi, DeferredUpdateSavesAndResumesAsTheUpdateAtTheStepsEnd) {
  const std::string layout = kPp2Ep2 + " --schedule combined-1f1b";
  check_exact_resume("resume_deferred", layout + " --defer-optimizer");
  const std::string deferred = temp_path("resume_deferred");
  const std::string dir = temp_dir("deferred_plain");
  const Result r = run(tandem_on(4) + kModel + layout + " --train-iters 4 --save " + dir +
                       "/plain --log-json " + dir + "/plain.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_tail(deferred + "/full.jsonl", dir + "/plain.jsonl", 4);
  expect_same_files(deferred + "/full/iter_0000004", dir + "/plain/iter_0000004", kAllFiles);
}

// Note [Distributed optimizer]: with --use-distributed-optimizer (weights gathered beside the
// next forward) on PP2 x EP2 (two data-parallel ranks a stage, the dense weights' moments split
// over them), a stopped and resumed run is bitwise its uninterrupted self; that run's losses are
// the plain optimizer's (groups of two ranks: one order of sums) and its norms within rounding
// (Note [Norm from the parts]), and its files at iteration 4 are the plain optimizer's, byte for
// byte. Resumed on PP2 x DP2 (the experts' moments now split too), with the distributed
// optimizer, it follows the plain optimizer resumed there from the same files.
TEST(CheckpointMpi, DistributedOptimizerSavesThePlainFilesAndResumesOnAnotherLayout) {
  const std::string distributed = " --use-distributed-optimizer --overlap-param-gather";
  check_exact_resume("resume_distopt", kPp2Ep2 + distributed);
  const std::string first = temp_path("resume_distopt");
  const std::string dir = temp_dir("distopt_plain");
  Result r = run(tandem_on(4) + kModel + kPp2Ep2 + " --train-iters 4 --save " + dir +
                 "/plain --log-json " + dir + "/plain.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_tail(first + "/full.jsonl", dir + "/plain.jsonl", 4, Norms::kRounding);
  expect_same_files(first + "/full/iter_0000004", dir + "/plain/iter_0000004", kAllFiles);
  const std::string other = " --pipeline-model-parallel-size 2 --train-iters 6";
  for (const std::string& run_as : {std::string("plain"), std::string("distributed")}) {
    r = run(tandem_on(4) + other + (run_as == "plain" ? "" : distributed) + " --load " + first +
            "/full --save " + dir + "/" + run_as + "_resumed --addition-max-digits 2 --log-json " +
            dir + "/" + run_as + "_resumed.jsonl");
    ASSERT_EQ(r.code, 0) << r.output;
  }
  expect_same_tail(dir + "/distributed_resumed.jsonl", dir + "/plain_resumed.jsonl", 2,
                   Norms::kRounding);
  expect_same_files(dir + "/distributed_resumed/iter_0000006", dir + "/plain_resumed/iter_0000006",
                    kAllFiles);
}

TEST(CheckpointMpi, StopAndResumeIsBitwiseUnderDp2Pp2) {
  check_exact_resume("resume_dp2pp2", " --pipeline-model-parallel-size 2");
}

// Note [Fully parallel save]: PP2 x EP2 with the distributed optimizer, every rank writing its
// own shards (small ones: several a rank). Stopped and resumed, it is bitwise the uninterrupted
// run; its checkpoint and the one rank 0 writes alone for the same run resume on one rank to the
// same losses, norms and files, bit for bit, and on PP2 x DP2 to the same losses and norms.
TEST(CheckpointMpi, FullyParallelSaveResumesOnOtherLayoutsAsTheRankZeroSave) {
  const std::string dir = temp_dir("fully_parallel");
  const std::string layout = kPp2Ep2 + " --use-distributed-optimizer";
  const std::string parallel = " --ckpt-fully-parallel-save --max-shard-size 20KB";
  Result r = run(tandem_on(4) + kModel + layout + parallel + " --train-iters 4 --save " + dir +
                 "/full --log-json " + dir + "/full.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(tandem_on(4) + kModel + layout + parallel + " --train-iters 2 --save " + dir + "/ck");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::is_regular_file(dir + "/ck/iter_0000002/model.safetensors.index.json"));
  EXPECT_TRUE(fs::is_regular_file(dir + "/ck/iter_0000002/optimizer.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/ck/iter_0000002/model.safetensors"));
  r = run(tandem_on(4) + layout + parallel + " --load " + dir + "/ck --train-iters 4 --save " +
          dir + "/ck --addition-max-digits 2 --log-json " + dir + "/resumed.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_tail(dir + "/resumed.jsonl", dir + "/full.jsonl", 2);
  r = run(tandem_on(4) + kModel + layout + " --train-iters 2 --save " + dir + "/rank0");
  ASSERT_EQ(r.code, 0) << r.output;

  const std::string resume = " --train-iters 4 --addition-max-digits 2 --quiet";
  for (const std::string& from : {std::string("ck"), std::string("rank0")}) {
    r = run(tandem_on(1) + " --load " + dir + "/" + from + "/iter_0000002 --save " + dir + "/" +
            from + "_one" + resume + " --log-json " + dir + "/" + from + "_one.jsonl");
    ASSERT_EQ(r.code, 0) << r.output;
    r = run(tandem_on(4) + " --pipeline-model-parallel-size 2" + (from == "ck" ? parallel : "") +
            " --load " + dir + "/" + from + "/iter_0000002 --save " + dir + "/" + from + "_dp2" +
            resume + " --log-json " + dir + "/" + from + "_dp2.jsonl");
    ASSERT_EQ(r.code, 0) << r.output;
  }
  expect_same_tail(dir + "/ck_one.jsonl", dir + "/rank0_one.jsonl", 2);
  expect_same_files(dir + "/ck_one/iter_0000004", dir + "/rank0_one/iter_0000004", kAllFiles);
  expect_same_tail(dir + "/ck_dp2.jsonl", dir + "/rank0_dp2.jsonl", 2);
}

// A fully parallel save that fails on rank 1 (the test hook, after it wrote its weights) stops
// the run with exit code 2 and that rank's message, and leaves nothing under --save: no
// iteration directory, no `latest`, no staging directory.
TEST(CheckpointMpi, FullyParallelSaveFailingOnOneRankStopsTheRunAndCommitsNothing) {
  const std::string dir = temp_dir("fully_parallel_fault");
  const Result r =
      run("TANDEM_TEST_SAVE_FAIL_RANK=1 " + kMpirun + " -x TANDEM_TEST_SAVE_FAIL_RANK -np 2 " +
          TANDEM_BIN + " train" + kModel +
          " --pipeline-model-parallel-size 2 --train-iters 1 --ckpt-fully-parallel-save"
          " --save " +
          dir + "/ck");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("tandem-test: rank 1 failed to write its shards"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::is_directory(dir + "/ck"));
  EXPECT_TRUE(fs::is_empty(dir + "/ck"));
}

// A checkpoint moves between layouts. With clipping off a pipeline-only layout of an untied model
// is bitwise the one-rank run, so: PP2's checkpoint is byte for byte one rank's; 1 rank -> PP2 and
// PP2 -> 1 rank continue bitwise as the uninterrupted one-rank run; 1 rank -> PP2 x EP2 on 4 ranks
// continues within fp32 rounding (its expert products sum in another order). Tied
// (Note [Tied embeddings] in model/parameters.h), one rank's checkpoint moves to PP2, whose last
// stage loads its copy of the table from it, and continues within fp32 rounding (the table's two
// gradients are summed in another order).
TEST(CheckpointMpi, CheckpointsMoveBetweenLayouts) {
  const std::string dir = temp_dir("layouts");
  const std::string model = kModel + " --clip-grad 0 --untie-embeddings-and-output-weights";
  const std::string resume = " --train-iters 4 --addition-max-digits 2 --quiet --log-json ";
  Result r = run(tandem_on(1) + model + " --train-iters 4 --save " + dir + "/one_full" +
                 " --log-json " + dir + "/one_full.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(tandem_on(1) + model + " --train-iters 2 --save " + dir + "/one");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(tandem_on(2) + model + " --pipeline-model-parallel-size 2 --train-iters 2 --save " + dir +
          "/pp2");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_files(dir + "/pp2/iter_0000002", dir + "/one/iter_0000002", kAllFiles);

  r = run(tandem_on(2) + " --pipeline-model-parallel-size 2 --load " + dir + "/one --save " + dir +
          "/one_to_pp2" + resume + dir + "/one_to_pp2.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_tail(dir + "/one_to_pp2.jsonl", dir + "/one_full.jsonl", 2, Norms::kRounding);
  expect_same_files(dir + "/one_to_pp2/iter_0000004", dir + "/one_full/iter_0000004", kAllFiles);

  r = run(tandem_on(1) + " --load " + dir + "/pp2 --save " + dir + "/pp2_to_one" + resume + dir +
          "/pp2_to_one.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_tail(dir + "/pp2_to_one.jsonl", dir + "/one_full.jsonl", 2);
  expect_same_files(dir + "/pp2_to_one/iter_0000004", dir + "/one_full/iter_0000004", kAllFiles);

  r = run(tandem_on(4) + kPp2Ep2 + " --load " + dir + "/one" + resume + dir + "/one_to_4.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto near_tail = [&](const std::string& got_path, const std::string& want_path) {
    const auto got = json_lines(got_path), want = json_lines(want_path);
    ASSERT_EQ(got.size(), 2u) << got_path;
    for (size_t i = 0; i < 2; ++i) {
      const double w = want[2 + i]["loss"].get<double>();
      EXPECT_NEAR(got[i]["loss"].get<double>(), w, 1e-5 * w) << got_path << " iter " << 3 + i;
    }
  };
  near_tail(dir + "/one_to_4.jsonl", dir + "/one_full.jsonl");

  const std::string tied = kModel + " --clip-grad 0";
  r = run(tandem_on(1) + tied + " --train-iters 4 --log-json " + dir + "/tied_full.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(tandem_on(1) + tied + " --train-iters 2 --save " + dir + "/tied");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(tandem_on(2) + " --pipeline-model-parallel-size 2 --load " + dir + "/tied" + resume +
          dir + "/tied_to_pp2.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  near_tail(dir + "/tied_to_pp2.jsonl", dir + "/tied_full.jsonl");
}

// TANDEM_FAULT=...,mode=nan poisons one gradient on rank 1 after step 3's reduction. Under PP2
// (stop) rank 1 holds the last stage; under DP2 (skip) its copy of the dense gradients is one
// the global norm does not count, so only the all-reduced finite flag makes rank 0 see it.
TEST(CheckpointMpi, NanPolicyIsEveryRanksDecision) {
  const std::string dir = temp_dir("nan");
  const std::string fault = "TANDEM_FAULT=rank=1,iter=3,mode=nan ";
  Result r = run(fault + kMpirun + " -x TANDEM_FAULT -np 2 " + TANDEM_BIN + " train" + kModel +
                 " --pipeline-model-parallel-size 2 --train-iters 4 --save " + dir +
                 "/stop --save-interval 2 --log-json " + dir + "/stop.jsonl");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("iteration 3: the gradients are not finite"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--nan-policy skip"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(dir + "/stop/latest"), "iter_0000002\n");
  EXPECT_FALSE(fs::exists(dir + "/stop/iter_0000003"));
  EXPECT_EQ(json_lines(dir + "/stop.jsonl").size(), 2u);

  r = run(fault + kMpirun + " -x TANDEM_FAULT -np 2 " + TANDEM_BIN + " train" + kModel +
          " --train-iters 4 --nan-policy skip --save " + dir + "/skip --log-json " + dir +
          "/skip.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto lines = json_lines(dir + "/skip.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(lines[i]["skipped"], i == 2) << "iteration " << i + 1;
  EXPECT_TRUE(lines[2]["grad_norm"].is_null());
  const auto state = nlohmann::json::parse(slurp(dir + "/skip/iter_0000004/trainer_state.json"));
  EXPECT_EQ(state["iteration"], 4);
  EXPECT_EQ(state["optimizer_steps"], 3);
}

// Rank 0's save fails (a directory is in the way of `latest`) after writing for longer than
// --comm-timeout: the other rank waits for it without timing out (Note [Saving on rank 0]) and
// the run stops with exit code 2 and rank 0's message; the committed iteration stays.
TEST(CheckpointMpi, FailedSaveOnRankZeroStopsTheRunWithItsMessage) {
  const std::string dir = temp_dir("failed_save");
  fs::create_directories(dir + "/ck/latest/in_the_way");
  const Result r =
      run("TANDEM_TEST_SAVE_DELAY_MS=2000 TANDEM_TEST_SAVE_DELAY_STAGE=latest " + kMpirun +
          " -x TANDEM_TEST_SAVE_DELAY_MS -x TANDEM_TEST_SAVE_DELAY_STAGE -np 2 " + TANDEM_BIN +
          " train" + kModel + " --pipeline-model-parallel-size 2 --train-iters 1 --comm-timeout 1" +
          " --save " + dir + "/ck");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("tandem: error: cannot rename"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("did not complete within"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_regular_file(dir + "/ck/iter_0000001/model.safetensors"));
}

}  // namespace
}  // namespace tandem::test
