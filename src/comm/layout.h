// ParallelLayout: where a rank sits in the (tp, dp, pp) grid, with expert parallelism carved out
// of each pipeline stage as Megatron-LM does (order tp-cp-ep-dp-pp with cp = 1, and an expert
// tensor-parallel size of 1):
//   rank = tp_rank + TP * (dp_rank + DP * pp_rank),
//   ep_rank = stage_rank % EP,  expert_dp_rank = stage_rank / EP,  stage_rank = rank % (TP * DP),
// where DP = world / (TP * PP) is the dense part's data-parallel size and EP divides TP * DP, the
// ranks of a stage (Megatron-LM's expert rank generator: etp 1, ep, edp, pp). With TP = 1 the
// expert ranks are those of the data-parallel group. Pure data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::comm {

struct ParallelLayout {
  int world = 1, pp = 1, ep = 1, tp = 1;
  int stage_size() const { return world / pp; }  // TP * DP ranks hold one pipeline stage
  int dp() const { return stage_size() / tp; }   // dense data-parallel size
  int edp() const { return stage_size() / ep; }  // expert data-parallel size

  // Throws tandem::Error when world is not tp * pp * N with ep dividing world / pp, naming the
  // sizes.
  static ParallelLayout make(int world, int pp, int ep, int tp = 1);

  int tp_rank(int rank) const { return rank % tp; }
  int pp_rank(int rank) const { return rank / stage_size(); }
  int dp_rank(int rank) const { return rank % stage_size() / tp; }
  int ep_rank(int rank) const { return rank % stage_size() % ep; }
  int edp_rank(int rank) const { return rank % stage_size() / ep; }
  int rank_of(int pp_rank, int dp_rank, int tp_rank = 0) const {
    return tp_rank + tp * (dp_rank + dp() * pp_rank);
  }

  // The ranks of each group `rank` belongs to, in group-rank order.
  std::vector<int> tp_group(int rank) const;   // same pp stage and dp rank, tp 0..TP-1
  std::vector<int> pp_group(int rank) const;   // same tp and dp rank, pp 0..PP-1
  std::vector<int> dp_group(int rank) const;   // same pp stage and tp rank, all dp ranks
  std::vector<int> ep_group(int rank) const;   // same pp stage and expert-dp rank
  std::vector<int> edp_group(int rank) const;  // same pp stage and ep rank
  std::string describe(int rank) const;
};

}  // namespace tandem::comm
