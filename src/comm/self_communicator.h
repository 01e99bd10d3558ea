// A world of one process, for a run started without mpirun (MPI's MPI_COMM_SELF, without MPI):
// every group is this process alone, a collective leaves the data as it is (or copies its input
// to its output), and a message to itself waits, copied, until it is received.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace tandem::comm {

// The world communicator of a process that runs alone.
std::unique_ptr<Communicator> self_world();

}  // namespace tandem::comm
