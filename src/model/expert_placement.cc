// Expert placement (Note [Expert placement] in expert_placement.h): lookups, checks and the
// balancing heuristic.
#include "model/expert_placement.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "core/error.h"

namespace tandem::model {

bool ExpertPlacement::contiguous(int64_t layer) const {
  return layer >= static_cast<int64_t>(layers.size()) || layers[static_cast<size_t>(layer)].empty();
}

int32_t ExpertPlacement::expert_at(int64_t layer, int64_t place) const {
  if (contiguous(layer)) return static_cast<int32_t>(place);
  return layers[static_cast<size_t>(layer)].at(static_cast<size_t>(place));
}

std::vector<int32_t> ExpertPlacement::places(int64_t layer, int64_t num_experts) const {
  std::vector<int32_t> out(static_cast<size_t>(num_experts));
  for (int64_t p = 0; p < num_experts; ++p) {
    out[static_cast<size_t>(expert_at(layer, p))] = static_cast<int32_t>(p);
  }
  return out;
}

void check_placement(const ExpertPlacement& p, int64_t num_layers, int64_t num_experts) {
  TANDEM_CHECK(static_cast<int64_t>(p.layers.size()) <= num_layers, "an expert placement of ",
               p.layers.size(), " layers for a model of ", num_layers);
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const std::vector<int32_t>& at = p.layers[l];
    if (at.empty()) continue;
    TANDEM_CHECK(static_cast<int64_t>(at.size()) == num_experts, "the expert placement of layer ",
                 l, " has ", at.size(), " places, expected ", num_experts, " (the experts)");
    std::vector<bool> seen(at.size(), false);
    for (const int32_t e : at) {
      TANDEM_CHECK(e >= 0 && e < num_experts && !seen[static_cast<size_t>(e)],
                   "the expert placement of layer ", l, " holds expert ", e,
                   " out of range or twice; it must be a permutation of [0, ", num_experts, ")");
      seen[static_cast<size_t>(e)] = true;
    }
  }
}

std::vector<int64_t> rank_loads(const std::vector<int32_t>& experts_at,
                                const std::vector<int64_t>& load, int64_t ranks) {
  const auto per = static_cast<int64_t>(experts_at.size()) / ranks;
  std::vector<int64_t> out(static_cast<size_t>(ranks), 0);
  for (size_t p = 0; p < experts_at.size(); ++p) {
    out[p / static_cast<size_t>(per)] += load[static_cast<size_t>(experts_at[p])];
  }
  return out;
}

namespace {

// Experts of each rank, [rank][i].
using Groups = std::vector<std::vector<int32_t>>;

Groups largest_first(const std::vector<int64_t>& load, int64_t ranks) {
  const auto e = static_cast<int64_t>(load.size());
  const auto per = static_cast<size_t>(e / ranks);
  std::vector<int32_t> order(static_cast<size_t>(e));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return load[a] > load[b]; });
  Groups g(static_cast<size_t>(ranks));
  std::vector<int64_t> sum(static_cast<size_t>(ranks), 0);
  for (const int32_t x : order) {
    size_t best = g.size();
    for (size_t r = 0; r < g.size(); ++r) {
      if (g[r].size() < per && (best == g.size() || sum[r] < sum[best])) best = r;
    }
    g[best].push_back(x);
    sum[best] += load[static_cast<size_t>(x)];
  }
  return g;
}

// One swap between the most loaded rank and another that lowers the larger of the two (the
// one that lowers it most); false when there is none. Each swap lowers the sum of squared rank
// loads, so the loop that calls this ends.
bool improve_once(Groups& g, const std::vector<int64_t>& load) {
  std::vector<int64_t> sum(g.size(), 0);
  for (size_t r = 0; r < g.size(); ++r) {
    for (const int32_t x : g[r]) sum[r] += load[static_cast<size_t>(x)];
  }
  const size_t h = static_cast<size_t>(std::max_element(sum.begin(), sum.end()) - sum.begin());
  int64_t best = sum[h];
  size_t br = 0, bi = 0, bj = 0;
  for (size_t r = 0; r < g.size(); ++r) {
    if (r == h) continue;
    for (size_t i = 0; i < g[h].size(); ++i) {
      for (size_t j = 0; j < g[r].size(); ++j) {
        const int64_t d = load[static_cast<size_t>(g[h][i])] - load[static_cast<size_t>(g[r][j])];
        if (d <= 0) continue;
        const int64_t larger = std::max(sum[h] - d, sum[r] + d);
        if (larger < best) std::tie(best, br, bi, bj) = std::tuple(larger, r, i, j);
      }
    }
  }
  if (best == sum[h]) return false;
  std::swap(g[h][bi], g[br][bj]);
  return true;
}

}  // namespace

std::vector<int32_t> balance_experts(const std::vector<int64_t>& load, int64_t ranks) {
  const auto e = static_cast<int64_t>(load.size());
  TANDEM_CHECK(ranks >= 1 && e % ranks == 0, "balance_experts: ", e, " experts do not divide over ",
               ranks, " ranks");
  Groups g = largest_first(load, ranks);
  while (improve_once(g, load)) continue;
  std::vector<int32_t> out;
  for (std::vector<int32_t>& r : g) {
    std::sort(r.begin(), r.end());
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

}  // namespace tandem::model
