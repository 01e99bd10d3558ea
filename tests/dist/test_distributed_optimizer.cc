// The distributed optimizer (runtime/distributed_optimizer.h, --use-distributed-optimizer) on
// CPU ranks. Oracles: the plain optimizer on the same layout (losses, norms, every weight and
// both Adam moments, made whole: bitwise where every group has at most two ranks, Note
// [Distributed optimizer]); the planner's optimizer bytes (schedule::make_plan), which never sees
// the runtime's allocations, against the allocator's kOptimizer bytes; the plain optimizer's
// checkpoint files, byte for byte, and its resumed run on every other layout of the world.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/random_tokens.h"
#include "core/allocator.h"
#include "dist_env.h"
#include "layouts.h"
#include "model/tiny.h"
#include "planner/planner.h"
#include "runtime/checkpoint_parallel.h"
#include "shared_temp_dir.h"

namespace tandem::runtime {
namespace {

using schedule::ScheduleKind;
using testing::g_world;
using testing::RandomTokens;
using testing::SharedTempDir;

// Odd widths (hidden 7, vocab 17), so that pieces do not divide by the group sizes and the
// last parts are padded.
ModelConfig odd_moe() {
  ModelConfig m = testing::dist_tiny(true);
  m.vocab_size = 17;
  m.hidden_size = 7;
  m.kv_channels = 4;
  m.num_layers = 4;
  return m;
}

// Note [Tied embeddings]: odd_moe with its output layer the embedding table (a last stage's copy a
// piece of its own: Note [The embedding group] in runtime/grad_reduce.cc).
ModelConfig odd_tied() {
  ModelConfig m = odd_moe();
  m.untie_embeddings_and_output_weights = false;
  return m;
}

// DeepSeek-V3's options on it: latent attention, shared experts, the sigmoid router with its
// expert bias (moved fast here), a dense layer first.
ModelConfig odd_deepseek_v3() {
  ModelConfig m = testing::with_deepseek_v3_options(odd_moe(), 5);
  m.moe_layer_freq = "[0,1,1,1]";
  m.moe_router_bias_update_rate = 0.01;
  return m;
}

struct Case {
  int pp, ep, v;
  ScheduleKind kind;
  int dp() const { return g_world->size() / pp; }
  // Sums over groups of at most two ranks have one order: the reduce-scatter's are the
  // all-reduce's bit for bit.
  bool bitwise() const { return dp() <= 2; }
  std::string name() const {
    std::ostringstream s;
    s << "pp" << pp << " ep" << ep << " dp" << dp() << " v" << v << " "
      << schedule::schedule_kind_name(kind);
    return s.str();
  }
};

// The layouts of this world: pipeline 1, 2 and 4, one or two expert ranks; 1f1b, and
// combined-1f1b (pairs beside the communication thread) or, on two stages, interleaved-1f1b,
// zb-h1 and dualpipev.
std::vector<Case> cases() {
  const int world = g_world->size();
  std::vector<Case> out;
  for (int pp : {1, 2, 4}) {
    if (world % pp != 0 || pp > 4) continue;
    for (int ep : {1, 2}) {
      if ((world / pp) % ep != 0) continue;
      out.push_back({pp, ep, 1, ScheduleKind::k1f1b});
      if (pp == 1 && ep == 2) out.push_back({pp, ep, 1, ScheduleKind::kCombined1f1b});
      if (pp == 2) {
        out.push_back({pp, ep, 2, ScheduleKind::kInterleaved1f1b});
        out.push_back({pp, ep, 1, ScheduleKind::kZbH1});       // W actions
        out.push_back({pp, ep, 2, ScheduleKind::kDualPipeV});  // two stages a rank, V-placed
      }
    }
  }
  return out;
}

TrainConfig train_for(const Case& c, bool distributed) {
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 4 * c.pp * c.dp();
  t.train_iters = 10;
  t.lr_warmup_iters = 1;
  t.clip_grad = 0.1;  // below the first steps' norms: clipping on
  t.use_distributed_optimizer = distributed;
  return t;
}

schedule::Schedule schedule_of(const Case& c) {
  const schedule::ScheduleShape shape{c.pp, c.v, 4 * c.pp};
  schedule::Schedule s = schedule::generate_schedule(c.kind, shape);
  schedule::validate_schedule(s);
  return s;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), MemCategory::kOther, "test.copy");
  c.copy_from(t);
  return c;
}

