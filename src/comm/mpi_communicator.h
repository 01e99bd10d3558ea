// The MPI backend of Communicator for CPU tensors (Open MPI). MPI is initialised once per
// process with MPI_THREAD_SERIALIZED: one thread at a time calls MPI, which the executor keeps by
// issuing every communication on its communication stream. Waits are bounded
// (Note [Bounded waits] in communicator.h): nonblocking calls polled against a deadline.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace tandem::comm {

class ArrivalBoard;  // comm/arrivals.h

// Starts MPI if this process was launched by mpirun (or always, if `force`); a no-op after the
// first call. Returns true when MPI is running.
bool mpi_initialize(int* argc, char*** argv);
// True when the environment says mpirun/mpiexec started this process.
bool launched_by_mpirun();
// This process's index among the ranks on its machine (OMPI_COMM_WORLD_LOCAL_RANK and the like;
// 0 when not started by mpirun): the GPU it uses.
int local_rank();
// How many ranks run on this process's machine (OMPI_COMM_WORLD_LOCAL_SIZE and the like; 1 when
// not started by mpirun): the ranks that share its memory.
int local_size();
// Finalizes MPI if it was started; safe to call more than once.
void mpi_finalize();
// Ends every rank of the job with `code` (after a fatal error on one rank).
[[noreturn]] void mpi_abort(int code);

// The world communicator; `timeout_s` bounds every wait (Note [Bounded waits]).
std::unique_ptr<Communicator> mpi_world(double timeout_s);

// For another backend's collectives over the ranks of `group` (Note [Who did not arrive] in
// comm/arrivals.h): a board on a new duplicate of its MPI communicator, collective over the
// group and bounded like its waits. Null when `group` is not an MPI communicator (a run without
// mpirun, over self_world()).
std::unique_ptr<ArrivalBoard> arrival_board(Communicator& group);

}  // namespace tandem::comm
