// The tandem program under mpirun. Oracles: the one-rank run's loss curve (the same global batch
// on one rank), and for faults the exit status, the time taken and the message.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mpi_process.h"

namespace {

using tandem::test::kMpirun;
using tandem::test::Result;
using tandem::test::run;
using tandem::test::temp_dir;

const std::string kModel =
    " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --num-query-groups 2 "
    "--ffn-hidden-size 48 --num-experts 4 --seq-length 32 --micro-batch-size 2 "
    "--global-batch-size 16 --addition-max-digits 2 --quiet";

std::vector<double> losses(const std::string& path) {
  std::vector<double> out;
  for (const auto& j : tandem::test::json_lines(path)) out.push_back(j.at("loss").get<double>());
  return out;
}

// The validation losses of a --log-json file, in order.
std::vector<double> valid_losses(const std::string& path) {
  std::vector<double> out;
  for (const auto& j : tandem::test::json_lines(path)) {
    if (j.contains("valid_loss")) out.push_back(j.at("valid_loss").get<double>());
  }
  return out;
}

TEST(TandemMpi, FourRanksPp2Ep2CombinedMatchesOneRank) {
  const std::string dir = temp_dir("curve");
  const Result one = run(std::string(TANDEM_BIN) + " train" + kModel +
                         " --train-iters 6 --log-json " + dir + "/one.jsonl");
  ASSERT_EQ(one.code, 0) << one.output;
  const Result four =
      run(kMpirun + " -np 4 " + TANDEM_BIN + " train" + kModel +
          " --train-iters 6 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2"
          " --schedule combined-1f1b --log-json " +
          dir + "/four.jsonl");
  ASSERT_EQ(four.code, 0) << four.output;
  const std::vector<double> a = losses(dir + "/one.jsonl"), b = losses(dir + "/four.jsonl");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
  // Per-rank memory is a list with one entry per rank.
  std::ifstream in(dir + "/four.jsonl");
  std::string line;
  std::getline(in, line);
  const auto j = nlohmann::json::parse(line);
  ASSERT_TRUE(j.at("mem_peak_bytes").is_array());
  EXPECT_EQ(j.at("mem_peak_bytes").size(), 4u);
  EXPECT_EQ(j.at("activation_peak_bytes").size(), 4u);
}

// Note [Tensor parallelism] (core/config_tp.cc): the dense model at TP 2 x DP 2 on four ranks
// trains and validates as one process does (f32: within 1e-5 a step), and the run says its
// layout.
TEST(TandemMpi, FourRanksTp2Dp2DenseMatchesOneRank) {
  const std::string dir = temp_dir("tp_curve");
  const std::string dense =
      kModel + " --num-experts 0 --train-iters 6 --eval-interval 3 --eval-iters 2 --log-json ";
  const Result one = run(std::string(TANDEM_BIN) + " train" + dense + dir + "/one.jsonl");
  ASSERT_EQ(one.code, 0) << one.output;
  std::string loud = dense;
  loud.erase(loud.find(" --quiet"), 8);  // the summary line
  const Result four = run(kMpirun + " -np 4 " + TANDEM_BIN + " train" + loud + dir +
                          "/four.jsonl --tensor-model-parallel-size 2");
  ASSERT_EQ(four.code, 0) << four.output;
  EXPECT_NE(four.output.find("4 ranks (tensor 2, pipeline 1, data 2, expert 1)"), std::string::npos)
      << four.output;
  const std::vector<double> a = losses(dir + "/one.jsonl"), b = losses(dir + "/four.jsonl");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
  const std::vector<double> va = valid_losses(dir + "/one.jsonl"),
                            vb = valid_losses(dir + "/four.jsonl");
  ASSERT_EQ(va.size(), 2u);
  ASSERT_EQ(vb.size(), 2u);
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_NEAR(vb[i], va[i], 1e-5 * va[i]) << "validation " << i;
  }
}

