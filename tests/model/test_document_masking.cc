// Megatron-LM's document masking through the model (Note [Document masking] in
// data/document_masks.h): with --reset-attention-mask and --document-positions a batch of packed
// documents is, per document, the documents run alone. The packed micro-batch's loss is the mean
// over its tokens, so it equals the documents' own mean losses weighed by their lengths, and its
// every gradient the same combination of theirs (fp64, CPU). Dense, MoE (no load-balancing loss:
// that one couples the documents of a micro-batch by design) and DeepSeek-V3's MLA with its
// interleaved RoPE.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "data/document_masks.h"
#include "grad_check.h"
#include "model/chunk.h"
#include "tiny.h"

namespace tandem::model {
namespace {

constexpr int32_t kEod = 10;  // the tiny models' last id

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32, MemCategory::kOther);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

struct LossAndGrads {
  double loss = 0;
  std::vector<double> grads;
};

// One forward and backward of `batch` sequences of cfg.seq_length tokens with the given weights
// (flat, as Parameters::flat_params) and document bounds (empty: none).
// loss_mask: the loss node's (empty: none).
LossAndGrads run(const ModelConfig& cfg, const std::vector<double>& weights,
                 const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                 int64_t batch, const data::DocumentMasks* masks,
                 const std::vector<float>& loss_mask = {}) {
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF64);
  EXPECT_EQ(params.numel(), static_cast<int64_t>(weights.size()));
  std::copy(weights.begin(), weights.end(), params.flat_params().data<double>());
  ModelChunk chunk(params);
  params.zero_grads();
  MicroBatchState mb;
  mb.ids = i32(ids);
  mb.targets = i32(targets);
  NodeContext c = context_of(chunk, batch, false);
  if (masks != nullptr) {
    c.key_begin = i32(masks->key_begin);
    c.positions = i32(masks->position);
  }
  if (!loss_mask.empty()) {
    c.loss_mask =
        Tensor::empty({static_cast<int64_t>(loss_mask.size())}, DType::kF32, MemCategory::kOther);
    std::copy(loss_mask.begin(), loss_mask.end(), c.loss_mask.data<float>());
    c.loss_tokens = std::count(loss_mask.begin(), loss_mask.end(), 1.0f);
  }
  if (params.aux_total().defined()) params.aux_total().zero_();
  chunk.forward(mb, c);
  LossAndGrads out;
  out.loss = mb.lm_loss() + mb.aux_loss();
  chunk.backward(mb, c);
  const double* g = params.flat_grads().data<double>();
  out.grads.assign(g, g + params.numel());
  return out;
}

// Two samples of 8 tokens: documents of 3 and 5 tokens (each ending in the eod), and of 2, 4 and
// 2 (the last cut off by the sample's end, as packing leaves it).
void check_packed_equals_alone(ModelConfig cfg, double tol = 1e-10) {
  cfg.seq_length = 8;
  cfg.moe_aux_loss_coeff = 0;
  const std::vector<std::vector<int32_t>> docs = {
      {3, 7, kEod}, {1, 4, 1, 5, kEod}, {9, kEod}, {2, 6, 5, kEod}, {8, 0}};
  std::vector<int32_t> ids;
  for (const auto& d : docs) ids.insert(ids.end(), d.begin(), d.end());
  ASSERT_EQ(ids.size(), 16u);
  // Each token's target: the next id of the stream (the eod's is the next document's first).
  std::vector<int32_t> targets(ids.begin() + 1, ids.end());
  targets.push_back(3);

  Parameters init(cfg, ChunkSpec::whole(cfg), DType::kF64);
  init.initialize(7);
  std::vector<double> weights(init.flat_params().data<double>(),
                              init.flat_params().data<double>() + init.numel());
  for (double& w : weights) w *= 10.0;  // as grad_check.h: every term of the gradient matters
  const data::DocumentMasks masks = data::document_masks(
      ids.data(), 2, 8, {.eod = kEod, .document_positions = true, .reset_attention_mask = true});
  const LossAndGrads packed = run(cfg, weights, ids, targets, 2, &masks);

  LossAndGrads want;
  want.grads.assign(weights.size(), 0.0);
  size_t at = 0;
  for (const auto& d : docs) {
    ModelConfig alone = cfg;
    alone.seq_length = static_cast<int64_t>(d.size());
    const std::vector<int32_t> t(targets.begin() + static_cast<std::ptrdiff_t>(at),
                                 targets.begin() + static_cast<std::ptrdiff_t>(at + d.size()));
    const LossAndGrads one = run(alone, weights, d, t, 1, nullptr);
    const double share = static_cast<double>(d.size()) / static_cast<double>(ids.size());
    want.loss += share * one.loss;
    for (size_t i = 0; i < weights.size(); ++i) want.grads[i] += share * one.grads[i];
    at += d.size();
  }
  EXPECT_NEAR(packed.loss, want.loss, tol * std::abs(want.loss));
  double scale = 0;
  for (double g : want.grads) scale = std::max(scale, std::abs(g));
  ASSERT_GT(scale, 0);
  for (size_t i = 0; i < weights.size(); ++i) {
    ASSERT_NEAR(packed.grads[i], want.grads[i], tol * scale) << "gradient element " << i;
  }
  // Without the masks the packed batch is another computation: the test can tell.
  const LossAndGrads plain = run(cfg, weights, ids, targets, 2, nullptr);
  EXPECT_GT(std::abs(plain.loss - want.loss), 1e-6);
}

