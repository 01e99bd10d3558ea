// GoogleTest main for the multi-rank tests: starts MPI, makes the world communicator available
// to the tests, and lets only rank 0 print progress (every rank still reports failures).
#include <gtest/gtest.h>

#include "dist_env.h"

namespace tandem::testing {
comm::Communicator* g_world = nullptr;
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tandem::comm::mpi_initialize(&argc, &argv);
  auto world = tandem::comm::mpi_world(120.0);
  tandem::testing::g_world = world.get();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  world.reset();
  tandem::comm::mpi_finalize();
  return failed;
}
