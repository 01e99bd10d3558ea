// Tensor parallelism of a dense Llama model (GQA attention, SwiGLU MLP; Note [Tensor parallelism]
// in core/config_tp.cc) on CPU ranks, float64: TP 2 alone and with data parallelism on every
// world of an even size, against the one-rank sequential reference (runtime::ReferenceTrainer,
// computed on every rank). Each rank's shards are gathered over the tensor-parallel group into
// the whole tensor by the definition of the split (rows of q/k/v and gate/up, columns of o and
// down: Note [Tensor-parallel shards] in model/parameters.h), written out here independently of
// Parameters::model_index. Checked: the initial weights bitwise, and over three steps (clipping
// on) the loss, the gradient norm and every gradient within 1e-9 relative, the replicated
// tensors' gradients bitwise equal on every tensor-parallel rank, and the weights after the steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "dist_env.h"
#include "layouts.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {
namespace {

using testing::g_world;

// Four query heads in two groups (GQA), so TP 2 gives each rank two heads of one group.
ModelConfig tp_tiny(bool tied) {
  ModelConfig m = testing::dist_tiny(false);
  m.num_layers = 2;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.untie_embeddings_and_output_weights = !tied;
  return m;
}

using testing::rel_diff;

// The whole tensor of which `mine` (entry e's shard on this rank) is tp rank tp->rank()'s part,
// gathered over `tp`; `replicated_equal` is cleared when a replicated entry differs between ranks.
Tensor gather_whole(const model::ParamEntry& e, const Tensor& mine, comm::Communicator& tp,
                    bool& replicated_equal) {
  const int n = tp.size();
  const int64_t numel = mine.numel();
  const Tensor all = Tensor::empty({n * numel}, DType::kF64, MemCategory::kOther, "gathered");
  tp.all_gather(all, mine.reshape({numel}));
  const double* a = all.data<double>();
  if (e.tp_split == model::TpSplit::kReplicated) {
    for (int k = 1; k < n; ++k) {
      replicated_equal = replicated_equal && std::equal(a, a + numel, a + k * numel);
    }
    Tensor out = Tensor::empty(e.shape, DType::kF64, MemCategory::kOther, "whole");
    std::copy(a, a + numel, out.data<double>());
    return out;
  }
  Shape whole = e.shape;
  if (e.tp_split == model::TpSplit::kRows) {  // [out/tp, in] blocks one after another
    whole[0] *= n;
    Tensor out = Tensor::empty(whole, DType::kF64, MemCategory::kOther, "whole");
    std::copy(a, a + n * numel, out.data<double>());
    return out;
  }
  const int64_t cols = e.shape[1], rows = e.shape[0];  // [out, in/tp]: rank k's column block
  whole[1] *= n;
  Tensor out = Tensor::empty(whole, DType::kF64, MemCategory::kOther, "whole");
  for (int k = 0; k < n; ++k) {
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(a + k * numel + r * cols, a + k * numel + (r + 1) * cols,
                out.data<double>() + r * cols * n + k * cols);
    }
  }
  return out;
}

enum class Of : uint8_t { kWeights, kGradients };

// Compares every entry of the trainer's stage, gathered whole, with the reference's of that name
// within `tol` (0: bitwise); returns how many entries it compared.
int compare_whole(PipelineTrainer& trainer, Groups& groups, const model::Parameters& reference,
                  Of of, double tol, const std::string& what) {
  std::map<std::string, const model::ParamEntry*> by_name;
  for (const model::ParamEntry& e : reference.entries()) by_name[e.name] = &e;
  int compared = 0, split = 0;
  bool replicated_equal = true;
  for (StageRuntime& s : trainer.stages()) {
    for (const model::ParamEntry& e : s.params->entries()) {
      const Tensor mine = of == Of::kWeights ? s.params->param(e) : s.params->grad(e);
      const Tensor got = gather_whole(e, mine, *groups.tp, replicated_equal);
      const model::ParamEntry& r = *by_name.at(e.name);
      const Tensor want = of == Of::kWeights ? reference.param(r) : reference.grad(r);
      EXPECT_EQ(got.shape(), want.shape()) << what << ": " << e.name;
      if (got.shape() != want.shape()) continue;
      const double d = rel_diff(got, want);
      if (tol == 0) {
        EXPECT_EQ(d, 0) << what << ": " << e.name;
      } else {
        EXPECT_LT(d, tol) << what << ": " << e.name;
      }
      ++compared;
      split += e.tp_split != model::TpSplit::kReplicated;
    }
  }
  EXPECT_TRUE(replicated_equal) << what << ": a replicated tensor differs between tp ranks";
  EXPECT_EQ(split, 2 * 7) << what << ": q, k, v, o, gate, up and down of each layer are split";
  EXPECT_EQ(compared, static_cast<int>(reference.entries().size())) << what;
  return compared;
}

void run_tp2(bool tied, schedule::ScheduleKind kind) {
  const int world = g_world->size();
  if (world % 2 != 0) GTEST_SKIP() << "TP 2 needs an even number of ranks";
  const int dp = world / 2;
  const ModelConfig m = tp_tiny(tied);
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 2 * dp;
  t.train_iters = 3;
  t.lr = 1e-2;
  t.clip_grad = 0.05;  // small enough to clip: the norm must count each weight once
  const std::optional<schedule::Schedule> sched = testing::layout_schedule({1, 1, 1, kind}, 2);
  ASSERT_TRUE(sched.has_value());
  testing::RandomTokens data(m.vocab_size);
  ReferenceTrainer reference(m, t, data, DType::kF64);
  Groups groups = testing::world_groups(1, 1, 2);
  PipelineTrainer trainer(m, t, *sched, groups, data, DType::kF64);
  std::ostringstream what;
  what << "tp2 dp" << dp << (tied ? " tied" : "") << " " << schedule::schedule_kind_name(kind)
       << " on rank " << g_world->rank();
  ASSERT_EQ(trainer.stages().size(), 1u);
  EXPECT_EQ(trainer.stages()[0].params->config().num_attention_heads, 2) << what.str();
  compare_whole(trainer, groups, reference.params(), Of::kWeights, 0, what.str() + " initial");
  for (int step = 1; step <= 3; ++step) {
    const StepResult want = reference.step();
    const StepResult got = trainer.step();
    const std::string at = what.str() + " step " + std::to_string(step);
    EXPECT_NEAR(got.loss, want.loss, 1e-9 * std::abs(want.loss)) << at;
    EXPECT_NEAR(got.grad_norm, want.grad_norm, 1e-9 * want.grad_norm) << at;
    EXPECT_GT(want.grad_norm, t.clip_grad) << at << ": clipping is not exercised";
    compare_whole(trainer, groups, reference.params(), Of::kGradients, 1e-9, at);
  }
  compare_whole(trainer, groups, reference.params(), Of::kWeights, 1e-9, what.str() + " after");
  if (g_world->rank() == 0) std::cout << "  checked " << what.str() << "\n";
}

TEST(TensorParallel, DenseTp2IsTheOneRank) { run_tp2(false, schedule::ScheduleKind::k1f1b); }
TEST(TensorParallel, DenseTp2TiedIsTheOneRank) { run_tp2(true, schedule::ScheduleKind::k1f1b); }
TEST(TensorParallel, DenseTp2CombinedIsTheOneRank) {
  run_tp2(false, schedule::ScheduleKind::kCombined1f1b);
}

}  // namespace
}  // namespace tandem::runtime
