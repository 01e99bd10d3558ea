// What the multi-rank tests share: a model small enough for fp64 on every layout, the groups of
// a layout over the test world (mpi_main.cc's), and the matrix of layouts and schedules that
// tests/dist/test_equivalence.cc and tests/dist/test_evaluate.cc run every case on.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "core/config.h"
#include "dist_env.h"
#include "runtime/groups.h"
#include "schedule/generators.h"
#include "schedule/validator.h"

namespace tandem::testing {

// 8 layers: 4 stages of 2 virtual stages each; 4 experts top-2 when `moe`. The LM head a weight
// of its own (the tests of tied embeddings tie it).
inline ModelConfig dist_tiny(bool moe) {
  ModelConfig m;
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = 16;
  m.hidden_size = 8;
  m.num_layers = 8;
  m.num_attention_heads = 2;
  m.num_query_groups = 1;
  m.ffn_hidden_size = 12;
  m.num_experts = moe ? 4 : 0;
  m.moe_router_topk = 2;
  m.moe_aux_loss_coeff = 0.05;
  m.seq_length = 6;
  return m;
}

// |a - b| / |b| of two f64 tensors of one shape, in norm: how far a gradient or weight is from
// the reference's.
inline double rel_diff(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = a.data<double>()[i] - b.data<double>()[i];
    num += d * d;
    den += b.data<double>()[i] * b.data<double>()[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// The layout's groups over every rank of the test world (collective).
inline runtime::Groups world_groups(int pp, int ep, int tp = 1) {
  std::vector<int> all;
  for (int r = 0; r < g_world->size(); ++r) all.push_back(r);
  return runtime::Groups::make(g_world->subgroup(all, "world"), pp, ep, tp);
}

struct Layout {
  int pp, ep, v;
  schedule::ScheduleKind kind;
  bool pair_first_forwards = false;
};

// The validated schedule of `l` with `microbatches` per data-parallel rank; empty where the
// schedule does not take that shape.
inline std::optional<schedule::Schedule> layout_schedule(const Layout& l, int32_t microbatches) {
  const schedule::ScheduleShape shape{l.pp, l.v, microbatches, l.pair_first_forwards};
  try {
    schedule::check_supported(l.kind, shape);
  } catch (const Error&) {
    return std::nullopt;
  }
  schedule::Schedule sched = schedule::generate_schedule(l.kind, shape);
  schedule::validate_schedule(sched);
  return sched;
}

// Calls run(layout, dp) for PP 1, 2, 4 and EP 1, 2, 4 (MoE only) that the world's ranks allow,
// the data-parallel size the rest, V 1 and 2, every schedule and combined-1f1b with paired
// first forwards; run returns false where the schedule does not take the shape. Data-parallel
// sizes past 2 only where every data-parallel rank is an expert rank (EP4 and PP2 x EP4, the
// scale run's layouts): the rest adds time, not cases. Returns how many ran.
inline int for_each_layout(bool moe, const std::function<bool(const Layout&, int dp)>& run) {
  const int world = g_world->size();
  int ran = 0;
  for (int pp : {1, 2, 4}) {
    if (world % pp != 0) continue;
    const int dp = world / pp;
    for (int ep : {1, 2, 4}) {
      if ((!moe && ep > 1) || dp % ep != 0 || (dp > 2 && ep != dp)) continue;
      for (int v : {1, 2}) {
        for (int k = 0; k < schedule::kNumScheduleKinds; ++k) {
          ran += run({pp, ep, v, static_cast<schedule::ScheduleKind>(k)}, dp);
        }
        ran += run({pp, ep, v, schedule::ScheduleKind::kCombined1f1b, true}, dp);
      }
    }
  }
  return ran;
}

}  // namespace tandem::testing
