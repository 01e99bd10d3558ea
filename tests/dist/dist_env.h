// Shared state of the multi-rank tests: the world communicator made by mpi_main.cc.
#pragma once

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

namespace tandem::testing {
extern comm::Communicator* g_world;
}
