// Multi-rank checkpoints in-process (runtime/checkpoint_parallel.h), the multi-rank
// --nan-policy verdict, and experts re-placed between steps. Oracles: the one-rank trainer's
// checkpoint state (restored into any layout and gathered back, every weight and Adam moment is
// bitwise the same, in the same order, with the same trainer state); the weights before a
// skipped step; the error every rank must throw when one rank fails; the run whose experts
// never move (gathered by name).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "dist_env.h"
#include "io/atomic_dir.h"
#include "io/safetensors.h"
#include "model/tiny.h"
#include "runtime/checkpoint_parallel.h"
#include "schedule/generators.h"
#include "schedule/validator.h"
#include "shared_temp_dir.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using testing::g_world;
using testing::RandomTokens;
using testing::SharedTempDir;

ModelConfig tiny_moe() {
  ModelConfig m;
  m.vocab_size = 16;
  m.hidden_size = 8;
  m.num_layers = 8;
  m.num_attention_heads = 2;
  m.num_query_groups = 1;
  m.ffn_hidden_size = 12;
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_aux_loss_coeff = 0.05;
  m.seq_length = 6;
  return m;
}

TrainConfig train_for(int dp) {
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 4 * dp;
  t.train_iters = 10;
  t.lr_warmup_iters = 1;
  return t;
}

std::unique_ptr<comm::Communicator> world_copy() {
  std::vector<int> all;
  for (int r = 0; r < g_world->size(); ++r) all.push_back(r);
  return g_world->subgroup(all, "world");
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Names, order and bytes of two tensor lists.
void expect_same_tensors(const NamedTensors& got, const NamedTensors& want,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    EXPECT_EQ(got[i].second.shape(), want[i].second.shape()) << what << ": " << want[i].first;
    EXPECT_TRUE(same_bytes(got[i].second, want[i].second)) << what << ": " << want[i].first;
  }
}

struct Layout {
  int pp, ep, v;
};

std::vector<Layout> layouts_of_this_world() {
  std::vector<Layout> out;
  const int world = g_world->size();
  for (int pp : {1, 2, 4}) {
    if (world % pp != 0) continue;
    for (int ep : {1, 2}) {
      if ((world / pp) % ep != 0) continue;
      for (int v : {1, 2}) out.push_back({pp, ep, v});
    }
  }
  return out;
}

// The layout's schedule (1F1B, interleaved with virtual stages) of 4 micro-batches, or none when
// it does not support the layout.
std::optional<schedule::Schedule> schedule_of(const Layout& l) {
  const schedule::ScheduleKind kind =
      l.v == 1 ? schedule::ScheduleKind::k1f1b : schedule::ScheduleKind::kInterleaved1f1b;
  const schedule::ScheduleShape shape{l.pp, l.v, 4};
  try {
    schedule::check_supported(kind, shape);
  } catch (const Error&) {
    return std::nullopt;
  }
  schedule::Schedule sched = schedule::generate_schedule(kind, shape);
  schedule::validate_schedule(sched);
  return sched;
}

// PP2 x EP2 where the world size allows (else 1 for either), under 1F1B with 4 micro-batches.
struct SmallLayout {
  int pp, ep;
  TrainConfig train;
  schedule::Schedule sched;
};

SmallLayout small_layout() {
  const int world = g_world->size();
  const int pp = world % 2 == 0 ? 2 : 1, ep = (world / pp) % 2 == 0 ? 2 : 1;
  return {pp, ep, train_for(world / pp),
          schedule::generate_schedule(schedule::ScheduleKind::k1f1b, {pp, 1, 4})};
}

