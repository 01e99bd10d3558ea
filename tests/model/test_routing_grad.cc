// Megatron-LM's routing options on the whole model (docs/model.md "Load balancing", "Expert
// capacity"): the z-loss, every load-balancing type on the softmax and the sigmoid router, and
// dropping past an expert's capacity (both policies, with and without padding), every weight's
// gradient against fp64 central finite differences (grad_check.h); forced balancing's random
// logits against their definition, and its straight-through gradient against the plain model
// whose router weights give exactly those logits (the estimator's gradient is then the loss's).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/footprint.h"
#include "grad_check.h"
#include "model/chunk.h"
#include "tiny.h"

namespace tandem::model {
namespace {

TEST(RoutingGradient, ZLossMatchesFiniteDifferences) {
  ModelConfig softmax = testing::tiny_config(true);
  softmax.moe_z_loss_coeff = 0.3;
  check_gradients(softmax);
  ModelConfig sigmoid = testing::tiny_deepseek_v3_config(5);
  sigmoid.moe_z_loss_coeff = 0.3;
  check_gradients(sigmoid, false, 3e-8);
}

// aux_loss, seq_aux_loss, global_aux_loss (one micro-batch: its own counts) and none, each on
// the softmax router (Mixtral) and the sigmoid one (DeepSeek-V3, with its bias and groups: the
// loss's counts are the top k of the unbiased scores).
TEST(RoutingGradient, EveryLoadBalancingTypeMatchesFiniteDifferences) {
  for (const char* type : {"aux_loss", "seq_aux_loss", "global_aux_loss", "none"}) {
    SCOPED_TRACE(type);
    ModelConfig softmax = testing::tiny_config(true);
    softmax.moe_router_load_balancing_type = type;
    softmax.moe_aux_loss_coeff = 0.4;
    check_gradients(softmax);
    ModelConfig sigmoid = testing::tiny_deepseek_v3_config(5);
    sigmoid.moe_router_load_balancing_type = type;
    sigmoid.moe_aux_loss_coeff = 0.4;
    check_gradients(sigmoid, false, 3e-8);
  }
}

// A capacity of ceil(10 x 2 / 4 x 0.5) = 3 rows an expert for about 5 routed: rows dropped by
// either policy, padded to 3 or not; the dropped rows' weights get no gradient, the rest the
// loss's. The fused loss node too (the GPU's).
TEST(RoutingGradient, ExpertCapacityMatchesFiniteDifferences) {
  for (const char* policy : {"probs", "position"}) {
    for (const bool pad : {false, true}) {
      SCOPED_TRACE(std::string(policy) + (pad ? ", padded" : ""));
      ModelConfig c = testing::tiny_config(true);
      c.moe_expert_capacity_factor = 0.5;
      c.moe_token_drop_policy = policy;
      c.moe_pad_expert_input_to_capacity = pad;
      ASSERT_EQ(moe_expert_capacity(c, 2 * c.seq_length), 3);
      check_gradients(c);
      check_gradients(c, true);
      // Rows were dropped (the test shows something), and padded experts got exactly 3.
      Parameters params(c, ChunkSpec::whole(c), DType::kF64);
      params.initialize(7);
      ModelChunk chunk(params);
      MicroBatchState mb;
      run_loss(chunk, testing::random_ids(10, c.vocab_size, 1),
               testing::random_ids(10, c.vocab_size, 2), 2, false, &mb);
      for (const LayerActs& a : mb.layers) {
        int64_t kept = 0;
        for (int64_t x = 0; x < c.num_experts; ++x) {
          const int32_t rows = a.attn.counts.data<int32_t>()[x];
          if (pad) {
            EXPECT_EQ(rows, 3);
          }
          kept += rows;
        }
        if (!pad) {
          EXPECT_LT(kept, 20);
        }
      }
    }
  }
}

// The sigmoid router with a capacity (DeepSeek-V3's weights, scaled and normalised, order the
// probs policy).
TEST(RoutingGradient, SigmoidRouterWithCapacityMatchesFiniteDifferences) {
  ModelConfig c = testing::tiny_deepseek_v3_config(5);
  c.moe_expert_capacity_factor = 0.5;
  check_gradients(c, false, 3e-8);
  c.moe_pad_expert_input_to_capacity = true;
  check_gradients(c, false, 3e-8);
}

// a: [m, m] in place to its inverse (Gauss-Jordan with partial pivoting).
void invert(std::vector<double>& a, int64_t m) {
  std::vector<double> inv(static_cast<size_t>(m * m), 0.0);
  for (int64_t i = 0; i < m; ++i) inv[size_t(i * m + i)] = 1;
  for (int64_t c = 0; c < m; ++c) {
    int64_t p = c;
    for (int64_t r = c + 1; r < m; ++r) {
      if (std::abs(a[size_t(r * m + c)]) > std::abs(a[size_t(p * m + c)])) p = r;
    }
    for (int64_t j = 0; j < m; ++j) {
      std::swap(a[size_t(c * m + j)], a[size_t(p * m + j)]);
      std::swap(inv[size_t(c * m + j)], inv[size_t(p * m + j)]);
    }
    const double d = a[size_t(c * m + c)];
    for (int64_t j = 0; j < m; ++j) a[size_t(c * m + j)] /= d, inv[size_t(c * m + j)] /= d;
    for (int64_t r = 0; r < m; ++r) {
      if (r == c) continue;
      const double f = a[size_t(r * m + c)];
      for (int64_t j = 0; j < m; ++j) {
        a[size_t(r * m + j)] -= f * a[size_t(c * m + j)];
        inv[size_t(r * m + j)] -= f * inv[size_t(c * m + j)];
      }
    }
  }
  a = inv;
}

// Note [Forced load balancing]: one MoE layer, one sequence of 5 tokens (fewer than the width 8,
// so a router weight W with n2 W^T = R exists for any logits R: W^T = n2^T (n2 n2^T)^-1 R). The
// forced run's random logits R (kept with the z-loss's logits) are normal draws (mean and
// spread), and the plain model with that W gives the same loss and the same gradients of the
// router and of everything after it: the straight-through estimator passes the loss's gradient
// at R to the router's weight. (Before the router the two differ, as in Megatron-LM: the
// estimator's gradient at n2 goes through the real router weight, not W.)
TEST(Routing, ForcedBalancingPassesTheRandomLogitsGradientStraightThrough) {
  ModelConfig cfg = testing::tiny_config(true);
  cfg.num_layers = 1;
  cfg.moe_z_loss_coeff = 0.1;  // keeps the logits, and its gradient goes through them too
  const int64_t n = cfg.seq_length, h = cfg.hidden_size, e = cfg.num_experts;
  const Tensor ids = testing::random_ids(n, cfg.vocab_size, 1);
  const Tensor targets = testing::random_ids(n, cfg.vocab_size, 2);
  Parameters forced(cfg, ChunkSpec::whole(cfg), DType::kF64);
  forced.initialize(9);
  Parameters plain(cfg, ChunkSpec::whole(cfg), DType::kF64);
  plain.copy_weights_from(forced);
  ModelChunk forced_chunk(forced), plain_chunk(plain);
  forced.zero_grads();
  MicroBatchState mb;
  const double forced_loss = run_loss(forced_chunk, ids, targets, 1, false, &mb, true);
  double sum = 0, sum_sq = 0;
  for (size_t l = 0; l < mb.layers.size(); ++l) {
    const double* r = mb.layers[l].attn.logits.data<double>();
    const double* x = mb.layers[l].attn.n2.data<double>();
    for (int64_t i = 0; i < n * e; ++i) sum += r[i], sum_sq += r[i] * r[i];
    std::vector<double> gram(static_cast<size_t>(n * n), 0.0);  // n2 n2^T
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < h; ++c) gram[size_t(i * n + j)] += x[i * h + c] * x[j * h + c];
      }
    }
    invert(gram, n);
    double* w = plain.weights().layers[l].router.data<double>();  // [E, H]
    for (int64_t x_e = 0; x_e < e; ++x_e) {
      for (int64_t c = 0; c < h; ++c) {
        double v = 0;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < n; ++j)
            v += x[i * h + c] * gram[size_t(i * n + j)] * r[j * e + x_e];
        }
        w[x_e * h + c] = v;
      }
    }
  }
  const double count = static_cast<double>(n * e);
  EXPECT_LT(std::abs(sum / count), 0.7);  // 20 standard normals: mean within 3 sigma
  EXPECT_GT(sum_sq / count, 0.4);
  EXPECT_LT(sum_sq / count, 2.0);
  forced_chunk.backward(mb, context_of(forced_chunk, 1, false, true));
  plain.zero_grads();
  MicroBatchState plain_mb;
  const double plain_loss = run_loss(plain_chunk, ids, targets, 1, false, &plain_mb);
  plain_chunk.backward(plain_mb, context_of(plain_chunk, 1, false));
  EXPECT_NEAR(plain_loss, forced_loss, 1e-12 * std::abs(forced_loss));
  int compared = 0;
  for (const ParamEntry& p : forced.entries()) {
    const bool after = p.name.find(".gate.weight") != std::string::npos ||
                       p.name.find(".experts.") != std::string::npos ||
                       p.name == "model.norm.weight" || p.name == "lm_head.weight";
    if (!after) continue;
    ++compared;
    const Tensor got = forced.grad(p), want = plain.grad(p);
    for (int64_t i = 0; i < got.numel(); ++i) {
      EXPECT_NEAR(got.data<double>()[i], want.data<double>()[i],
                  1e-9 * (1 + std::abs(want.data<double>()[i])))
          << p.name << " element " << i;
    }
  }
  EXPECT_EQ(compared, 1 + 3 * 4 + 2);  // the router, 4 experts' 3 matrices, the head's 2
}

