// This rank's communicators: the parallel layout's groups (comm/layout.h) over the world, on the
// host (MPI, or one process alone) and, for a GPU run, on the device (NCCL).
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/layout.h"
#include "core/device.h"

namespace tandem::runtime {

struct Groups {
  comm::ParallelLayout layout;
  int rank = 0;  // world rank
  // Host groups: CPU tensors, and the host-side reductions of every run (losses, norms).
  // tp: the tensor-parallel ranks that hold one layer's shards (Note [Tensor parallelism] in
  // core/config_tp.cc); a group of one at TP 1.
  std::unique_ptr<comm::Communicator> world, pp, dp, ep, edp, tp;
  // Device groups (NCCL; only for a GPU run, else null and the host groups serve): one per
  // group, and two for the pipeline, one per direction (Note [Pipeline streams on the GPU]).
  std::unique_ptr<comm::Communicator> pp_fwd_dev, pp_bwd_dev, dp_dev, ep_dev, edp_dev;
  // A second device expert group, for the second half of a combined pair under
  // CommOverlap::kSplit (Note [A stream pair per half] in combined.cc); made only for it (NCCL's
  // buffers take device memory).
  std::unique_ptr<comm::Communicator> ep2_dev;
  // Note [The embedding group] (grad_reduce.cc): the pipeline ranks of the first and the last
  // stage, made by add_embedding_group; null until then, and on the other ranks.
  std::unique_ptr<comm::Communicator> embedding, embedding_dev;
  double timeout_s = 120.0;  // --comm-timeout, for the groups made later

  // Splits `world` into the layout's groups (tp innermost, comm/layout.h); every rank must call
  // it. device: kCUDA also builds
  // the NCCL groups (cuda::initialize must have run), each waiting at most timeout_s for a peer
  // (--comm-timeout). second_expert_group: also ep2_dev (GPU, EP > 1), for CommOverlap::kSplit.
  static Groups make(std::unique_ptr<comm::Communicator> world, int pp, int ep, int tp = 1,
                     Device device = Device::kCPU, bool second_expert_group = false,
                     double timeout_s = 120.0);
  // The embedding group of pipeline ranks `first` and `last` (different): every rank of the
  // pipeline group calls it; those two get `embedding` (and on the GPU `embedding_dev`).
  void add_embedding_group(int first, int last);
  comm::Communicator& embedding_data() { return embedding_dev ? *embedding_dev : *embedding; }
  comm::Communicator& pp_fwd() { return pp_fwd_dev ? *pp_fwd_dev : *pp; }
  comm::Communicator& pp_bwd() { return pp_bwd_dev ? *pp_bwd_dev : *pp; }
  comm::Communicator& dp_data() { return dp_dev ? *dp_dev : *dp; }
  comm::Communicator& ep_data() { return ep_dev ? *ep_dev : *ep; }
  comm::Communicator& ep2_data() { return ep2_dev ? *ep2_dev : ep_data(); }
  comm::Communicator& edp_data() { return edp_dev ? *edp_dev : *edp; }
};

}  // namespace tandem::runtime
