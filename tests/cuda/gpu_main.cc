// main() of the GPU tests: initialises GPU 0 (the test fails, not skips, without one).
#include <gtest/gtest.h>

#include <cstdio>

#include "core/cuda/context.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (tandem::cuda::device_count() == 0) {
    std::fprintf(stderr, "GPU tests need a GPU; none is visible\n");
    return 1;
  }
  tandem::cuda::initialize(0);
  std::printf("GPU: %s\n", tandem::cuda::device_description().c_str());
  return RUN_ALL_TESTS();
}
