// Rank <-> (tp, pp, dp, ep, expert-dp) coordinates and groups (layout.h).
#include "comm/layout.h"

#include <sstream>

#include "core/error.h"

namespace tandem::comm {

ParallelLayout ParallelLayout::make(int world, int pp, int ep, int tp) {
  TANDEM_CHECK(pp >= 1 && ep >= 1 && tp >= 1, "--tensor-model-parallel-size ", tp,
               ", --pipeline-model-parallel-size ", pp, " and --expert-model-parallel-size ", ep,
               " must be at least 1");
  TANDEM_CHECK(world % (tp * pp) == 0, "the world size ", world,
               " is not a multiple of --tensor-model-parallel-size ", tp,
               " x --pipeline-model-parallel-size ", pp, ": start ", tp * pp,
               " x N ranks (mpirun -np ", tp * pp, ", ", 2 * tp * pp, ", ...)");
  TANDEM_CHECK((world / pp) % ep == 0, "the ", world / pp, " ranks of a pipeline stage (", world,
               " ranks / --pipeline-model-parallel-size ", pp,
               ") are not a multiple of --expert-model-parallel-size ", ep, ": start ", pp * ep,
               " x N ranks");
  return ParallelLayout{world, pp, ep, tp};
}

std::vector<int> ParallelLayout::tp_group(int rank) const {
  std::vector<int> g;
  for (int t = 0; t < tp; ++t) g.push_back(rank_of(pp_rank(rank), dp_rank(rank), t));
  return g;
}

std::vector<int> ParallelLayout::pp_group(int rank) const {
  std::vector<int> g;
  for (int p = 0; p < pp; ++p) g.push_back(rank_of(p, dp_rank(rank), tp_rank(rank)));
  return g;
}

std::vector<int> ParallelLayout::dp_group(int rank) const {
  std::vector<int> g;
  for (int d = 0; d < dp(); ++d) g.push_back(rank_of(pp_rank(rank), d, tp_rank(rank)));
  return g;
}

std::vector<int> ParallelLayout::ep_group(int rank) const {
  std::vector<int> g;
  const int first = pp_rank(rank) * stage_size() + edp_rank(rank) * ep;
  for (int e = 0; e < ep; ++e) g.push_back(first + e);
  return g;
}

std::vector<int> ParallelLayout::edp_group(int rank) const {
  std::vector<int> g;
  const int first = pp_rank(rank) * stage_size() + ep_rank(rank);
  for (int d = 0; d < edp(); ++d) g.push_back(first + d * ep);
  return g;
}

std::string ParallelLayout::describe(int rank) const {
  std::ostringstream out;
  out << "rank " << rank << " (tp " << tp_rank(rank) << "/" << tp << ", pp " << pp_rank(rank) << "/"
      << pp << ", dp " << dp_rank(rank) << "/" << dp() << ", ep " << ep_rank(rank) << "/" << ep
      << ", expert-dp " << edp_rank(rank) << "/" << edp() << ")";
  return out.str();
}

}  // namespace tandem::comm
