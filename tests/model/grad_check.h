// The whole-model gradient check of tests/model: every parameter tensor's gradient against fp64
// central finite differences of the loss (lm loss + the router's losses) computed by the same
// forward. Routing is piecewise constant, so the perturbation is kept far below the smallest gap
// between router logits of the batch. With --mtp-num-layers the loss adds the MTP term; with
// `documents`, Megatron-LM's three document masks split the batch on one of its ids.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "data/document_masks.h"
#include "model/chunk.h"
#include "tiny.h"

namespace tandem::model {

// fused: the loss node through ops::lm_head_ce_* (the GPU's loss node), here in fp64 on the CPU.
// balanced: --moe-router-force-load-balancing (Note [Forced load balancing] in
// model/attention_node.cc), its random logits drawn from a fixed key.
inline NodeContext context_of(const ModelChunk& chunk, int64_t batch, bool fused,
                              bool balanced = false) {
  NodeContext c = chunk.context(batch, 1.0);
  c.fused_lm_head = fused;
  c.force_balanced_routing = balanced;
  c.routing_key = routing_key(7, 0, 0);
  return c;
}

// Megatron-LM's --reset-attention-mask, --document-positions and --eod-mask-loss of `ids` on the
// id `eod` (Note [Document masking] in data/document_masks.h), set into c as the trainers set
// them: the masks, the loss mask's count and each MTP depth's count in it rolled k left
// (Note [MTP loss mask] in model/mtp.cc), counted here from the mask.
struct DocumentMaskInputs {
  Tensor key_begin, positions, loss_mask;
  int64_t loss_tokens = 0;
  std::vector<int64_t> mtp_loss_tokens;
  void set(NodeContext& c) const {
    c.key_begin = key_begin;
    c.positions = positions;
    c.loss_mask = loss_mask;
    c.loss_tokens = loss_tokens;
    c.mtp_loss_tokens = mtp_loss_tokens;
  }
};

inline DocumentMaskInputs document_mask_inputs(const ModelConfig& cfg, const Tensor& ids,
                                               int64_t batch, int32_t eod) {
  const int64_t t = cfg.seq_length, n = batch * t;
  const data::DocumentMasks dm = data::document_masks(ids.data<int32_t>(), batch, t,
                                                      {.eod = eod,
                                                       .document_positions = true,
                                                       .reset_attention_mask = true,
                                                       .eod_mask_loss = true});
  DocumentMaskInputs in;
  in.key_begin = Tensor::empty({n}, DType::kI32, MemCategory::kOther, "key_begin");
  in.positions = Tensor::empty({n}, DType::kI32, MemCategory::kOther, "positions");
  in.loss_mask = Tensor::empty({n}, DType::kF32, MemCategory::kOther, "loss_mask");
  std::copy(dm.key_begin.begin(), dm.key_begin.end(), in.key_begin.data<int32_t>());
  std::copy(dm.position.begin(), dm.position.end(), in.positions.data<int32_t>());
  std::copy(dm.loss_mask.begin(), dm.loss_mask.end(), in.loss_mask.data<float>());
  for (int64_t i = 0; i < n; ++i) in.loss_tokens += dm.loss_mask[static_cast<size_t>(i)] == 1.0f;
  for (int64_t k = 1; k <= cfg.mtp_num_layers; ++k) {
    int64_t kept = 0;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i + k < t; ++i) kept += dm.loss_mask[b * t + i + k] == 1.0f;
    }
    in.mtp_loss_tokens.push_back(kept);
  }
  return in;
}

inline double run_loss(const ModelChunk& chunk, const Tensor& ids, const Tensor& targets,
                       int64_t batch, bool fused, MicroBatchState* keep = nullptr,
                       bool balanced = false, const DocumentMaskInputs* documents = nullptr) {
  MicroBatchState mb;
  mb.ids = ids;
  mb.targets = targets;
  NodeContext c = context_of(chunk, batch, fused, balanced);
  if (documents != nullptr) documents->set(c);
  // global_aux_loss: each evaluation a step of one micro-batch (a trainer zeroes the totals).
  if (chunk.params().aux_total().defined()) chunk.params().aux_total().zero_();
  // The finite-difference evaluations only want the loss: a fused loss node without grads
  // neither forms nor accumulates gradients (the analytic run, with `keep`, does).
  if (keep == nullptr) c.grads = nullptr;
  chunk.forward(mb, c);
  const double loss = mb.lm_loss() + mb.aux_loss() + mb.mtp_loss();
  if (keep) *keep = std::move(mb);
  return loss;
}

// eps: the central difference's step; truncation error grows with the loss's curvature, rounding
// error (about 1e-16 / eps) with its inverse.
// documents: the batch split on the id at its third position (so the batch holds at least one).
inline void check_gradients(const ModelConfig& cfg, bool fused = false, double eps = 1e-6,
                            bool documents = false) {
  const int64_t batch = 2, n = batch * cfg.seq_length;
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF64);
  params.initialize(7);
  // Larger weights than the 0.02 init, so every term of the gradient matters; biases (zero
  // at init) drawn too.
  for (int64_t i = 0; i < params.numel(); ++i) {
    params.flat_params().data<double>()[i] *= 10.0;
  }
  // Expert biases (kBuffer) drawn too, of the order of the sigmoid scores they shift: they
  // move the choice, and their gradient is zero (the choice is piecewise constant in them).
  for (const ParamEntry& e : params.entries()) {
    if (e.kind != ParamKind::kBias && e.kind != ParamKind::kBuffer) continue;
    const double scale = e.kind == ParamKind::kBuffer ? 0.2 : 1.0;
    for (int64_t j = 0; j < shape_numel(e.shape); ++j) {
      params.flat_params().data<double>()[e.offset + j] =
          scale * normal01(99, static_cast<uint64_t>(j));
    }
  }
  ModelChunk chunk(params);
  const Tensor ids = testing::random_ids(n, cfg.vocab_size, 1);
  const Tensor targets = testing::random_ids(n, cfg.vocab_size, 2);

  DocumentMaskInputs masks;
  if (documents) masks = document_mask_inputs(cfg, ids, batch, ids.data<int32_t>()[2]);
  const DocumentMaskInputs* dm = documents ? &masks : nullptr;

  params.zero_grads();
  MicroBatchState mb;
  run_loss(chunk, ids, targets, batch, fused, &mb, false, dm);
  NodeContext bc = context_of(chunk, batch, fused);
  if (dm != nullptr) dm->set(bc);
  chunk.backward(mb, bc);

  double* p = params.flat_params().data<double>();
  const double* g = params.flat_grads().data<double>();
  int checked = 0;
  for (const ParamEntry& e : params.entries()) {
    const int64_t count = shape_numel(e.shape);
    for (int64_t j = 0; j < count; j += std::max<int64_t>(1, count / 5)) {
      const int64_t i = e.offset + j;
      const double saved = p[i];
      p[i] = saved + eps;
      const double up = run_loss(chunk, ids, targets, batch, fused, nullptr, false, dm);
      p[i] = saved - eps;
      const double down = run_loss(chunk, ids, targets, batch, fused, nullptr, false, dm);
      p[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double tol = 1e-6 * std::max(1.0, std::abs(numeric)) + 1e-8;
      EXPECT_NEAR(g[i], numeric, tol) << e.name << " element " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

}  // namespace tandem::model