// Note [Rebalancing experts]: the run says when it re-placed experts, on a line of its own and
// in the JSON line of that step, and trains as the run that never moves them.
TEST(TandemMpi, RebalancedExpertsAreReportedAndTrainAsTheStayingOnes) {
  const std::string dir = temp_dir("rebalance");
  std::string ep = kModel +
                   " --train-iters 4 --expert-model-parallel-size 2"
                   " --schedule combined-1f1b --log-json ";
  ep.erase(ep.find(" --quiet"), 8);  // the log lines, with the note's
  const Result moving = run(kMpirun + " -np 2 " + TANDEM_BIN + " train" + ep + dir +
                            "/moving.jsonl --rebalance-experts 1");
  ASSERT_EQ(moving.code, 0) << moving.output;
  EXPECT_NE(moving.output.find(": experts re-placed in "), std::string::npos) << moving.output;
  const Result staying = run(kMpirun + " -np 2 " + TANDEM_BIN + " train" + ep + dir +
                             "/staying.jsonl --rebalance-experts 100");
  ASSERT_EQ(staying.code, 0) << staying.output;
  EXPECT_EQ(losses(dir + "/moving.jsonl"), losses(dir + "/staying.jsonl"));
  int notes = 0;
  for (const auto& j : tandem::test::json_lines(dir + "/moving.jsonl")) {
    // How unevenly the rows fell (schedule::expert_rows_spread): 1 is even.
    const auto& spread = j.at("expert_rows_max_over_mean");
    EXPECT_GE(spread.at("step").get<double>(), 1.0);
    EXPECT_GE(spread.at("microbatch_median").get<double>(), 1.0);
    EXPECT_GE(spread.at("microbatch_max").get<double>(), spread.at("microbatch_median"));
    EXPECT_LE(spread.at("microbatch_max").get<double>(), 2.0);  // 2 ranks: at most all rows
    if (!j.contains("note")) continue;
    ++notes;
    EXPECT_NE(j.at("note").get<std::string>().find("experts re-placed in "), std::string::npos)
        << j.dump();
  }
  EXPECT_GT(notes, 0) << "no step re-placed an expert: the test shows nothing";
  for (const auto& j : tandem::test::json_lines(dir + "/staying.jsonl")) {
    EXPECT_FALSE(j.contains("note")) << j.dump();
  }
}

