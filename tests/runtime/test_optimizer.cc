// Clipping against its formula evaluated by hand (the learning-rate schedule: test_lr_schedule.cc);
// AdamW with the clipping coefficient as its gradient scale against the step as it was before the
// two were fused (ops::scale over the gradients, then ops::adamw_step entry by entry), bit for bit;
// --decoupled-lr's rate on the embedding and output layer only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/chunk.h"
#include "ops/ops.h"
#include "runtime/optimizer.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {
namespace {

ModelConfig one_layer_dense() {
  ModelConfig m;
  m.vocab_size = 4;
  m.hidden_size = 2;
  m.num_layers = 1;
  m.num_attention_heads = 1;
  m.num_query_groups = 1;
  m.ffn_hidden_size = 2;
  m.num_experts = 0;
  m.untie_embeddings_and_output_weights = true;  // the output layer an entry of its own
  return m;
}

TEST(Clip, CoefficientOnlyAboveTheLimit) {
  const ModelConfig m = one_layer_dense();
  model::Parameters p(m, model::ChunkSpec::whole(m), DType::kF64);
  for (int64_t i = 0; i < p.numel(); ++i) p.flat_grads().data<double>()[i] = 1.0;
  const double norm = std::sqrt(grad_sum_squares(p));
  EXPECT_DOUBLE_EQ(norm, std::sqrt(static_cast<double>(p.numel())));
  EXPECT_EQ(clip_coefficient(norm, 100.0), 1.0);
  EXPECT_EQ(clip_coefficient(norm, 0.0), 1.0);  // no clipping
  const double coeff = clip_coefficient(norm, 1.0);
  EXPECT_NEAR(coeff, 1.0 / (norm + 1e-6), 1e-15);
  ops::scale(p.flat_grads(), coeff);
  EXPECT_NEAR(std::sqrt(grad_sum_squares(p)), 1.0, 1e-6);
}

// Megatron-LM's default rule: every 2-D weight decays, the embedding table and the LM head
// included; vectors (norm gains, biases) do not.
TEST(AdamW, DecaysEveryMatrixButNotNormsOrBiases) {
  ModelConfig m = one_layer_dense();  // with Qwen2-MoE's q, k, v biases: a shared expert
  m.num_experts = 2;
  m.moe_router_topk = 1;
  m.moe_shared_expert_intermediate_size = 2;
  m.moe_shared_expert_gate = true;
  m.add_qkv_bias = true;
  model::Parameters p(m, model::ChunkSpec::whole(m), DType::kF64);
  p.initialize(1);
  TrainConfig t;
  t.weight_decay = 0.5;
  AdamW opt(p, t);
  p.zero_grads();  // zero gradient: only the decay moves the weights
  const model::ModelWeights& w = p.weights();
  w.layers[0].bq.data<double>()[0] = 0.25;  // a bias starts at zero, which would hide a decay
  const double norm_before = w.layers[0].input_norm.data<double>()[0];
  const double bias_before = w.layers[0].bq.data<double>()[0];
  const double wq_before = w.layers[0].wq.data<double>()[0];
  const double emb_before = w.embed.data<double>()[0];
  const double head_before = w.lm_head.data<double>()[0];
  opt.step(0.1, 1.0);
  EXPECT_EQ(w.layers[0].input_norm.data<double>()[0], norm_before);
  EXPECT_EQ(w.layers[0].bq.data<double>()[0], bias_before);
  EXPECT_NEAR(w.embed.data<double>()[0], emb_before * (1 - 0.1 * 0.5), 1e-15);
  EXPECT_NEAR(w.lm_head.data<double>()[0], head_before * (1 - 0.1 * 0.5), 1e-15);
  EXPECT_NEAR(w.layers[0].wq.data<double>()[0], wq_before * (1 - 0.1 * 0.5), 1e-15);
}

template <typename T>
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data<T>(), b.data<T>(), static_cast<size_t>(a.numel()) * sizeof(T)) == 0;
}