TEST(DocumentMasking, DensePackedEqualsDocumentsAlone) {
  check_packed_equals_alone(testing::tiny_config(false));
}

TEST(DocumentMasking, MoePackedEqualsDocumentsAlone) {
  check_packed_equals_alone(testing::tiny_config(true));
}

TEST(DocumentMasking, Qwen3PackedEqualsDocumentsAlone) {
  check_packed_equals_alone(testing::tiny_qwen3_config());
}

TEST(DocumentMasking, DeepseekV3MlaPackedEqualsDocumentsAlone) {
  check_packed_equals_alone(testing::tiny_deepseek_v3_config(5));
}

// Positions alone (--document-positions without --reset-attention-mask): RoPE at the restarted
// positions equals the plain run when every sample is one document from position 0, and differs
// from it where a document starts inside a sample.
TEST(DocumentMasking, PositionsAloneMoveOnlyTheLaterDocuments) {
  ModelConfig cfg = testing::tiny_config(false);
  cfg.seq_length = 6;
  Parameters init(cfg, ChunkSpec::whole(cfg), DType::kF64);
  init.initialize(3);
  const std::vector<double> weights(init.flat_params().data<double>(),
                                    init.flat_params().data<double>() + init.numel());
  const std::vector<int32_t> one_doc = {1, 2, 3, 4, 5, 6}, two_docs = {1, 2, kEod, 4, 5, 6};
  const std::vector<int32_t> targets = {2, 3, 4, 5, 6, 7};
  for (const auto* ids : {&one_doc, &two_docs}) {
    data::DocumentMasks m =
        data::document_masks(ids->data(), 1, 6, {.eod = kEod, .document_positions = true});
    const LossAndGrads with = run(cfg, weights, *ids, targets, 1, &m);
    const LossAndGrads without = run(cfg, weights, *ids, targets, 1, nullptr);
    if (ids == &one_doc) {
      EXPECT_EQ(with.loss, without.loss);
    } else {
      EXPECT_GT(std::abs(with.loss - without.loss), 1e-9);
    }
  }
}

// --eod-mask-loss (Note [Loss mask] in model/end_nodes.cc) against the tokens' own losses: a
// mask keeping one token r gives that token's cross-entropy L_r and its gradient G_r; those of
// all tokens average to the unmasked loss and gradient (so they are the plain loss node's per
// token), and the eod mask's loss and gradient are the mean of L_r and G_r over exactly the
// tokens whose input is not the end-of-document id.
TEST(DocumentMasking, EodMaskLossDropsExactlyTheEodInputs) {
  ModelConfig cfg = testing::tiny_config(false);
  cfg.seq_length = 6;
  Parameters init(cfg, ChunkSpec::whole(cfg), DType::kF64);
  init.initialize(5);
  std::vector<double> weights(init.flat_params().data<double>(),
                              init.flat_params().data<double>() + init.numel());
  for (double& w : weights) w *= 10.0;
  const std::vector<int32_t> ids = {1, kEod, 3, 4, kEod, 6, kEod, 2, 9, 9, kEod, 0};
  const std::vector<int32_t> targets = {kEod, 3, 4, kEod, 6, kEod, 2, 9, 9, kEod, 0, 5};
  const auto n = static_cast<int64_t>(ids.size());
  const data::DocumentMasks masks =
      data::document_masks(ids.data(), 2, 6, {.eod = kEod, .eod_mask_loss = true});

  std::vector<LossAndGrads> one(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    std::vector<float> only(ids.size(), 0.0f);
    only[r] = 1.0f;
    one[r] = run(cfg, weights, ids, targets, 2, nullptr, only);
  }
  const auto mean_over = [&](const std::function<bool(size_t)>& keep) {
    LossAndGrads m;
    m.grads.assign(weights.size(), 0.0);
    double count = 0;
    for (size_t r = 0; r < ids.size(); ++r) count += keep(r) ? 1 : 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      if (!keep(r)) continue;
      m.loss += one[r].loss / count;
      for (size_t i = 0; i < weights.size(); ++i) m.grads[i] += one[r].grads[i] / count;
    }
    return m;
  };
  const auto expect_same = [&](const LossAndGrads& got, const LossAndGrads& want) {
    EXPECT_NEAR(got.loss, want.loss, 1e-12 * std::abs(want.loss));
    double scale = 0;
    for (double g : want.grads) scale = std::max(scale, std::abs(g));
    for (size_t i = 0; i < weights.size(); ++i) {
      ASSERT_NEAR(got.grads[i], want.grads[i], 1e-12 * scale) << "gradient element " << i;
    }
  };
  expect_same(run(cfg, weights, ids, targets, 2, nullptr), mean_over([](size_t) { return true; }));
  const LossAndGrads masked = run(cfg, weights, ids, targets, 2, nullptr, masks.loss_mask);
  expect_same(masked, mean_over([&](size_t r) { return ids[r] != kEod; }));
  int dropped = 0;
  for (int64_t r = 0; r < n; ++r) dropped += masks.loss_mask[static_cast<size_t>(r)] == 0 ? 1 : 0;
  EXPECT_EQ(dropped, 4);
}

}  // namespace
}  // namespace tandem::model
