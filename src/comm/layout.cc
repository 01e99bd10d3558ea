// Rank <-> (pp, dp, ep, expert-dp) coordinates and groups (layout.h).
#include "comm/layout.h"

#include <sstream>

#include "core/error.h"

namespace tandem::comm {

ParallelLayout ParallelLayout::make(int world, int pp, int ep) {
  TANDEM_CHECK(pp >= 1 && ep >= 1, "--pipeline-model-parallel-size ", pp,
               " and --expert-model-parallel-size ", ep, " must be at least 1");
  TANDEM_CHECK(world % pp == 0, "the world size ", world,
               " is not a multiple of --pipeline-model-parallel-size ", pp, ": start ", pp,
               " x N ranks (mpirun -np ", pp, ", ", 2 * pp, ", ...)");
  TANDEM_CHECK((world / pp) % ep == 0, "the data-parallel size ", world / pp, " (", world,
               " ranks / --pipeline-model-parallel-size ", pp,
               ") is not a multiple of --expert-model-parallel-size ", ep, ": start ", pp * ep,
               " x N ranks");
  return ParallelLayout{world, pp, ep};
}

std::vector<int> ParallelLayout::pp_group(int rank) const {
  std::vector<int> g;
  for (int p = 0; p < pp; ++p) g.push_back(rank_of(p, dp_rank(rank)));
  return g;
}

std::vector<int> ParallelLayout::dp_group(int rank) const {
  std::vector<int> g;
  for (int d = 0; d < dp(); ++d) g.push_back(rank_of(pp_rank(rank), d));
  return g;
}

std::vector<int> ParallelLayout::ep_group(int rank) const {
  std::vector<int> g;
  for (int e = 0; e < ep; ++e) g.push_back(rank_of(pp_rank(rank), edp_rank(rank) * ep + e));
  return g;
}

std::vector<int> ParallelLayout::edp_group(int rank) const {
  std::vector<int> g;
  for (int d = 0; d < edp(); ++d) g.push_back(rank_of(pp_rank(rank), d * ep + ep_rank(rank)));
  return g;
}

std::string ParallelLayout::describe(int rank) const {
  std::ostringstream out;
  out << "rank " << rank << " (pp " << pp_rank(rank) << "/" << pp << ", dp " << dp_rank(rank) << "/"
      << dp() << ", ep " << ep_rank(rank) << "/" << ep << ", expert-dp " << edp_rank(rank) << "/"
      << edp() << ")";
  return out.str();
}

}  // namespace tandem::comm