// Three steps with gradients clipped by a coefficient below one (and one at one), weight decay on:
// AdamW::step(lr, coeff) against ops::scale(grads, coeff) then the per-entry ops::adamw_step.
template <typename T>
void check_scale_fused_into_step(DType dt) {
  const ModelConfig m = one_layer_dense();
  const model::ChunkSpec whole = model::ChunkSpec::whole(m);
  model::Parameters fused(m, whole, dt), ref(m, whole, dt);
  fused.initialize(3);
  ref.initialize(3);
  TrainConfig t;
  t.weight_decay = 0.1;
  AdamW opt(fused, t);
  const Tensor rm = Tensor::zeros({ref.numel()}, dt, MemCategory::kOptimizer, "ref.m");
  const Tensor rv = Tensor::zeros({ref.numel()}, dt, MemCategory::kOptimizer, "ref.v");
  for (int64_t step = 1; step <= 3; ++step) {
    for (int64_t i = 0; i < fused.numel(); ++i) {
      const T g = static_cast<T>(std::sin(0.37 * static_cast<double>(i + 11 * step)));
      fused.flat_grads().data<T>()[i] = g;
      ref.flat_grads().data<T>()[i] = g;
    }
    const Tensor grads_before = fused.flat_grads().to(Device::kCPU);
    const double norm = std::sqrt(grad_sum_squares(fused));
    const double coeff = clip_coefficient(norm, step == 2 ? 1e9 : 0.5);
    ASSERT_EQ(coeff < 1.0, step != 2);
    const double lr = 1e-2 * static_cast<double>(step);
    opt.step(lr, coeff);
    if (coeff != 1.0) ops::scale(ref.flat_grads(), coeff);
    for (const model::ParamEntry& e : ref.entries()) {
      const int64_t n = shape_numel(e.shape);
      // Megatron-LM's rule by name and shape: no decay on a bias or a vector.
      const bool bias = e.name.ends_with(".bias");
      const double wd = e.shape.size() >= 2 && !bias ? t.weight_decay : 0.0;
      ops::adamw_step(ref.param(e), ref.grad(e), rm.narrow_rows(e.offset, n).reshape(e.shape),
                      rv.narrow_rows(e.offset, n).reshape(e.shape),
                      {lr, t.adam_beta1, t.adam_beta2, t.adam_eps, wd, step});
    }
    EXPECT_TRUE(same_bits<T>(fused.flat_params(), ref.flat_params())) << "step " << step;
    EXPECT_TRUE(same_bits<T>(opt.exp_avg(), rm)) << "step " << step;
    EXPECT_TRUE(same_bits<T>(opt.exp_avg_sq(), rv)) << "step " << step;
    EXPECT_TRUE(same_bits<T>(fused.flat_grads(), grads_before)) << "the step scaled the gradients";
  }
}

TEST(AdamW, GradScaleEqualsScaleThenStepF32) { check_scale_fused_into_step<float>(DType::kF32); }
TEST(AdamW, GradScaleEqualsScaleThenStepF64) { check_scale_fused_into_step<double>(DType::kF64); }

// Note [Deferred update]: the same three steps (clipped, weight decay on) split into pieces at
// odd element boundaries, inside matrices and across a norm, with new gradients written between
// steps as a step would (added to zeros): bitwise the one-pass step. Each piece zeroes exactly
// the gradients it read; step() and defer_step() refuse to start while a step is unfinished.
TEST(AdamW, DeferredStepInPiecesIsTheStepBitwise) {
  const ModelConfig m = one_layer_dense();
  const model::ChunkSpec whole = model::ChunkSpec::whole(m);
  model::Parameters one(m, whole, DType::kF32), pieces(m, whole, DType::kF32);
  one.initialize(5);
  pieces.initialize(5);
  TrainConfig t;
  t.weight_decay = 0.1;
  AdamW a(one, t), b(pieces, t);
  const int64_t n = one.numel();
  ASSERT_GT(n, 40);
  for (int64_t step = 1; step <= 3; ++step) {
    for (int64_t i = 0; i < n; ++i) {
      const auto g = static_cast<float>(std::cos(0.29 * static_cast<double>(i + 7 * step)));
      one.flat_grads().data<float>()[i] = g;
      // Zero (the last piece cleared them) plus this step's gradient.
      ASSERT_EQ(pieces.flat_grads().data<float>()[i], 0.0f) << "step " << step << ", " << i;
      pieces.flat_grads().data<float>()[i] += g;
    }
    const double coeff = step == 2 ? 1.0 : 0.3, lr = 1e-2 * static_cast<double>(step);
    a.step(lr, coeff);
    b.defer_step(UpdateRates{lr, lr}, coeff);
    EXPECT_EQ(b.steps(), step);
    EXPECT_TRUE(b.update_pending());
    EXPECT_THROW(b.step(lr, coeff), Error);
    EXPECT_THROW(b.defer_step(UpdateRates{lr, lr}, coeff), Error);
    for (const int64_t end : {int64_t{3}, int64_t{3}, n / 3 + 1, n - 7}) {
      b.update_until(end);
      EXPECT_EQ(b.updated_until(), end);
      for (int64_t i = 0; i < n; ++i) {
        const bool zeroed = pieces.flat_grads().data<float>()[i] == 0.0f;
        EXPECT_EQ(zeroed, i < end) << "step " << step << ", piece to " << end << ", element " << i;
      }
    }
    b.finish_step();
    EXPECT_FALSE(b.update_pending());
    EXPECT_TRUE(same_bits<float>(pieces.flat_params(), one.flat_params())) << "step " << step;
    EXPECT_TRUE(same_bits<float>(b.exp_avg(), a.exp_avg())) << "step " << step;
    EXPECT_TRUE(same_bits<float>(b.exp_avg_sq(), a.exp_avg_sq())) << "step " << step;
  }
}

