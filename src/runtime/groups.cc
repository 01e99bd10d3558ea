// This rank's communicators (groups.h).
#include "runtime/groups.h"

#include <utility>
#include <vector>

#include "core/error.h"
#if TANDEM_WITH_CUDA
#include "comm/nccl_communicator.h"
#endif

namespace tandem::runtime {

Groups Groups::make(std::unique_ptr<comm::Communicator> world, int pp, int ep, int tp,
                    Device device, bool second_expert_group, double timeout_s) {
  Groups g;
  g.rank = world->rank();
  g.layout = comm::ParallelLayout::make(world->size(), pp, ep, tp);
  g.pp = world->subgroup(g.layout.pp_group(g.rank), "pp");
  g.dp = world->subgroup(g.layout.dp_group(g.rank), "dp");
  g.ep = world->subgroup(g.layout.ep_group(g.rank), "ep");
  g.edp = world->subgroup(g.layout.edp_group(g.rank), "expert-dp");
  g.tp = world->subgroup(g.layout.tp_group(g.rank), "tp");
  if (device == Device::kCUDA) {
#if TANDEM_WITH_CUDA
    // Note [Pipeline streams on the GPU]: NCCL runs a communicator's operations in the order
    // they were issued, and a send waits on the GPU for its receive. Activations and gradients
    // flow in opposite directions, so one communicator for both would deadlock (each rank's
    // first operation a send); one per direction keeps each in the validated schedule's order.
    const double timeout = timeout_s;
    g.pp_fwd_dev = comm::make_nccl_communicator(*g.pp, timeout);
    g.pp_bwd_dev = comm::make_nccl_communicator(*g.pp, timeout);
    g.dp_dev = comm::make_nccl_communicator(*g.dp, timeout);
    g.ep_dev = comm::make_nccl_communicator(*g.ep, timeout);
    if (ep > 1 && second_expert_group) g.ep2_dev = comm::make_nccl_communicator(*g.ep, timeout);
    g.edp_dev = comm::make_nccl_communicator(*g.edp, timeout);
#else
    (void)second_expert_group, (void)timeout_s;
    TANDEM_CHECK(false, "device groups need a binary built with CUDA");
#endif
  }
  g.world = std::move(world);
  g.timeout_s = timeout_s;
  return g;
}

void Groups::add_embedding_group(int first, int last) {
  TANDEM_ASSERT(first != last, "an embedding group of one pipeline rank");
  const int me = pp->rank();
  const bool member = me == first || me == last;
  // A collective split of the pipeline group: the others form groups of one, then drop them.
  std::unique_ptr<comm::Communicator> g =
      pp->subgroup(member ? std::vector<int>{first, last} : std::vector<int>{me}, "embedding");
  if (!member) return;
  embedding = std::move(g);
#if TANDEM_WITH_CUDA
  if (dp_dev) embedding_dev = comm::make_nccl_communicator(*embedding, timeout_s);
#endif
}

}  // namespace tandem::runtime