// A checkpoint of the one-rank trainer (computed on every rank) restored into every layout of
// this world size and gathered back to rank 0: the same tensors, bytes, order and trainer state.
// So a checkpoint moves between layouts (1 rank -> PP x EP, and back) without a bit changing.
TEST(CheckpointDist, AnyLayoutRestoresAndGathersTheOneRankStateBitwise) {
  const ModelConfig m = tiny_moe();
  const nlohmann::json data = {{"format", "test"}};
  int checked = 0;
  for (const Layout& l : layouts_of_this_world()) {
    const int dp = g_world->size() / l.pp;
    const TrainConfig t = train_for(dp);
    const std::optional<schedule::Schedule> sched = schedule_of(l);
    if (!sched) continue;
    RandomTokens tokens(m.vocab_size);
    ReferenceTrainer one(m, t, tokens);
    one.step();
    one.step();
    const CheckpointState want = trainer_checkpoint(one, data);

    Groups groups = Groups::make(world_copy(), l.pp, l.ep);
    PipelineTrainer trainer(m, t, *sched, groups, tokens);
    run_agreeing(*groups.world, [&] { EXPECT_EQ(restore_pipeline(trainer, want), 2); });
    for (const StageRuntime& s : trainer.stages()) EXPECT_EQ(s.optimizer->steps(), 2);
    const CheckpointState got = gather_checkpoint(trainer, data);
    std::ostringstream what;
    what << "pp" << l.pp << " ep" << l.ep << " dp" << dp << " v" << l.v;
    if (groups.rank == 0) {
      expect_same_tensors(got.model, want.model, what.str() + " weights");
      expect_same_tensors(got.optimizer, want.optimizer, what.str() + " moments");
      EXPECT_EQ(got.trainer_state, want.trainer_state) << what.str();
      std::cout << "  checked " << what.str() << "\n";
    } else {
      EXPECT_TRUE(got.model.empty());
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// A run trained under a layout, gathered, restored into the one-rank trainer: its checkpoint is
// the gathered one (PP x EP -> 1 rank).
// Four steps of `sched` with experts re-placed after every step (b) and never (a): see below.
void expect_rebalanced_as_staying(const ModelConfig& m, const TrainConfig& t,
                                  const schedule::Schedule& sched, int pp, int ep,
                                  const std::string& what) {
  const nlohmann::json data = {{"format", "test"}};
  RandomTokens tokens(m.vocab_size);
  TrainConfig moving = t;
  moving.rebalance_experts = 1;
  Groups ga = Groups::make(world_copy(), pp, ep), gb = Groups::make(world_copy(), pp, ep);
  PipelineTrainer a(m, t, sched, ga, tokens), b(m, moving, sched, gb, tokens);
  int moves = 0;
  for (int step = 0; step < 4; ++step) {
    const StepResult ra = a.step(), rb = b.step();
    EXPECT_EQ(ra.loss, rb.loss) << what << ", step " << step + 1;
    EXPECT_EQ(ra.grad_norm, rb.grad_norm) << what << ", step " << step + 1;
    EXPECT_GT(rb.grad_norm, t.clip_grad);
    EXPECT_FALSE(a.last_rebalance().has_value());
    if (const auto& r = b.last_rebalance()) {
      ++moves;
      EXPECT_GT(r->layers, 0);
      EXPECT_LT(r->after, r->before);
      EXPECT_GE(r->after, 1.0);
    }
  }
  EXPECT_GT(moves, 0) << what << ": no step re-placed an expert, the test shows nothing";
  bool placed = false;
  for (int64_t l = 0; l < m.num_layers; ++l) placed = placed || !b.expert_placement().contiguous(l);
  EXPECT_TRUE(placed) << what;
  const CheckpointState want = gather_checkpoint(a, data), got = gather_checkpoint(b, data);
  if (ga.rank != 0) return;
  expect_same_tensors(got.model, want.model, what + " weights");
  expect_same_tensors(got.optimizer, want.optimizer, what + " moments");
}

// Note [Rebalancing experts]: experts re-placed (and their weights and Adam moments moved) after
// every step train exactly as experts that never move: every loss and gradient norm (clipping
// on, Note [Norm by expert]), and every weight and moment gathered by name, bitwise; with
// pipeline stages, two stages a rank (interleaved) and expert-data-parallel replicas (whose
// tokens differ, so they must agree on the placement). The run that never moves measures its
// norm the same way (--rebalance-experts larger than the steps). One expert rank refuses it.
TEST(CheckpointDist, RebalancedExpertsTrainBitwiseAsExpertsThatStay) {
  ModelConfig m = tiny_moe();
  m.num_experts = 8;
  const int world = g_world->size();
  const int ep = world >= 2 ? 2 : 1;
  if (ep == 1) {
    TrainConfig moving = train_for(1);
    moving.rebalance_experts = 1;
    const schedule::Schedule sched =
        schedule::generate_schedule(schedule::ScheduleKind::kCombined1f1b, {1, 1, 4});
    RandomTokens tokens(m.vocab_size);
    Groups g = Groups::make(world_copy(), 1, ep);
    try {
      PipelineTrainer refused(m, moving, sched, g, tokens);
      ADD_FAILURE() << "--rebalance-experts with one expert rank was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--expert-model-parallel-size > 1 (it is 1)"),
                std::string::npos)
          << e.what();
    }
    return;
  }
  for (const auto& [kind, pp, v] :
       {std::tuple{schedule::ScheduleKind::kCombined1f1b, world >= 8 ? 2 : 1, 1},
        std::tuple{schedule::ScheduleKind::kInterleaved1f1b, world >= 4 ? 2 : 1, 2}}) {
    if (kind == schedule::ScheduleKind::kInterleaved1f1b && pp == 1) continue;
    TrainConfig t = train_for(world / pp);
    t.clip_grad = 0.05;  // every step clips: the norm's last bit reaches the weights
    t.rebalance_experts = 1000;
    const schedule::Schedule sched = schedule::generate_schedule(kind, {pp, v, 4});
    // Mixtral's expert names; Qwen3-MoE's (other names, experts of their own width, dense
    // layers that hold none); Qwen2-MoE's (a shared expert, which never moves).
    for (const auto& [name, model] :
         {std::pair<const char*, ModelConfig>{"mixtral", m},
          {"qwen3-moe", testing::with_qwen3_options(m, "[0,1,1,1,1,0,1,1]")},
          {"qwen2-moe", testing::with_qwen2_options(m)}}) {
      std::ostringstream what;
      what << name << " " << sched.name << " pp" << pp << " ep" << ep << " on " << world
           << " ranks";
      expect_rebalanced_as_staying(model, t, sched, pp, ep, what.str());
    }
  }
}

// Note [The update beside the first forward]: each step's AdamW update run layer by layer inside
// the next step's first forward trains exactly as the update at the step's end: every loss and
// gradient norm (clipping on), and every weight, moment and trainer state gathered after the
// steps (gathering finishes the last step's update), bitwise; under every layout of this world
// size (pipeline stages, two stages a rank, expert ranks with the all-to-all on the
// communication worker), with the first two forwards paired, and with experts re-placed after
// every step (their moments move with the weights, so the move finishes the update first).
TEST(CheckpointDist, DeferredUpdateTrainsBitwiseAsTheUpdateAtTheStepsEnd) {
  ModelConfig m = tiny_moe();
  const nlohmann::json data = {{"format", "test"}};
  struct Case {
    Layout layout;
    bool paired, rebalance;
  };
  std::vector<Case> cases;
  for (const Layout& l : layouts_of_this_world()) cases.push_back({l, false, false});
  const int world = g_world->size();
  if (world <= 4) cases.push_back({{1, world >= 2 ? 2 : 1, 1}, true, false});
  if (world >= 2 && world <= 4) cases.push_back({{1, 2, 1}, false, true});
  for (const Case& c : cases) {
    const auto [pp, ep, v] = c.layout;
    const auto kind =
        v > 1 ? schedule::ScheduleKind::kInterleaved1f1b : schedule::ScheduleKind::kCombined1f1b;
    if (v > 1 && pp == 1) continue;
    TrainConfig t = train_for(world / pp);
    t.clip_grad = 0.05;  // every step clips: the norm's last bit reaches the weights
    t.rebalance_experts = c.rebalance ? 1 : 0;
    TrainConfig deferred = t;
    deferred.defer_optimizer = true;
    const schedule::Schedule sched = schedule::generate_schedule(kind, {pp, v, 4, c.paired});
    std::ostringstream what;
    what << sched.name << " pp" << pp << " ep" << ep << (c.paired ? " paired" : "")
         << (c.rebalance ? " rebalanced" : "") << " on " << world << " ranks";
    RandomTokens tokens(m.vocab_size);
    Groups ga = Groups::make(world_copy(), pp, ep), gb = Groups::make(world_copy(), pp, ep);
    PipelineTrainer a(m, t, sched, ga, tokens), b(m, deferred, sched, gb, tokens);
    for (int step = 0; step < 4; ++step) {
      const StepResult ra = a.step(), rb = b.step();
      EXPECT_EQ(ra.loss, rb.loss) << what.str() << ", step " << step + 1;
      EXPECT_EQ(ra.grad_norm, rb.grad_norm) << what.str() << ", step " << step + 1;
      EXPECT_GT(rb.grad_norm, t.clip_grad) << what.str();
      // A move of experts finishes the update; else it waits (the const stages() leaves it).
      const PipelineTrainer& held = b;
      EXPECT_EQ(held.stages().front().optimizer->update_pending(), !b.last_rebalance())
          << what.str();
    }
    const CheckpointState want = gather_checkpoint(a, data), got = gather_checkpoint(b, data);
    for (const StageRuntime& s : b.stages()) EXPECT_FALSE(s.optimizer->update_pending());
    if (ga.rank == 0) {
      expect_same_tensors(got.model, want.model, what.str() + " weights");
      expect_same_tensors(got.optimizer, want.optimizer, what.str() + " moments");
      EXPECT_EQ(got.trainer_state, want.trainer_state) << what.str();
    }
    std::cout << "  checked " << what.str() << "\n";
  }
}

TEST(CheckpointDist, GatheredStateRestoresIntoOneRank) {
  const ModelConfig m = tiny_moe();
  const nlohmann::json data = {{"format", "test"}};
  const SmallLayout l = small_layout();
  RandomTokens tokens(m.vocab_size);
  Groups groups = Groups::make(world_copy(), l.pp, l.ep);
  PipelineTrainer trainer(m, l.train, l.sched, groups, tokens);
  trainer.step();
  trainer.step();
  trainer.step();
  const CheckpointState gathered = gather_checkpoint(trainer, data);
  if (groups.rank != 0) return;
  ReferenceTrainer one(m, l.train, tokens);
  restore_trainer(one, gathered);
  EXPECT_EQ(one.iteration(), 3);
  EXPECT_EQ(one.optimizer().steps(), 3);
  const CheckpointState again = trainer_checkpoint(one, data);
  expect_same_tensors(again.model, gathered.model, "weights");
  expect_same_tensors(again.optimizer, gathered.optimizer, "moments");
  EXPECT_EQ(again.trainer_state, gathered.trainer_state);
}

// Rank 0 cannot replace `latest` (a directory has its name), after writing for longer than the
// heartbeat: every rank throws rank 0's tandem::Error, with its message, instead of hanging.
TEST(CheckpointDist, FailedSaveOnRankZeroFailsEveryRankWithItsMessage) {
  const ModelConfig m = tiny_moe();
  const int world = g_world->size();
  const TrainConfig t = train_for(world);
  const schedule::Schedule sched =
      schedule::generate_schedule(schedule::ScheduleKind::k1f1b, {1, 1, 4});
  RandomTokens tokens(m.vocab_size);
  Groups groups = Groups::make(world_copy(), 1, 1);
  PipelineTrainer trainer(m, t, sched, groups, tokens);
  trainer.step();
  SharedTempDir dir;
  if (groups.rank == 0) fs::create_directories(dir.path() + "/latest/blocker");
  g_world->barrier();
  std::string message;
  try {
    save_checkpoint_parallel(dir.path(), trainer, {}, 2, 0.001);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("latest"), std::string::npos) << message;
  const std::vector<std::string> all = g_world->all_gather_bytes(message);
  for (const std::string& m_r : all) EXPECT_EQ(m_r, all[0]);
  // The iteration directory itself was committed before the pointer failed: nothing is lost.
  if (groups.rank == 0) {
    EXPECT_TRUE(fs::is_directory(dir.path() + "/iter_0000001"));
  }

  // And a save that succeeds returns on every rank with the directory.
  SharedTempDir good;
  const SavedCheckpoint saved = save_checkpoint_parallel(good.path(), trainer, {}, 2, 0.001);
  EXPECT_EQ(saved.dir, good.path() + "/iter_0000001");
  if (groups.rank == 0) {
    EXPECT_TRUE(fs::is_regular_file(saved.dir + "/trainer_state.json"));
  }
}

// A checkpoint's tensors by name, in its files' order sorted by name (shard boundaries aside).
NamedTensors by_name(NamedTensors tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return tensors;
}

// Each tensor of `kind` ("model", "optimizer") in `dir` is in exactly one file, and the index
// maps it to that file: the names the index maps are the names `want` holds, each once.
void expect_indexed_once(const std::string& dir, const std::string& kind, const NamedTensors& want,
                         const std::string& what) {
  const nlohmann::json index =
      nlohmann::json::parse(io::read_file(dir + "/" + kind + ".safetensors.index.json"));
  std::map<std::string, int> seen;  // name -> files holding it
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string file = e.path().filename().string();
    if (file.rfind(kind + "-", 0) != 0) continue;
    for (const io::SafetensorsEntry& t : io::read_safetensors_header(e.path().string()).tensors) {
      ++seen[t.name];
      EXPECT_EQ(index["weight_map"].value(t.name, std::string()), file) << what << ": " << t.name;
    }
  }
  EXPECT_EQ(index["weight_map"].size(), want.size()) << what;
  EXPECT_EQ(seen.size(), want.size()) << what;
  for (const auto& [name, t] : want) EXPECT_EQ(seen[name], 1) << what << ": " << name;
  int64_t total = 0;
  for (const auto& [name, t] : want) total += t.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"], total) << what;
}

