// Note [Forward-only evaluation] on every schedule and parallel layout (PP up to 4, EP up to 4,
// data parallel), for a dense and a MoE model, in fp64. Oracles: runtime::ReferenceTrainer on
// one rank, computed on every rank: its forward_backward losses of the same batches (bitwise
// when only the pipeline is split, else within 1e-12, as tests/dist/test_equivalence.cc holds
// the step); every rank's result against rank 0's, bit for bit; and a trainer that never
// evaluates, whose steps an evaluating one must repeat bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <sstream>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "dist_env.h"
#include "layouts.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/generators.h"
#include "schedule/validator.h"

namespace tandem::runtime {
namespace {

using testing::g_world;
using testing::RandomTokens;

// Other samples than the training data's: the validation set of the tests.
class HeldOutTokens : public data::Dataset {
 public:
  explicit HeldOutTokens(int64_t vocab) : tokens_(vocab) {}
  void sample(int64_t index, int32_t* out, int64_t length) const override {
    tokens_.sample(index + 1'000'003, out, length);
  }
  int64_t vocab_size() const override { return tokens_.vocab_size(); }
  std::string describe() const override { return "held-out random tokens"; }

 private:
  RandomTokens tokens_;
};

using testing::dist_tiny;
using testing::world_groups;

// Rank 0's value of `v` on every rank, bit for bit.
bool same_on_every_rank(double v) {
  std::string mine(sizeof v, '\0');
  std::memcpy(mine.data(), &v, sizeof v);
  const std::vector<std::string> all = g_world->all_gather_bytes(mine);
  for (const std::string& other : all) {
    if (other != all[0]) return false;
  }
  return true;
}

// Evaluates two batches on every rank against the reference; false when the schedule does not
// take the shape.
bool run_case(bool moe, const testing::Layout& c, int dp) {
  const ModelConfig m = dist_tiny(moe);
  TrainConfig t;
  t.micro_batch_size = 1;
  const int32_t mb_per_rank = 2 * c.pp;
  t.global_batch_size = mb_per_rank * dp;
  const std::optional<schedule::Schedule> sched = testing::layout_schedule(c, mb_per_rank);
  if (!sched) return false;
  RandomTokens train_data(m.vocab_size);
  HeldOutTokens valid(m.vocab_size);

  ReferenceTrainer reference(m, t, valid, DType::kF64);
  const StepResult b0 = reference.forward_backward(0), b1 = reference.forward_backward(1);
  const double want_lm = (b0.lm_loss + b1.lm_loss) / 2, want_aux = (b0.aux_loss + b1.aux_loss) / 2;

  Groups groups = world_groups(c.pp, c.ep);
  PipelineTrainer trainer(m, t, *sched, groups, train_data, DType::kF64);
  const EvalResult got = trainer.evaluate(valid, 2);

  std::ostringstream what;
  what << (moe ? "moe " : "dense ") << schedule::schedule_kind_name(c.kind) << " pp" << c.pp
       << " ep" << c.ep << " dp" << dp << " v" << c.v
       << (c.pair_first_forwards ? " paired first forwards" : "") << " on rank " << g_world->rank();
  EXPECT_EQ(got.batches, 2) << what.str();
  EXPECT_EQ(got.tokens, 2 * t.global_batch_size * m.seq_length) << what.str();
  if (c.ep == 1 && dp == 1) {
    EXPECT_EQ(got.lm_loss, want_lm) << what.str();
    EXPECT_EQ(got.aux_loss, want_aux) << what.str();
  } else {
    EXPECT_NEAR(got.lm_loss, want_lm, 1e-12 * want_lm) << what.str();
    EXPECT_NEAR(got.aux_loss, want_aux, 1e-12 * std::max(want_aux, 1e-300)) << what.str();
  }
  EXPECT_TRUE(same_on_every_rank(got.lm_loss)) << what.str();
  EXPECT_TRUE(same_on_every_rank(got.aux_loss)) << what.str();
  return true;
}

void run_matrix(bool moe) {
  const int world = g_world->size();
  const int ran = testing::for_each_layout(
      moe, [&](const testing::Layout& l, int dp) { return run_case(moe, l, dp); });
  if (world == 1 || world == 2 || world == 4 || world == 8) {
    EXPECT_GT(ran, 0) << "no case ran on " << world << " ranks";
  }
}

TEST(Evaluate, DenseEveryScheduleAsTheReference) { run_matrix(false); }
TEST(Evaluate, MoeEveryScheduleAsTheReference) { run_matrix(true); }

// Steps, an evaluation, steps: the same losses, gradient norms, weights and routing as the
// steps alone, bit for bit, with the optimizer update deferred into the next step (which the
// evaluation finishes first) on combined 1F1B and on 1F1B with two stages where there are
// ranks for them.
TEST(Evaluate, LeavesTrainingAsItWas) {
  const int world = g_world->size();
  const ModelConfig m = dist_tiny(true);
  RandomTokens train_data(m.vocab_size);
  HeldOutTokens valid(m.vocab_size);
  for (int pp : {1, 2}) {
    if (world % pp != 0) continue;
    const int ep = (world / pp) % 2 == 0 ? 2 : 1;
    TrainConfig t;
    t.micro_batch_size = 1;
    t.global_batch_size = 4 * world / pp;
    t.defer_optimizer = true;
    const auto kind =
        pp == 1 ? schedule::ScheduleKind::kCombined1f1b : schedule::ScheduleKind::k1f1b;
    const schedule::Schedule sched = schedule::generate_schedule(kind, {pp, 1, 4, false});
    Groups g1 = world_groups(pp, ep), g2 = world_groups(pp, ep);
    PipelineTrainer plain(m, t, sched, g1, train_data);
    PipelineTrainer evaluating(m, t, sched, g2, train_data);
    std::ostringstream what;
    what << "pp" << pp << " ep" << ep << " on rank " << g_world->rank();
    for (int it = 0; it < 3; ++it) {
      const StepResult a = plain.step();
      (void)evaluating.evaluate(valid, 1);
      const StepResult b = evaluating.step();
      EXPECT_EQ(a.loss, b.loss) << what.str() << " step " << it + 1;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << what.str() << " step " << it + 1;
      EXPECT_EQ(plain.routing_counts().expert_rows, evaluating.routing_counts().expert_rows)
          << what.str();
    }
    for (size_t s = 0; s < plain.stages().size(); ++s) {
      const Tensor& wa = plain.stages()[s].params->flat_params();
      const Tensor& wb = evaluating.stages()[s].params->flat_params();
      ASSERT_EQ(wa.numel(), wb.numel());
      EXPECT_EQ(std::memcmp(wa.data<float>(), wb.data<float>(), wa.nbytes()), 0) << what.str();
    }
  }
}

}  // namespace
}  // namespace tandem::runtime