TEST(TandemMpi, CombinedStepWritesTheMeasuredTimelineAndExposedAllToAll) {
  const std::string dir = temp_dir("trace");
  const Result r = run(kMpirun + " -np 2 " + TANDEM_BIN + " train" + kModel +
                       " --train-iters 2 --expert-model-parallel-size 2 --schedule combined-1f1b"
                       " --trace " +
                       dir + "/t.json --log-json " + dir + "/log.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream f(dir + "/t.json");
  const auto trace = nlohmann::json::parse(f);
  int comm_spans = 0, compute_spans = 0, counters = 0;
  std::set<int> ranks;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "C") ++counters;
    if (e.at("ph") != "X") continue;
    ranks.insert(e.at("pid").get<int>());
    const std::string name = e.at("name");
    if (e.at("tid") == 1) {
      ++comm_spans;
      EXPECT_TRUE(name.find("dispatch") != std::string::npos ||
                  name.find("combine") != std::string::npos ||
                  name.find("SEND") != std::string::npos || name.find("RECV") != std::string::npos)
          << name;
    } else {
      ++compute_spans;
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  EXPECT_GT(comm_spans, 0);
  EXPECT_GT(compute_spans, 0);
  EXPECT_GT(counters, 0);
  std::ifstream log(dir + "/log.jsonl");
  std::string line, last;
  while (std::getline(log, line)) last = line;
  const auto j = nlohmann::json::parse(last);
  EXPECT_GT(j.at("alltoall_s").get<double>(), 0);
  EXPECT_GE(j.at("exposed_alltoall_s").get<double>(), 0);
  EXPECT_LE(j.at("exposed_alltoall_s").get<double>(), j.at("step_seconds").get<double>());
  // Every rank's figures, rank 0's the same as the scalars.
  const auto busy = j.at("alltoall_s_by_rank"), exposed = j.at("exposed_alltoall_s_by_rank");
  ASSERT_EQ(busy.size(), 2u);
  ASSERT_EQ(exposed.size(), 2u);
  EXPECT_EQ(busy[0].get<double>(), j.at("alltoall_s").get<double>());
  EXPECT_EQ(exposed[0].get<double>(), j.at("exposed_alltoall_s").get<double>());
  for (size_t p = 0; p < 2; ++p) {
    EXPECT_GT(busy[p].get<double>(), 0) << "rank " << p;
    EXPECT_GE(exposed[p].get<double>(), 0) << "rank " << p;
  }
}

// --routing-out writes each rank's measured routing, and `tandem plan --routing` planned with a
// rank's table predicts that rank's measured activation peak to the byte (the memory-truth
// test's claim, end to end through the files); the balanced plan does not.
TEST(TandemMpi, PlanWithTheMeasuredRoutingPredictsEachRanksActivationPeak) {
  const std::string dir = temp_dir("routing");
  const std::string ep = " --expert-model-parallel-size 2 --schedule 1f1b";
  const Result r =
      run(kMpirun + " -np 2 " + TANDEM_BIN + " train" + kModel + ep +
          " --train-iters 2 --routing-out " + dir + "/r.json --log-json " + dir + "/log.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json last = tandem::test::json_lines(dir + "/log.jsonl").back();
  auto plan_rank = [&](const std::string& extra) {
    const Result p = run(std::string(TANDEM_BIN) + " plan" + kModel + ep +
                         " --num-microbatches 4 --json" + extra);
    EXPECT_EQ(p.code, 0) << p.output;
    const size_t brace = p.output.find('{');
    return nlohmann::json::parse(p.output.substr(brace)).at("ranks")[0];
  };
  auto peak = [](const nlohmann::json& rank) {
    return rank.at("activation_peak_bytes").get<int64_t>();
  };
  auto waiting = [](const nlohmann::json& rank) {
    return rank.at("exposed_alltoall_waiting_s").get<double>();
  };
  const nlohmann::json balanced = plan_rank("");
  EXPECT_EQ(waiting(balanced), 0);  // balanced routing: no rank waits for another
  bool balanced_missed = false;
  double most_waiting = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t measured = last.at("activation_peak_bytes")[rank].get<int64_t>();
    const nlohmann::json mine =
        plan_rank(" --routing " + dir + "/r.json --routing-rank " + std::to_string(rank));
    EXPECT_EQ(peak(mine), measured) << "rank " << rank;
    balanced_missed = balanced_missed || peak(balanced) != measured;
    // Note [Slowest expert rank]: the waits are part of the exposed all-to-all.
    EXPECT_GE(waiting(mine), 0) << "rank " << rank;
    EXPECT_LE(waiting(mine), mine.at("exposed_alltoall_s").get<double>()) << "rank " << rank;
    most_waiting = std::max(most_waiting, waiting(mine));
  }
  EXPECT_TRUE(balanced_missed) << "the routing was balanced: the test shows nothing";
  EXPECT_GT(most_waiting, 0) << "uneven routing, yet the faster rank waits for nobody";
  const Result missing = run(std::string(TANDEM_BIN) + " plan" + kModel + ep +
                             " --num-microbatches 4 --routing " + dir + "/r.json --routing-rank 7");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.output.find("no table for rank 7"), std::string::npos) << missing.output;
}

// --moe-router-force-load-balancing's random logits spread the rows about evenly; padded to a
// capacity of ceil(N k / E) (Note [Expert capacity] in core/footprint.h) every expert receives
// exactly that many from each rank, so the planner's model (no --routing) predicts each rank's
// measured activation peak to the byte.
TEST(TandemMpi, ForcedBalancedRoutingMatchesTheBalancedPlan) {
  const std::string dir = temp_dir("balanced");
  const std::string ep =
      " --expert-model-parallel-size 2 --schedule 1f1b --moe-expert-capacity-factor 1 "
      "--moe-pad-expert-input-to-capacity";
  const Result r =
      run(kMpirun + " -np 2 " + TANDEM_BIN + " train" + kModel + ep +
          " --moe-router-force-load-balancing --train-iters 2 --log-json " + dir + "/log.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json last = tandem::test::json_lines(dir + "/log.jsonl").back();
  const Result p =
      run(std::string(TANDEM_BIN) + " plan" + kModel + ep + " --num-microbatches 4 --json");
  ASSERT_EQ(p.code, 0) << p.output;
  const int64_t planned = nlohmann::json::parse(p.output.substr(p.output.find('{')))
                              .at("ranks")[0]
                              .at("activation_peak_bytes")
                              .get<int64_t>();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(last.at("activation_peak_bytes")[rank].get<int64_t>(), planned) << "rank " << rank;
    // The run's own plan, made before its first step (plan_training_run), says the same.
    EXPECT_EQ(last.at("planned_activation_peak_bytes")[rank].get<int64_t>(), planned)
        << "rank " << rank;
  }
}

