// The host's waits for the GPU, bounded (Note [Bounded waits on the GPU]).
//
// Note [Bounded waits on the GPU]: Note [Bounded waits] (comm/communicator.h) promises that no
// call blocks forever. On GPUs a collective returns once it is enqueued, and what waits for
// another rank is the GPU: an NCCL kernel spins until its peers arrive. A rank whose peer hung
// (or whose peer's process is gone before mpirun noticed) would then block in the first host
// wait for the GPU (a value read back, a copy to the host, the step's end) for ever. With a
// limit set (tandem train under mpirun on GPUs: --comm-timeout), every such wait polls instead
// and, past the limit, runs the abort hooks (each NCCL communicator aborts, so its kernels end
// and the GPU drains) and throws tandem::Error naming what it waited for; main then ends the
// job (MPI_Abort), as for any error. Without a limit (one GPU, no peers) the waits are CUDA's
// own blocking ones. For its first second a wait spins on cudaEventQuery (yielding), as
// cudaEventSynchronize spins, so that the host learns at once that a value it waits for has
// landed (its next kernels are what the GPU then waits for); after that it sleeps 1 ms between
// queries.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>

namespace tandem::cuda {

// The longest the host waits for the GPU, in seconds; 0 (the default): as long as it takes.
void set_wait_limit(double seconds);

// Runs when a wait runs past the limit, before the error is thrown (in the order added); what
// it returns (what it aborted: "NCCL group 'ep' ...", or "") goes into the error. The id removes
// it again. Hooks must not throw.
int add_abort_hook(std::function<std::string()> hook);
void remove_abort_hook(int id);

// Waits until `event` has completed (Note [Bounded waits on the GPU]); `what` names the wait in
// the error ("the step's last kernels").
void wait_event(cudaEvent_t event, const char* what);
// The same for everything enqueued on `stream` so far.
void wait_stream(cudaStream_t stream, const char* what);
// The same for everything enqueued on the GPU so far (cudaDeviceSynchronize, bounded).
void wait_device(const char* what);

}  // namespace tandem::cuda
