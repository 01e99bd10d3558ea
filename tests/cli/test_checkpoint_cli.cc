// `tandem train --save/--load` and --nan-policy through the real program. Oracles: an
// uninterrupted run (losses, gradient norms and the final weights file of a stopped-and-resumed
// run are bitwise equal to it); the bytes of the previous checkpoint before a run was killed
// mid-save (unchanged after, and `latest` still loads to the same weights); the exit code and
// message of a stopped run; the JSON log of a run with a skipped step; a resumed run with
// --decoupled-lr. Then Megatron-LM's run-control and logging options (MegatronRunOptions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/chunk.h"
#include "runtime/checkpoint.h"
#include "tandem_process.h"

namespace tandem::test {
namespace {

// A model small enough that a step takes milliseconds.
std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> args = {"train", "--num-layers",
                                   "2",     "--hidden-size",
                                   "32",    "--num-attention-heads",
                                   "4",     "--num-query-groups",
                                   "2",     "--ffn-hidden-size",
                                   "48",    "--num-experts",
                                   "4",     "--seq-length",
                                   "16",    "--micro-batch-size",
                                   "2",     "--global-batch-size",
                                   "4",     "--lr-warmup-iters",
                                   "2",     "--quiet"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::set<std::string> entries_of(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// name -> raw bytes of every weight a checkpoint loads to.
std::map<std::string, std::string> loaded_weights(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& [name, t] : runtime::load_checkpoint(dir).model) {
    out[name] = std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  return out;
}

TEST(CheckpointProgram, StopAndResumeIsBitwiseTheUninterruptedRun) {
  TempDir work, capture;
  RunResult r = run_tandem(tiny({"--train-iters", "6", "--lr-decay-iters", "6", "--log-json",
                                 "full.jsonl", "--save", "full"}),
                           work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem(
      tiny({"--train-iters", "3", "--lr-decay-iters", "6", "--save", "ck", "--save-interval", "1"}),
      work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Every checkpoint is kept (--keep-checkpoints 0, the default, as Megatron-LM keeps them).
  EXPECT_EQ(entries_of(work / "ck"),
            (std::set<std::string>{"iter_0000001", "iter_0000002", "iter_0000003", "latest"}));
  // No model or optimizer option: they come from the checkpoint
  // (Note [Options from a checkpoint]).
  r = run_tandem({"train", "--load", "ck", "--train-iters", "6", "--save", "ck", "--log-json",
                  "resumed.jsonl"},
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from ck/iter_0000003 at iteration 3"), std::string::npos) << r.out;
  const auto full = json_lines(work / "full.jsonl");
  const auto resumed = json_lines(work / "resumed.jsonl");
  ASSERT_EQ(full.size(), 6u);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i]["iter"], full[3 + i]["iter"]);
    EXPECT_EQ(resumed[i]["loss"].get<double>(), full[3 + i]["loss"].get<double>()) << i;
    EXPECT_EQ(resumed[i]["grad_norm"].get<double>(), full[3 + i]["grad_norm"].get<double>()) << i;
  }
  EXPECT_EQ(slurp(work / "ck/iter_0000006/model.safetensors"),
            slurp(work / "full/iter_0000006/model.safetensors"));
  EXPECT_EQ(slurp(work / "ck/iter_0000006/optimizer.safetensors"),
            slurp(work / "full/iter_0000006/optimizer.safetensors"));
}

// Note [Decoupled learning rate]: --decoupled-lr and --decoupled-min-lr are saved with the
// checkpoint, so a resume without them continues the run bitwise (losses, the logged rates,
// weights and moments), as the uninterrupted run; they change the run (its weights are not those
// of a run without them); a negative value exits 2 naming the option.
TEST(CheckpointProgram, DecoupledLrResumesBitwise) {
  TempDir work, capture;
  const std::vector<std::string> schedule = {
      "--lr-decay-style", "cosine", "--lr-decay-iters",   "6",
      "--decoupled-lr",   "0.01",   "--decoupled-min-lr", "1e-4"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), schedule.begin(), schedule.end());
    return tiny(more);
  };
  RunResult r =
      run_tandem(with({"--train-iters", "6", "--log-json", "full.jsonl", "--save", "full"}),
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem(with({"--train-iters", "3", "--save", "ck"}), work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem({"train", "--load", "ck", "--train-iters", "6", "--save", "ck", "--log-json",
                  "resumed.jsonl"},
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto full = json_lines(work / "full.jsonl");
  const auto resumed = json_lines(work / "resumed.jsonl");
  ASSERT_EQ(full.size(), 6u);
  ASSERT_EQ(resumed.size(), 3u);
  // The first update is the warm-up's start (0); the third is past the 2 warm-up iterations.
  EXPECT_EQ(full[2]["decoupled_lr"].get<double>(), 0.01);
  EXPECT_EQ(full[2]["lr"].get<double>(), 3e-3);  // --lr's default
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i]["loss"].get<double>(), full[3 + i]["loss"].get<double>()) << i;
    EXPECT_EQ(resumed[i]["decoupled_lr"].get<double>(), full[3 + i]["decoupled_lr"].get<double>())
        << i;
    EXPECT_EQ(resumed[i]["lr"].get<double>(), full[3 + i]["lr"].get<double>()) << i;
  }
  EXPECT_EQ(slurp(work / "ck/iter_0000006/model.safetensors"),
            slurp(work / "full/iter_0000006/model.safetensors"));
  EXPECT_EQ(slurp(work / "ck/iter_0000006/optimizer.safetensors"),
            slurp(work / "full/iter_0000006/optimizer.safetensors"));
  r = run_tandem(tiny({"--train-iters", "6", "--lr-decay-style", "cosine", "--lr-decay-iters", "6",
                       "--save", "plain"}),
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto plain = loaded_weights(work / "plain/iter_0000006");
  const auto decoupled = loaded_weights(work / "full/iter_0000006");
  EXPECT_NE(plain.at("model.embed_tokens.weight"), decoupled.at("model.embed_tokens.weight"));
  EXPECT_EQ(plain.count("lm_head.weight"), 0u);  // tied: the output layer is the table
  for (const char* option : {"--decoupled-lr", "--decoupled-min-lr"}) {
    r = run_tandem(tiny({"--train-iters", "1", option, "-0.5"}), work.path(), capture.path());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(std::string(option) + " -0.5 is invalid"), std::string::npos) << r.err;
  }
}

// Megatron-LM's scripts --load and --save one directory from the first run on: a --load
// directory that does not exist yet starts the run from the initialisation, and the next run
// resumes from what the first saved there.
TEST(CheckpointProgram, LoadOfADirectoryNotWrittenYetStartsFresh) {
  TempDir work, capture;
  std::vector<std::string> first =
      tiny({"--train-iters", "2", "--lr-decay-iters", "4", "--load", "run", "--save", "run"});
  first.erase(std::find(first.begin(), first.end(), "--quiet"));
  RunResult r = run_tandem(first, work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--load run holds no checkpoint yet: the run starts from the "
                       "initialisation, and --save writes to run"),
            std::string::npos)
      << r.out;
  r = run_tandem({"train", "--load", "run", "--save", "run", "--train-iters", "3"}, work.path(),
                 capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from run/iter_0000002 at iteration 2"), std::string::npos) << r.out;
}

// --mock-data: uniformly random tokens hold nothing to learn, so the loss stays at ln(vocab)
// while the addition task's falls in the same steps; the checkpoint records which data it saw.
TEST(CheckpointProgram, MockDataHasNothingToLearnAndIsRecorded) {
  TempDir work, capture;
  const std::vector<std::string> common = {"--vocab-size",     "512", "--train-iters", "20",
                                           "--lr-decay-iters", "20"};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), common.begin(), common.end());
    return tiny(more);
  };
  RunResult r = run_tandem(with({"--mock-data", "--log-json", "mock.jsonl", "--save", "m"}),
                           work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem(with({"--log-json", "addition.jsonl"}), work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto mock = json_lines(work / "mock.jsonl");
  const auto addition = json_lines(work / "addition.jsonl");
  ASSERT_EQ(mock.size(), 20u);
  ASSERT_EQ(addition.size(), 20u);
  const double ln_vocab = std::log(512.0);
  for (const auto& line : mock) EXPECT_GT(line["loss"].get<double>(), ln_vocab - 0.25) << line;
  EXPECT_LT(addition.back()["loss"].get<double>(), ln_vocab - 1.0) << addition.back();
  const nlohmann::json state =
      nlohmann::json::parse(slurp(work / "m/iter_0000020/trainer_state.json"));
  EXPECT_EQ(state["data"]["format"], "mock") << state["data"];
  EXPECT_EQ(state["data"]["vocab_size"], 512) << state["data"];
}

// Killed at each stage of saving iteration 3 (Note [Checkpoint commit]): the checkpoints of
// iterations 1 and 2 keep their bytes, `latest` loads to the weights it named before (or, once
// the pointer was replaced, to iteration 3), and the next run cleans up and carries on.
TEST(CheckpointProgram, KilledMidSaveLeavesTheLastCheckpointIntact) {
  TempDir work, capture;
  RunResult r = run_tandem(tiny({"--train-iters", "2", "--lr-decay-iters", "4", "--save", "base",
                                 "--save-interval", "1"}),
                           work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto weights_before = loaded_weights(work / "base");
  const std::vector<std::string> stages = {"model",  "config", "optimizer", "trainer_state",
                                           "commit", "latest", "prune"};
  for (const std::string& stage : stages) {
    SCOPED_TRACE("killed at stage " + stage);
    const std::string ck = work / ("ck_" + stage);
    fs::copy(work / "base", ck, fs::copy_options::recursive);
    const auto before = snapshot(ck);
    {
      LiveTandem run({"train", "--load", ck, "--train-iters", "4", "--save", ck, "--save-interval",
                      "1", "--keep-checkpoints", "2", "--quiet"},
                     work.path(),
                     {"TANDEM_TEST_SAVE_DELAY_MS=20000", "TANDEM_TEST_SAVE_DELAY_STAGE=" + stage});
      ASSERT_TRUE(run.wait_for("save iter_0000003 stage " + stage + "\n", 60))
          << run.stderr_so_far();
      run.kill();
    }
    for (const auto& [path, contents] : before) {
      if (path == "latest") continue;
      EXPECT_EQ(snapshot(ck).at(path), contents) << path;
    }
    const bool pointer_moved = stage == "prune";
    EXPECT_EQ(slurp(ck + "/latest"), pointer_moved ? "iter_0000003\n" : "iter_0000002\n");
    if (pointer_moved) {
      EXPECT_EQ(runtime::load_checkpoint(ck).dir, ck + "/iter_0000003");
    } else {
      EXPECT_EQ(loaded_weights(ck), weights_before);
    }
    // The next run resumes from `latest`, removes the debris and keeps the newest two.
    r = run_tandem({"train", "--load", ck, "--train-iters", "4", "--save", ck, "--save-interval",
                    "1", "--keep-checkpoints", "2", "--quiet"},
                   work.path(), capture.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(entries_of(ck), (std::set<std::string>{"iter_0000003", "iter_0000004", "latest"}));
  }
}

TEST(CheckpointProgram, NanPolicyStopNamesTheIterationAndKeepsTheCheckpoint) {
  TempDir work, capture;
  const RunResult r = run_tandem(
      tiny({"--train-iters", "4", "--save", "ck", "--save-interval", "2", "--log-json", "log"}),
      work.path(), capture.path(), {"TANDEM_TEST_POISON_GRAD_ITER=3"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("iteration 3: the gradients are not finite"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--nan-policy skip"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(work / "ck/latest"), "iter_0000002\n");
  EXPECT_EQ(entries_of(work / "ck"), (std::set<std::string>{"iter_0000002", "latest"}));
  EXPECT_EQ(runtime::load_checkpoint(work / "ck").trainer_state["iteration"], 2);
  EXPECT_EQ(json_lines(work / "log").size(), 2u);
}

TEST(CheckpointProgram, NanPolicySkipSkipsOneUpdateAndContinues) {
  TempDir work, capture;
  const RunResult r = run_tandem(
      tiny({"--train-iters", "4", "--save", "ck", "--log-json", "log", "--nan-policy", "skip"}),
      work.path(), capture.path(), {"TANDEM_TEST_POISON_GRAD_ITER=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = json_lines(work / "log");
  ASSERT_EQ(lines.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(lines[i]["skipped"], i == 2) << "iteration " << i + 1;
  EXPECT_TRUE(lines[2]["grad_norm"].is_null());  // NaN is written as null
  const nlohmann::json state = runtime::load_checkpoint(work / "ck").trainer_state;
  EXPECT_EQ(state["iteration"], 4);
  EXPECT_EQ(state["optimizer_steps"], 3);
  EXPECT_EQ(state["train"]["nan_policy"], "skip");
}

// A Hugging Face directory (BF16 weights and config.json, nothing else) starts a run at
// iteration 0 with the model options of its config.json.
TEST(CheckpointProgram, HuggingFaceCheckpointStartsARun) {
  TempDir work, capture;
  RunResult r = run_tandem(tiny({"--train-iters", "1", "--lr-warmup-iters", "0", "--save", "ck"}),
                           work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  fs::create_directories(work / "hf");
  runtime::NamedTensors bf16;
  for (const auto& [name, t] : runtime::load_checkpoint(work / "ck").model) {
    bf16.emplace_back(name, io::to_bf16(t));
  }
  io::save_safetensors(work / "hf/model.safetensors", bf16);
  fs::copy_file(work / "ck/iter_0000001/config.json", work / "hf/config.json");
  r = run_tandem({"train", "--load", "hf", "--train-iters", "2", "--seq-length", "16",
                  "--micro-batch-size", "2", "--global-batch-size", "4", "--log-interval", "1"},
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Hugging Face checkpoint hf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("iteration 0 with fresh optimizer state"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 layers, 4 experts top-2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("iter 2/2"), std::string::npos) << r.out;
}

// `tandem generate --eval-tokens` (the value tests/python/check_hf_load.py compares with
// transformers): the loss of a batch of training samples (seq_length + 1 tokens each) equals the
// training forward's mean cross-entropy on them, computed in-process from the same checkpoint.
TEST(CheckpointProgram, EvalTokensPrintsTheTrainingForwardsLoss) {
  TempDir work, capture;
  RunResult r = run_tandem(tiny({"--train-iters", "2", "--lr-warmup-iters", "1", "--save", "ck"}),
                           work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  constexpr int64_t kBatch = 2, kSeq = 16;  // tiny()'s --seq-length
  std::string text;
  model::MicroBatchState state;
  state.ids = Tensor::empty({kBatch * kSeq}, DType::kI32, MemCategory::kOther, "ids");
  state.targets = Tensor::empty({kBatch * kSeq}, DType::kI32, MemCategory::kOther, "targets");
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t <= kSeq; ++t) {
      const int32_t id = static_cast<int32_t>((37 * b + 11 * t * t + 5) % 256);
      text += std::to_string(id) + (t == kSeq ? "\n" : " ");
      if (t < kSeq) state.ids.data<int32_t>()[b * kSeq + t] = id;
      if (t > 0) state.targets.data<int32_t>()[b * kSeq + t - 1] = id;
    }
  }
  write_text(work / "tokens.txt", text);
  r = run_tandem({"generate", "--load", "ck", "--eval-tokens", "tokens.txt"}, work.path(),
                 capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out.rfind("loss: ", 0), 0u) << r.out;
  const double printed = std::stod(r.out.substr(6));
  const auto params = runtime::load_model_checkpoint(work / "ck");
  const model::ModelChunk chunk(*params);
  chunk.forward(state, chunk.context(kBatch, 1.0));
  EXPECT_NEAR(printed, state.lm_loss(), 1e-6 * state.lm_loss()) << r.out;

  write_text(work / "short.txt", "1 2 3\n4 5\n");
  r = run_tandem({"generate", "--load", "ck", "--eval-tokens", "short.txt"}, work.path(),
                 capture.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("line 2 has 2 tokens but the first line has 3"), std::string::npos) << r.err;
}

// Megatron-LM's run-control and logging options. Oracles: the checkpoints a stopped run leaves;
// the weights a first update at learning rate 0 leaves unchanged (a fresh schedule with a
// warm-up starts at --lr-warmup-init, 0), against those of the checkpoint loaded; the weights'
// norm against the norm of the saved weights, computed here; a skipped step's zero gradients
// against the count of the saved tensors' elements; the trace files named for the profiled steps.

TEST(MegatronRunOptions, ExitIntervalSavesAndStops) {
  TempDir work, capture;
  const RunResult r = run_tandem(
      tiny({"--train-iters", "6", "--exit-interval", "2", "--save", "ck", "--log-json", "log"}),
      work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(entries_of(work / "ck"), (std::set<std::string>{"iter_0000002", "latest"}));
  EXPECT_EQ(json_lines(work / "log").size(), 2u);
}

TEST(MegatronRunOptions, ExitDurationStopsAfterTheFirstStepPastIt) {
  TempDir work, capture;
  const RunResult r = run_tandem(tiny({"--train-iters", "6", "--exit-duration-in-mins", "1e-9",
                                       "--save", "ck", "--log-json", "log"}),
                                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(entries_of(work / "ck"), (std::set<std::string>{"iter_0000001", "latest"}));
  EXPECT_EQ(json_lines(work / "log").size(), 1u);
}

// --no-load-optim: the iteration continues (3), the optimizer and the schedule start afresh: the
// update runs at --lr-warmup-init 0 and so leaves the weights as loaded. A plain resume updates
// at the peak.
TEST(MegatronRunOptions, NoLoadOptimRestartsTheOptimizerAndTheSchedule) {
  TempDir work, capture;
  RunResult r = run_tandem(tiny({"--train-iters", "2", "--lr-decay-iters", "6", "--save", "ck"}),
                           work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem({"train", "--load", "ck", "--no-load-optim", "--no-load-rng", "--train-iters", "3",
                  "--save", "fresh", "--log-json", "fresh.jsonl", "--quiet"},
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto fresh = json_lines(work / "fresh.jsonl");
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0]["iter"], 3);
  EXPECT_EQ(fresh[0]["lr"], 0.0);
  const nlohmann::json state = runtime::load_checkpoint(work / "fresh").trainer_state;
  EXPECT_EQ(state["iteration"], 3);
  EXPECT_EQ(state["optimizer_steps"], 1);
  EXPECT_EQ(loaded_weights(work / "fresh"), loaded_weights(work / "ck"));
  r = run_tandem(
      {"train", "--load", "ck", "--train-iters", "3", "--log-json", "plain.jsonl", "--quiet"},
      work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(json_lines(work / "plain.jsonl")[0]["lr"].get<double>(), 0.0);
}

// --finetune: the weights alone, from iteration 0, with the run's own training settings (another
// global batch size than the checkpoint's is accepted).
TEST(MegatronRunOptions, FinetuneStartsFromTheWeightsAlone) {
  TempDir work, capture;
  RunResult r =
      run_tandem(tiny({"--train-iters", "4", "--save", "ck"}), work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem({"train",
                  "--load",
                  "ck",
                  "--finetune",
                  "--train-iters",
                  "3",
                  "--lr-warmup-iters",
                  "2",
                  "--micro-batch-size",
                  "2",
                  "--global-batch-size",
                  "8",
                  "--seq-length",
                  "16",
                  "--save",
                  "ft",
                  "--save-interval",
                  "1",
                  "--log-json",
                  "ft.jsonl",
                  "--quiet"},
                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = json_lines(work / "ft.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["iter"], 1);
  EXPECT_EQ(lines[0]["lr"], 0.0);
  EXPECT_EQ(loaded_weights(work / "ft/iter_0000001"), loaded_weights(work / "ck"));
  const nlohmann::json state = runtime::load_checkpoint(work / "ft").trainer_state;
  EXPECT_EQ(state["iteration"], 3);
  EXPECT_EQ(state["optimizer_steps"], 3);
  EXPECT_EQ(state["train"]["global_batch_size"], 8);
}

TEST(MegatronRunOptions, ParamsNormIsTheSavedWeightsNorm) {
  TempDir work, capture;
  const RunResult r =
      run_tandem(tiny({"--train-iters", "3", "--log-params-norm", "--log-num-zeros-in-grad",
                       "--save", "ck", "--log-json", "log", "--nan-policy", "skip"}),
                 work.path(), capture.path(), {"TANDEM_TEST_POISON_GRAD_ITER=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  double sq = 0;
  int64_t elements = 0;
  for (const auto& [name, t] : runtime::load_checkpoint(work / "ck").model) {
    ASSERT_EQ(t.dtype(), DType::kF32) << name;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = t.data<float>()[i];
      sq += v * v;
    }
    elements += t.numel();
  }
  const auto lines = json_lines(work / "log");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NEAR(lines[2]["params_norm"].get<double>(), std::sqrt(sq), 1e-5 * std::sqrt(sq));
  // The skipped step's gradients are all zero; the others' are not.
  EXPECT_EQ(lines[2]["num_zeros_in_grad"].get<int64_t>(), elements);
  EXPECT_LT(lines[1]["num_zeros_in_grad"].get<int64_t>(), elements);
  EXPECT_GT(lines[0]["params_norm"].get<double>(), 0.0);
}

// --no-check-for-nan-in-loss-and-grad: the poisoned step's update applies (no skip, no stop).
TEST(MegatronRunOptions, NoNanCheckAppliesTheUpdate) {
  TempDir work, capture;
  // Dense: NaN router scores would choose no expert.
  const RunResult r = run_tandem(tiny({"--num-experts", "0", "--train-iters", "4", "--save", "ck",
                                       "--log-json", "log", "--no-check-for-nan-in-loss-and-grad"}),
                                 work.path(), capture.path(), {"TANDEM_TEST_POISON_GRAD_ITER=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = json_lines(work / "log");
  ASSERT_EQ(lines.size(), 4u);
  for (const auto& line : lines) EXPECT_EQ(line["skipped"], false);
  EXPECT_TRUE(lines[3]["loss"].is_null());  // the weights hold NaN after the update
  EXPECT_EQ(runtime::load_checkpoint(work / "ck").trainer_state["optimizer_steps"], 4);
}

// --profile onto --trace: Megatron's steps 1 and 2 (counted from 0) are the 2nd and 3rd.
TEST(MegatronRunOptions, ProfileWritesTheProfiledStepsTimelines) {
  TempDir work, capture;
  const RunResult r = run_tandem(tiny({"--train-iters", "4", "--profile", "--profile-step-start",
                                       "1", "--profile-step-end", "3", "--trace", "t.json"}),
                                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(entries_of(work.path()), (std::set<std::string>{"t.iter2.json", "t.iter3.json"}));
  for (const char* f : {"t.iter2.json", "t.iter3.json"}) {
    const nlohmann::json trace = nlohmann::json::parse(slurp(work / f));
    EXPECT_FALSE(trace["traceEvents"].empty()) << f;
  }
}

}  // namespace
}  // namespace tandem::test