// Each rank's whole peak (the allocator's over the step: weights' state, activations, tokens and
// the nodes' op temporaries) is the one the run planned before its first step, to the byte
// (docs/memory.md, "Planned and measured"), with two data-parallel ranks, with and without the
// distributed optimizer, two tensor-parallel ranks of the dense model (Note [Tensor parallelism]
// in core/config_tp.cc), two pipeline ranks under 1F1B (8 KiB messages, past MPI's eager limit:
// Note [Send buffers released when known delivered] in schedule/send_release.cc), and two
// expert ranks under 1F1B and zb-h1 with the routing forced balanced and padded to the capacity
// (the planner's balanced rows are then the rows the experts receive: Note [Expert capacity] in
// core/footprint.h); and the summary says so. tests/dist/test_whole_peak.cc checks more
// schedules and layouts without the program.
TEST(TandemMpi, EachRanksWholePeakIsThePlannedOne) {
  const std::string dir = temp_dir("whole_peak");
  const std::pair<const char*, const char*> layouts[] = {
      {"dp2", ""},
      {"dp2_distopt", " --use-distributed-optimizer"},
      // Note [Tensor parallelism]: each rank's shard of the dense model, planned as that model.
      {"tp2", " --num-experts 0 --tensor-model-parallel-size 2"},
      {"pp2", " --pipeline-model-parallel-size 2 --schedule 1f1b"},
      {"ep2",
       " --expert-model-parallel-size 2 --schedule 1f1b --moe-expert-capacity-factor 1"
       " --moe-pad-expert-input-to-capacity --moe-router-force-load-balancing"},
      {"ep2_zb",
       " --expert-model-parallel-size 2 --schedule zb-h1 --moe-expert-capacity-factor 1"
       " --moe-pad-expert-input-to-capacity --moe-router-force-load-balancing"}};
  for (const auto& [name, options] : layouts) {
    const std::string log = dir + "/" + name + ".jsonl";
    std::string model = kModel;
    model.erase(model.find(" --quiet"), 8);  // the summary line
    const Result r = run(kMpirun + " -np 2 " + TANDEM_BIN + " train" + model + options +
                         " --train-iters 2 --log-json " + log);
    ASSERT_EQ(r.code, 0) << name << "\n" << r.output;
    const nlohmann::json last = tandem::test::json_lines(log).back();
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(last.at("mem_peak_bytes")[rank], last.at("planned_peak_bytes")[rank])
          << name << " rank " << rank;
    }
    EXPECT_NE(r.output.find(", the same to the byte)"), std::string::npos) << name << "\n"
                                                                           << r.output;
  }
}

// `tandem train` of kModel for 4 steps on `ranks` ranks with TANDEM_FAULT=`fault`; it must fail
// within a minute.
Result run_faulty(const std::string& fault, int ranks, const std::string& options) {
  const Result r = run("TANDEM_FAULT=" + fault + " " + kMpirun + " -x TANDEM_FAULT -np " +
                       std::to_string(ranks) + " " + TANDEM_BIN + " train" + kModel +
                       " --train-iters 4 " + options);
  EXPECT_NE(r.code, 0) << fault;
  EXPECT_LT(r.seconds, 60) << fault;
  return r;
}

TEST(TandemMpi, HungRankMakesTheOthersStopWithinTheTimeout) {
  const Result r =
      run_faulty("rank=1,iter=2,mode=hang", 2, "--pipeline-model-parallel-size 2 --comm-timeout 3");
  EXPECT_NE(r.output.find("did not complete within 3 s"), std::string::npos) << r.output;
}

// Note [Who did not arrive]: world rank 3 hangs before step 2 (PP1 x EP2 on 4 ranks, so it is
// rank 1 of its expert group {2, 3}); the others stop inside a collective within the timeout,
// each naming world rank 3 as a rank that did not arrive. World rank 2, waiting for it in their
// expert group's all-to-all, may be named too by ranks in a later collective with both (it is
// "still in an earlier operation"); world ranks 0 and 1, which reach every collective, never.
TEST(TandemMpi, HungRankInACollectiveIsNamed) {
  const Result r =
      run_faulty("rank=3,iter=2,mode=hang", 4, "--expert-model-parallel-size 2 --comm-timeout 5");
  int named = 0;
  for (size_t at = r.output.find("not arrived: "); at != std::string::npos;
       at = r.output.find("not arrived: ", at + 1)) {
    const size_t end = r.output.find(" (stopped", at);
    ASSERT_NE(end, std::string::npos) << r.output;
    const std::string list = r.output.substr(at + 13, end - at - 13);
    EXPECT_NE(list.find("(world rank 3)"), std::string::npos) << list;
    EXPECT_EQ(list.find("(world rank 0)"), std::string::npos) << list;
    EXPECT_EQ(list.find("(world rank 1)"), std::string::npos) << list;
    ++named;
  }
  EXPECT_GE(named, 1) << r.output;
  EXPECT_NE(r.output.find("did not complete within 5 s"), std::string::npos) << r.output;
}