// Note [Decoupled learning rate]: with the embedding's and output layer's rate apart, over four
// steps of gradients that do not depend on the weights (so each element's update reads only its
// own weight, gradient and moments: elements at one rate cannot tell which other rates ran), the
// embedding's and output layer's elements are bitwise those of a run with every weight at their
// rate, and every other element those of a run at the base rate. Whole, sharded (owned ranges
// cut inside the embedding and the output layer) and deferred in pieces cut there.
TEST(AdamW, DecoupledRateMovesOnlyTheEmbeddingAndOutputLayer) {
  ModelConfig m = one_layer_dense();
  m.vocab_size = 8;
  const model::ChunkSpec whole = model::ChunkSpec::whole(m);
  model::Parameters mixed(m, whole, DType::kF32), at_x(m, whole, DType::kF32),
      at_base(m, whole, DType::kF32), sharded(m, whole, DType::kF32),
      deferred(m, whole, DType::kF32);
  for (model::Parameters* p : {&mixed, &at_x, &at_base, &sharded, &deferred}) p->initialize(9);
  int64_t embed_end = 0, head_begin = 0, head_end = 0;
  for (const model::ParamEntry& e : mixed.entries()) {
    if (e.name == "model.embed_tokens.weight") embed_end = e.offset + shape_numel(e.shape);
    if (e.name == "lm_head.weight") {
      head_begin = e.offset;
      head_end = e.offset + shape_numel(e.shape);
    }
  }
  const int64_t n = mixed.numel();
  ASSERT_EQ(embed_end, 16);  // the first entry
  ASSERT_GT(head_begin, embed_end);
  ASSERT_EQ(head_end, n);  // the last entry of a chunk without MTP
  TrainConfig t;
  t.weight_decay = 0.1;
  AdamW a(mixed, t), x(at_x, t), base(at_base, t), d(deferred, t);
  // Two owned ranges, each ending inside a decoupled weight: [5, head_begin + 3), [head_begin + 5,
  // n); elements outside them stay as initialized.
  const std::vector<OwnedRange> owned = {{5, head_begin - 2, 0},
                                         {head_begin + 5, n - head_begin - 5, head_begin - 2}};
  AdamW s(sharded, t, owned, n - 7);
  auto in_owned = [&](int64_t i) { return (i >= 5 && i < head_begin + 3) || i >= head_begin + 5; };
  auto decoupled = [&](int64_t i) { return i < embed_end || i >= head_begin; };
  for (int64_t step = 1; step <= 4; ++step) {
    for (model::Parameters* p : {&mixed, &at_x, &at_base, &sharded, &deferred}) {
      for (int64_t i = 0; i < n; ++i) {
        p->flat_grads().data<float>()[i] =
            static_cast<float>(std::sin(0.37 * static_cast<double>(i + 11 * step)));
      }
    }
    const double lr = 1e-2 / static_cast<double>(step), rate_x = 3e-2 * static_cast<double>(step);
    const double coeff = step == 3 ? 0.5 : 1.0;
    a.step(UpdateRates{lr, rate_x}, coeff);
    x.step(rate_x, coeff);
    base.step(lr, coeff);
    s.step(UpdateRates{lr, rate_x}, coeff);
    d.defer_step(UpdateRates{lr, rate_x}, coeff);
    for (const int64_t end : {int64_t{3}, embed_end + 2, head_begin + 1, n - 2})
      d.update_until(end);
    d.finish_step();
    const float* got = mixed.flat_params().data<float>();
    const float* want_x = at_x.flat_params().data<float>();
    const float* want_base = at_base.flat_params().data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float want = decoupled(i) ? want_x[i] : want_base[i];
      EXPECT_EQ(got[i], want) << "step " << step << ", element " << i;
      EXPECT_EQ(deferred.flat_params().data<float>()[i], want)
          << "step " << step << ", element " << i;
      if (in_owned(i)) {
        EXPECT_EQ(sharded.flat_params().data<float>()[i], want) << "step " << step << ", " << i;
      }
      if (decoupled(i)) {
        EXPECT_NE(want_x[i], want_base[i]) << "element " << i;
      }
    }
  }
}