// Note [Fully parallel save]: every layout of the world (with the distributed optimizer and
// without), saved by every rank into its own shards (small ones, so ranks write several) and by
// rank 0 alone: loaded back, the two hold the same tensors, byte for byte by name, and the same
// trainer state; both indexes map every name once; rank 0 has every writing rank's figures.
TEST(CheckpointDist, FullyParallelSaveHoldsTheRankZeroSavesTensors) {
  const ModelConfig m = tiny_moe();
  const nlohmann::json data = {{"format", "test"}};
  int checked = 0;
  for (const Layout& l : layouts_of_this_world()) {
    for (const bool distributed : {false, true}) {
      const int dp = g_world->size() / l.pp;
      TrainConfig t = train_for(dp);
      t.use_distributed_optimizer = distributed;
      const std::optional<schedule::Schedule> sched = schedule_of(l);
      if (!sched) continue;
      RandomTokens tokens(m.vocab_size);
      Groups groups = Groups::make(world_copy(), l.pp, l.ep);
      PipelineTrainer trainer(m, t, *sched, groups, tokens);
      trainer.step();
      trainer.step();
      SharedTempDir dir;
      const SavedCheckpoint one =
          save_checkpoint_parallel(dir.path() + "/rank0", trainer, data, 1, 1.0);
      const SavedCheckpoint all =
          save_checkpoint_fully_parallel(dir.path() + "/all", trainer, data, 1, 1.0, 2000);
      EXPECT_EQ(all.dir, dir.path() + "/all/iter_0000002");
      std::ostringstream what;
      what << "pp" << l.pp << " ep" << l.ep << " dp" << dp << " v" << l.v
           << (distributed ? " distributed" : "");
      if (groups.rank == 0) {
        const CheckpointState want = load_checkpoint(one.dir);
        const CheckpointState got = load_checkpoint(all.dir);
        expect_same_tensors(by_name(got.model), by_name(want.model), what.str() + " weights");
        expect_same_tensors(by_name(got.optimizer), by_name(want.optimizer),
                            what.str() + " moments");
        nlohmann::json got_state = got.trainer_state, want_state = want.trainer_state;
        got_state.erase("files");
        want_state.erase("files");
        EXPECT_EQ(got_state, want_state) << what.str();
        expect_indexed_once(all.dir, "model", want.model, what.str());
        expect_indexed_once(all.dir, "optimizer", want.optimizer, what.str());
        int64_t bytes = 0;
        for (const RankWrite& w : all.writes) bytes += w.files > 0 ? w.bytes : 0;
        EXPECT_GE(all.writes.size(), static_cast<size_t>(l.pp)) << what.str();
        EXPECT_GT(bytes, 0) << what.str();
        std::cout << "  checked " << what.str() << "\n";
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// A rank that fails while writing its shards (the test hook, on the last rank) fails every
// rank's save with its message; the staging directory and every rank's files in it are removed,
// and `latest` still names the previous checkpoint, which still loads.
TEST(CheckpointDist, FailedWriteOnAnyRankFailsEveryRankAndCommitsNothing) {
  const ModelConfig m = tiny_moe();
  const SmallLayout l = small_layout();
  RandomTokens tokens(m.vocab_size);
  Groups groups = Groups::make(world_copy(), l.pp, l.ep);
  PipelineTrainer trainer(m, l.train, l.sched, groups, tokens);
  trainer.step();
  SharedTempDir dir;
  save_checkpoint_fully_parallel(dir.path(), trainer, {}, 2, 0.001, 2000);
  trainer.step();
  const std::string failing = std::to_string(g_world->size() - 1);
  ::setenv("TANDEM_TEST_SAVE_FAIL_RANK", failing.c_str(), 1);
  std::string message;
  try {
    save_checkpoint_fully_parallel(dir.path(), trainer, {}, 2, 0.001, 2000);
  } catch (const Error& e) {
    message = e.what();
  }
  ::unsetenv("TANDEM_TEST_SAVE_FAIL_RANK");
  EXPECT_NE(message.find("rank " + failing + " failed to write its shards"), std::string::npos)
      << message;
  const std::vector<std::string> all = g_world->all_gather_bytes(message);
  for (const std::string& m_r : all) EXPECT_EQ(m_r, all[0]);
  if (groups.rank == 0) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"iter_0000001", "latest"}));
    EXPECT_EQ(io::read_file(dir.path() + "/latest"), "iter_0000001\n");
    EXPECT_EQ(load_checkpoint(dir.path()).trainer_state["iteration"], 1);
  }
}