TEST(TandemMpi, DeadRankEndsTheJob) {
  const Result r = run_faulty("rank=1,iter=2,mode=exit", 2,
                              "--pipeline-model-parallel-size 2 --comm-timeout 10");
  // mpirun names the process that exited ([[job,1],RANK]) and its exit code.
  EXPECT_NE(r.output.find("],1]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Exit code:    9"), std::string::npos) << r.output;
}

// An internal error on rank 1 before it starts (TANDEM_TEST_ERROR, src/cli/main.cc) while rank
// 0 waits for it in the first collective: the job ends at once with rank 1's exit code, 1, and
// its message names the source line.
TEST(TandemMpi, InternalErrorOnOneRankEndsEveryRankWithExitOne) {
  const Result r = run("TANDEM_TEST_ERROR=internal,rank=1 " + kMpirun +
                       " -x TANDEM_TEST_ERROR -np 2 " + TANDEM_BIN + " train" + kModel +
                       " --train-iters 4 --pipeline-model-parallel-size 2 --comm-timeout 60");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 50) << "rank 0 waited for its timeout instead of ending with rank 1";
  EXPECT_NE(r.output.find("tandem: internal error at src/cli/main.cc:"), std::string::npos)
      << r.output;
}

// Validation on 4 ranks (PP2 x EP2, combined 1F1B) against one rank, and `tandem eval` of the
// saved step on 2 ranks (PP2) against the loss the one-rank run logged: the same batches
// through the forward only (Note [Forward-only evaluation]), every rank's loss reduced as the
// step's; so within the step's tolerance of one rank with experts on two ranks (1e-5: f32,
// rows summed in another order), and bitwise with only the pipeline split.
TEST(TandemMpi, ValidationOnFourRanksMatchesOneRank) {
  const std::string dir = temp_dir("validation");
  const std::string valid = " --train-iters 4 --eval-interval 2 --eval-iters 2 --log-json ";
  const Result one = run(std::string(TANDEM_BIN) + " train" + kModel + valid + dir +
                         "/one.jsonl --save " + dir + "/ck");
  ASSERT_EQ(one.code, 0) << one.output;
  const Result four =
      run(kMpirun + " -np 4 " + TANDEM_BIN + " train" + kModel + valid + dir + "/four.jsonl" +
          " --pipeline-model-parallel-size 2 --expert-model-parallel-size 2"
          " --schedule combined-1f1b --tensorboard-dir " +
          dir + "/tb");
  ASSERT_EQ(four.code, 0) << four.output;
  const std::vector<double> a = valid_losses(dir + "/one.jsonl"),
                            b = valid_losses(dir + "/four.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "validation " << i;
  // Rank 0 alone writes the event file.
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir + "/tb")) files += f.exists();
  EXPECT_EQ(files, 1);
  const Result eval = run(kMpirun + " -np 2 " + TANDEM_BIN + " eval --load " + dir +
                          "/ck --eval-iters 2 --pipeline-model-parallel-size 2");
  ASSERT_EQ(eval.code, 0) << eval.output;
  const size_t at = eval.output.find("valid loss: ");
  ASSERT_NE(at, std::string::npos) << eval.output;
  EXPECT_EQ(eval.output.find("valid loss: ", at + 1), std::string::npos) << "rank 0 prints";
  // Only the pipeline split: bitwise (Note [The loss summed as one rank sums it]).
  EXPECT_EQ(std::stod(eval.output.substr(at + 12)), a.back()) << eval.output;
}

TEST(TandemMpi, RanksWithDifferentConfigurationsStopWithAClearError) {
  const Result r = run(kMpirun + " -np 1 " + TANDEM_BIN + " train" + kModel +
                       " --train-iters 2 --lr 1e-3 : -np 1 " + TANDEM_BIN + " train" + kModel +
                       " --train-iters 2 --lr 2e-3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("rank 1 was started with a different configuration"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("lr=0.002"), std::string::npos) << r.output;
}

}  // namespace