// Note [The update beside the first forward]: before each node the deferred update reaches
// exactly the end of the weights that node reads (no further, or the all-to-all before the node
// would have less to overlap): the embedding's, each layer's attention side up to its router,
// then its experts' or mlp's, the head's; dispatch and combine none. For a whole MoE model, a
// middle pipeline stage (no embedding, no head, half the experts) and a dense model.
TEST(DeferredUpdate, EachNodeUpdatesExactlyTheWeightsItReads) {
  ModelConfig moe = one_layer_dense();
  moe.num_layers = 4;
  moe.num_experts = 4;
  moe.moe_router_topk = 2;
  ModelConfig dense = moe;
  dense.num_experts = 0;
  model::ChunkSpec middle = model::ChunkSpec::whole(moe);
  middle.layer_begin = 1;
  middle.layer_end = 3;
  middle.has_embed = middle.has_head = false;
  middle.expert_begin = 2;
  middle.expert_end = 4;
  for (const auto& [m, spec] :
       {std::pair{moe, model::ChunkSpec::whole(moe)}, std::pair{moe, middle},
        std::pair{dense, model::ChunkSpec::whole(dense)}}) {
    const model::Parameters p(m, spec, DType::kF32);
    const model::ModelChunk chunk(p);
    const std::vector<int64_t> ends = node_weight_ends(p, chunk.nodes());
    ASSERT_EQ(ends.size(), chunk.nodes().size());
    auto end_of = [&](const std::string& name) {
      for (const model::ParamEntry& e : p.entries()) {
        if (e.name == name) return e.offset + shape_numel(e.shape);
      }
      ADD_FAILURE() << "no weight " << name;
      return int64_t{-1};
    };
    int64_t before = 0;
    for (size_t i = 0; i < ends.size(); ++i) {
      const model::NodeRef n = chunk.nodes()[i];
      const std::string layer = "model.layers." + std::to_string(spec.layer_begin + n.layer) + ".";
      int64_t want = before;
      switch (n.kind) {
        case NodeKind::kEmbed:
          want = end_of("model.embed_tokens.weight");
          break;
        case NodeKind::kAttention:
          want = end_of(layer + (m.is_moe() ? "block_sparse_moe.gate.weight"
                                            : "post_attention_layernorm.weight"));
          break;
        case NodeKind::kExperts:
          want = end_of(layer + "block_sparse_moe.experts." + std::to_string(spec.expert_end - 1) +
                        ".w2.weight");
          break;
        case NodeKind::kMlp:
          want = end_of(layer + "mlp.down_proj.weight");
          break;
        case NodeKind::kLoss:
          want = p.numel();
          break;
        default:
          break;
      }
      EXPECT_EQ(ends[i], want) << "node " << i << " (" << node_kind_name(n.kind) << ")";
      before = ends[i];
    }
    EXPECT_EQ(ends.back(), spec.has_head
                               ? p.numel()
                               : end_of("model.layers." + std::to_string(spec.layer_end - 1) +
                                        ".block_sparse_moe.experts." +
                                        std::to_string(spec.expert_end - 1) + ".w2.weight"));
  }
}

}  // namespace
}  // namespace tandem::runtime