// Every stage's weights and moments, whole (a sharded optimizer's gathered: collective).
struct StageState {
  Tensor weights, exp_avg, exp_avg_sq;
};
std::vector<StageState> state_of(PipelineTrainer& trainer) {
  std::vector<StageState> out;
  for (StageRuntime& s : trainer.stages()) {
    const AdamW& o = *s.optimizer;
    out.push_back({copy_of(s.params->flat_params()),
                   s.shards ? s.shards->whole_state(o.exp_avg()) : copy_of(o.exp_avg()),
                   s.shards ? s.shards->whole_state(o.exp_avg_sq()) : copy_of(o.exp_avg_sq())});
  }
  return out;
}

// The largest |got - want| over the largest |want|.
double relative_difference(const Tensor& got, const Tensor& want) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, std::abs(double(got.data<float>()[i]) - want.data<float>()[i]));
    scale = std::max(scale, std::abs(double(want.data<float>()[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Bitwise, or within 1e-4 relative (f32, a few steps) where a group has more than two ranks:
// MPI may add the reduce-scatter's terms in another order than the all-reduce's (Open MPI's
// algorithms depend on the size and the call; this one has given the same bits at 4 and 8
// ranks, which is not promised).
void expect_same(const Tensor& got, const Tensor& want, bool bitwise, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  if (bitwise) {
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0)
        << what << ": differs by " << relative_difference(got, want) << " relative";
  } else {
    EXPECT_LT(relative_difference(got, want), 1e-4) << what;
  }
}

struct Outcome {
  std::vector<StepResult> steps;
  std::vector<StageState> state;
  bool gather_pending = false;  // after the last step, before anything read the weights
};

Outcome train(const Case& c, const TrainConfig& t, int steps, const ModelConfig& m = odd_moe()) {
  RandomTokens tokens(m.vocab_size);
  Groups groups = testing::world_groups(c.pp, c.ep);
  PipelineTrainer trainer(m, t, schedule_of(c), groups, tokens);
  Outcome out;
  for (int i = 0; i < steps; ++i) out.steps.push_back(trainer.step());
  const PipelineTrainer& as_is = trainer;  // the const accessor gathers nothing
  for (const StageRuntime& s : as_is.stages()) {
    out.gather_pending = out.gather_pending || (s.shards && s.shards->gather_pending(1));
  }
  out.state = state_of(trainer);
  return out;
}

// DP2, EP2 x DP2 and every other layout of the world: the distributed optimizer's losses,
// norms, weights and moments against the plain optimizer's, with the reduction beside the
// backward or at the step's end, the weights gathered after the update or beside the next
// forward.
TEST(DistributedOptimizer, GivesThePlainOptimizersResults) {
  int compared = 0;
  for (const Case& c : cases()) {
    const Outcome plain = train(c, train_for(c, false), 3);
    EXPECT_GT(plain.steps.front().grad_norm, 0.1) << c.name() << ": clipping was meant to be on";
    for (const bool overlap_reduce : {true, false}) {
      for (const bool overlap_gather : {false, true}) {
        TrainConfig t = train_for(c, true);
        t.overlap_grad_reduce = overlap_reduce;
        t.overlap_param_gather = overlap_gather;
        const Outcome got = train(c, t, 3);
        // Note [Weights gathered beside the forward]: the step left the gather to the next
        // forward.
        EXPECT_EQ(got.gather_pending, overlap_gather) << c.name();
        const std::string what = c.name() + (overlap_reduce ? " reduce beside" : " reduce after") +
                                 (overlap_gather ? ", gather beside" : ", gather after");
        for (size_t i = 0; i < got.steps.size(); ++i) {
          const StepResult &a = got.steps[i], &b = plain.steps[i];
          if (c.bitwise()) {
            EXPECT_EQ(a.loss, b.loss) << what << " step " << i;
          } else {
            EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(b.loss)) << what << " step " << i;
          }
          // Note [Norm from the parts]: the same squares added in another grouping.
          EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-12 * b.grad_norm) << what << " step " << i;
        }
        ASSERT_EQ(got.state.size(), plain.state.size());
        for (size_t s = 0; s < got.state.size(); ++s) {
          const std::string where = what + " stage " + std::to_string(s);
          expect_same(got.state[s].weights, plain.state[s].weights, c.bitwise(),
                      where + " weights");
          expect_same(got.state[s].exp_avg, plain.state[s].exp_avg, c.bitwise(),
                      where + " exp_avg");
          expect_same(got.state[s].exp_avg_sq, plain.state[s].exp_avg_sq, c.bitwise(),
                      where + " exp_avg_sq");
        }
        ++compared;
      }
    }
    if (g_world->rank() == 0) std::cout << "  compared " << c.name() << "\n";
  }
  EXPECT_GT(compared, 0);
}

// Note [Expert bias] (runtime/expert_bias.h): DeepSeek-V3's sigmoid router keeps a bias among the
// weights that changes by its own rule after each step, on every rank; the gather (after the
// update or beside the next forward) brings each rank's part of it, which is the same. (Its
// latent attention, shared experts and dense first layer cut the pieces otherwise too.)
TEST(DistributedOptimizer, ExpertBiasStaysThePlainOptimizers) {
  const ModelConfig m = odd_deepseek_v3();
  for (const Case& c : cases()) {
    if (c.pp != 1 || c.kind != ScheduleKind::k1f1b) continue;
    const Outcome plain = train(c, train_for(c, false), 3, m);
    for (const bool overlap_gather : {false, true}) {
      TrainConfig t = train_for(c, true);
      t.overlap_param_gather = overlap_gather;
      const Outcome got = train(c, t, 3, m);
      for (size_t s = 0; s < got.state.size(); ++s) {
        expect_same(got.state[s].weights, plain.state[s].weights, c.bitwise(),
                    c.name() + (overlap_gather ? " gather beside" : " gather after"));
      }
    }
  }
}

// The optimizer bytes each rank allocates (the allocator's kOptimizer category) are the
// planner's, with the distributed optimizer and without, for both models (the DeepSeek-V3 one
// cuts its pieces at a dense layer, shared experts and latent attention); with it they shrink by
// the data-parallel size's share.
TEST(DistributedOptimizer, OptimizerBytesAreThePlanned) {
  for (const ModelConfig& m : {odd_moe(), odd_deepseek_v3(), odd_tied()}) {
    RandomTokens tokens(m.vocab_size);
    for (const Case& c : cases()) {
      int64_t bytes[2] = {0, 0};
      for (const bool distributed : {false, true}) {
        Groups groups = testing::world_groups(c.pp, c.ep);
        const int64_t before = cpu_allocator().stats().in_use_of(MemCategory::kOptimizer);
        PipelineTrainer trainer(m, train_for(c, distributed), schedule_of(c), groups, tokens);
        const int64_t measured =
            cpu_allocator().stats().in_use_of(MemCategory::kOptimizer) - before;
        schedule::PlanRequest req;
        req.schedule_name = std::string(schedule::schedule_kind_name(c.kind));
        req.shape = {c.pp, c.v, 4 * c.pp};
        req.inputs.model = m;
        req.inputs.expert_parallel_size = c.ep;
        req.inputs.data_parallel_size = c.dp();
        req.inputs.distributed_optimizer = distributed;
        req.inputs.cost.kind = schedule::CostModelKind::kUniform;
        const schedule::Plan plan = schedule::make_plan(req);
        const int32_t pp_rank = groups.layout.pp_rank(groups.rank);
        EXPECT_EQ(measured, plan.model.ranks[pp_rank].optimizer_bytes)
            << c.name() << (distributed ? " distributed" : " plain") << " rank " << groups.rank;
        bytes[distributed] = measured;
      }
      if (c.dp() > 1) {
        EXPECT_LT(bytes[1], bytes[0]) << c.name();
        EXPECT_GE(bytes[1] * c.dp(), bytes[0]) << c.name();
        // With one expert rank every weight is split dp ways; each piece's parts are rounded up
        // (fewer than 64 pieces a rank here), so a little above plain / dp.
        if (c.ep == 1) {
          EXPECT_LE(bytes[1] * c.dp(), bytes[0] + 2 * 4 * c.dp() * 64) << c.name();
        }
      } else {
        EXPECT_EQ(bytes[1], bytes[0]) << c.name() << ": a split of one";
      }
    }
  }
}

// Note [Norm from the parts]: a NaN put into the last rank's gradients after the reduction, at an
// element another rank owns (element 0 lies in data-parallel rank 0's part, so no update reads
// it), still sets the step's verdict: every rank skips the step and keeps its weights, as with
// the plain optimizer.
TEST(DistributedOptimizer, NonFiniteGradientOutsideTheOwnPartSkipsTheStepEverywhere) {
  const int world = g_world->size();
  const Case c{1, 1, 1, ScheduleKind::k1f1b};
  const ModelConfig m = odd_moe();
  TrainConfig t = train_for(c, true);
  t.non_finite_policy = NonFinitePolicy::kSkip;
  RandomTokens tokens(m.vocab_size);
  Groups groups = testing::world_groups(1, 1);
  PipelineTrainer trainer(m, t, schedule_of(c), groups, tokens);
  trainer.step();
  trainer.set_after_backward_hook([&](std::vector<StageRuntime>& stages, int64_t it) {
    if (it == 2 && groups.rank == world - 1) {
      stages.front().params->flat_grads().data<float>()[0] =
          std::numeric_limits<float>::quiet_NaN();
    }
  });
  const Tensor before = copy_of(trainer.stages().front().params->flat_params());
  const StepResult r = trainer.step();
  EXPECT_EQ(r.status, StepStatus::kSkipped);
  EXPECT_EQ(trainer.stages().front().optimizer->steps(), 1);
  expect_same(trainer.stages().front().params->flat_params(), before, true, "weights");
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Saves after two steps on `c`; returns the iteration directory.
std::string save_after_two_steps(const Case& c, bool distributed, const std::string& root) {
  const ModelConfig m = odd_moe();
  RandomTokens tokens(m.vocab_size);
  Groups groups = testing::world_groups(c.pp, c.ep);
  TrainConfig t = train_for(c, distributed);
  t.overlap_param_gather = distributed;  // a gather still pending when it saves
  PipelineTrainer trainer(m, t, schedule_of(c), groups, tokens);
  trainer.step();
  trainer.step();
  return save_checkpoint_parallel(root, trainer, {{"format", "test"}}, 2, 0.001).dir;
}

// A checkpoint saved with the distributed optimizer (weights gathered beside the forward, so a
// gather is pending when it saves) is the plain optimizer's, file for file; restored into every
// layout of the world with the distributed optimizer, it gathers back bitwise, and its next
// step is the plain optimizer's resumed from the same files.
TEST(DistributedOptimizer, CheckpointIsThePlainOnesAndResumesOnAnyLayout) {
  const int world = g_world->size();
  const Case source{world >= 2 ? world / 2 : 1, 1, 1, ScheduleKind::k1f1b};  // dp 2 (or 1)
  if (source.pp > 4) GTEST_SKIP() << "no two-rank data-parallel layout on " << world << " ranks";
  SharedTempDir dist_root, plain_root;
  const std::string dist_dir = save_after_two_steps(source, true, dist_root.path());
  const std::string plain_dir = save_after_two_steps(source, false, plain_root.path());
  if (g_world->rank() == 0) {
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json"}) {
      EXPECT_EQ(file_bytes(dist_dir + "/" + f), file_bytes(plain_dir + "/" + f)) << f;
    }
  }
  g_world->barrier();
  const CheckpointState saved = load_checkpoint(dist_dir);
  const ModelConfig m = odd_moe();
  RandomTokens tokens(m.vocab_size);
  int resumed = 0;
  for (const Case& c : cases()) {
    std::vector<StageState> after[2];
    StepResult step[2];
    for (const bool distributed : {false, true}) {
      TrainConfig t = train_for(c, distributed);
      t.global_batch_size = train_for(source, false).global_batch_size;  // the checkpoint's
      t.overlap_param_gather = distributed;
      Groups groups = testing::world_groups(c.pp, c.ep);
      PipelineTrainer trainer(m, t, schedule_of({c.pp, c.ep, c.v, c.kind}), groups, tokens);
      run_agreeing(*groups.world, [&] { EXPECT_EQ(restore_pipeline(trainer, saved), 2); });
      if (distributed) {
        const CheckpointState back = gather_checkpoint(trainer, {{"format", "test"}});
        if (groups.rank == 0) {  // by name: the files keep their own order
          ASSERT_EQ(back.optimizer.size(), saved.optimizer.size());
          std::map<std::string, Tensor> by_name(saved.optimizer.begin(), saved.optimizer.end());
          for (const auto& [name, t] : back.optimizer) {
            ASSERT_TRUE(by_name.count(name)) << name;
            expect_same(t, by_name.at(name).reshape(t.shape()), true,
                        c.name() + " restored " + name);
          }
        }
      }
      step[distributed] = trainer.step();
      after[distributed] = state_of(trainer);
    }
    EXPECT_EQ(step[1].iteration, 3);
    if (c.bitwise()) {
      EXPECT_EQ(step[1].loss, step[0].loss) << c.name();
    }
    for (size_t s = 0; s < after[1].size(); ++s) {
      const std::string where = c.name() + " resumed, stage " + std::to_string(s);
      expect_same(after[1][s].weights, after[0][s].weights, c.bitwise(), where + " weights");
      expect_same(after[1][s].exp_avg, after[0][s].exp_avg, c.bitwise(), where + " exp_avg");
    }
    ++resumed;
  }
  EXPECT_GT(resumed, 0);
}

}  // namespace
}  // namespace tandem::runtime
