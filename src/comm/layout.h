// ParallelLayout: where a rank sits in the (pp, dp) grid, with expert parallelism carved out of
// data parallelism as Megatron-LM does (order tp-cp-ep-dp-pp with tp = cp = 1):
//   rank = dp_rank + DP * pp_rank,  ep_rank = dp_rank % EP,  expert_dp_rank = dp_rank / EP,
// where DP = world / PP is the dense part's data-parallel size and EP divides it. Pure data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::comm {

struct ParallelLayout {
  int world = 1, pp = 1, ep = 1;
  int dp() const { return world / pp; }  // dense data-parallel size (includes EP)
  int edp() const { return dp() / ep; }  // expert data-parallel size

  // Throws tandem::Error when world is not pp * (a multiple of ep), naming the sizes.
  static ParallelLayout make(int world, int pp, int ep);

  int pp_rank(int rank) const { return rank / dp(); }
  int dp_rank(int rank) const { return rank % dp(); }
  int ep_rank(int rank) const { return dp_rank(rank) % ep; }
  int edp_rank(int rank) const { return dp_rank(rank) / ep; }
  int rank_of(int pp_rank, int dp_rank) const { return dp_rank + dp() * pp_rank; }

  // The ranks of each group `rank` belongs to, in group-rank order.
  std::vector<int> pp_group(int rank) const;   // same dp_rank, pp 0..PP-1
  std::vector<int> dp_group(int rank) const;   // same pp stage, all dp ranks
  std::vector<int> ep_group(int rank) const;   // same pp stage and expert-dp rank
  std::vector<int> edp_group(int rank) const;  // same pp stage and ep rank
  std::string describe(int rank) const;
};

}  // namespace tandem::comm