// The draws are a function of (seed, iteration, micro-batch) and the layer only: the same key
// gives the same routing, another micro-batch another.
TEST(Routing, ForcedBalancingDrawsAreTheSameForTheSameKey) {
  const ModelConfig cfg = testing::tiny_config(true);
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF64);
  params.initialize(3);
  ModelChunk chunk(params);
  const Tensor ids = testing::random_ids(10, cfg.vocab_size, 5);
  const Tensor targets = testing::random_ids(10, cfg.vocab_size, 6);
  auto routing = [&](uint64_t key) {
    NodeContext c = context_of(chunk, 2, false, true);
    c.routing_key = key;
    MicroBatchState mb;
    mb.ids = ids;
    mb.targets = targets;
    chunk.forward(mb, c);
    std::vector<int32_t> idx;
    for (const LayerActs& a : mb.layers) {
      const int32_t* p = a.attn.topk_idx.data<int32_t>();
      idx.insert(idx.end(), p, p + a.attn.topk_idx.numel());
    }
    return idx;
  };
  EXPECT_EQ(routing(routing_key(1, 2, 3)), routing(routing_key(1, 2, 3)));
  EXPECT_NE(routing(routing_key(1, 2, 3)), routing(routing_key(1, 2, 4)));
}

}  // namespace
}  // namespace tandem::model