TEST(CheckpointDist, RunAgreeingThrowsTheLowestFailingRanksError) {
  const int world = g_world->size(), me = g_world->rank();
  EXPECT_NO_THROW(run_agreeing(*g_world, [] {}));
  try {
    run_agreeing(*g_world, [&] {
      if (me >= world / 2) throw Error("bad weight on rank " + std::to_string(me));
    });
    ADD_FAILURE() << "no rank threw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "bad weight on rank " + std::to_string(world / 2));
  }
  // Anything but a tandem::Error stays an internal error (exit code 1, not 2).
  bool internal = false;
  try {
    run_agreeing(*g_world, [&] {
      if (me == world - 1) throw std::logic_error("broken");
    });
  } catch (const Error&) {
  } catch (const std::runtime_error& e) {
    internal = std::string(e.what()) == "broken";
  }
  EXPECT_TRUE(internal);
}

// Note [Non-finite steps on several ranks]: the last rank's copy of a dense gradient becomes NaN
// after the reduction (a copy no other rank reads, and not counted in the norm when it is not
// data-parallel rank 0). Every rank must take the same decision: skip (no update anywhere) or
// stop (every rank throws).
TEST(CheckpointDist, NonFiniteGradientOnOneRankIsEveryRanksVerdict) {
  const ModelConfig m = tiny_moe();
  const int world = g_world->size();
  for (const NonFinitePolicy policy : {NonFinitePolicy::kSkip, NonFinitePolicy::kStop}) {
    TrainConfig t = train_for(world);
    t.non_finite_policy = policy;
    const schedule::Schedule sched =
        schedule::generate_schedule(schedule::ScheduleKind::k1f1b, {1, 1, 4});
    RandomTokens tokens(m.vocab_size);
    Groups groups = Groups::make(world_copy(), 1, 1);
    PipelineTrainer trainer(m, t, sched, groups, tokens);
    trainer.step();
    trainer.set_after_backward_hook([&](std::vector<StageRuntime>& stages, int64_t it) {
      if (it == 2 && groups.rank == world - 1) {
        stages.front().params->flat_grads().data<float>()[0] =
            std::numeric_limits<float>::quiet_NaN();
      }
    });
    const model::Parameters& params = *trainer.stages().front().params;
    const std::vector<float> before(params.flat_params().data<float>(),
                                    params.flat_params().data<float>() + params.numel());
    if (policy == NonFinitePolicy::kStop) {
      try {
        trainer.step();
        ADD_FAILURE() << "rank " << groups.rank << " took the step";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("iteration 2: the gradients are not finite"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_EQ(trainer.iteration(), 1);
    } else {
      const StepResult r = trainer.step();
      EXPECT_EQ(r.status, StepStatus::kSkipped);
      EXPECT_EQ(trainer.iteration(), 2);
      EXPECT_EQ(trainer.stages().front().optimizer->steps(), 1);
      EXPECT_EQ(std::memcmp(before.data(), params.flat_params().data<float>(),
                            before.size() * sizeof(float)),
                0);
      EXPECT_EQ(trainer.step().status, StepStatus::kApplied);  // the next step goes on
    }
    g_world->barrier();
  }
}

}  // namespace
}  // namespace tandem::runtime
