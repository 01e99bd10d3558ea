// Bounded waits for the GPU (Note [Bounded waits on the GPU] in core/cuda/wait.h). Oracle: a
// stream held up on purpose by a host function that lets it go only when told (what a peer's
// missing NCCL kernel does to a real stream): a wait past the limit throws, naming what it
// waited for, after running every abort hook once; within the limit, or without one, waits
// return when the work is done, and a value read back to the host arrives.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/wait.h"
#include "core/error.h"
#include "core/host_read.h"
#include "core/tensor.h"
#include "cuda/gpu_test.h"

namespace tandem::cuda {
namespace {

using testing_gpu::new_stream;

// A stream of the test's own held by a host function until `gate` is set (what is enqueued
// after runs only then), as a peer's missing NCCL kernel holds a real one.
struct HeldStream {
  cudaStream_t stream = new_stream();
  std::atomic<bool> gate{false};
  HeldStream() {
    const cudaHostFn_t wait = [](void* arg) {
      auto* open = static_cast<std::atomic<bool>*>(arg);
      while (!open->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    TANDEM_CUDA_CHECK(cudaLaunchHostFunc(stream, wait, &gate));
  }
};

// Sets the limit for one test and clears it after (the other tests run without one).
struct Limit {
  explicit Limit(double s) { set_wait_limit(s); }
  ~Limit() { set_wait_limit(0); }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(CudaWait, PastTheLimitTheHooksRunAndTheErrorNamesTheWait) {
  HeldStream held;
  const cudaStream_t s = held.stream;
  int aborted = 0;
  // As an NCCL communicator's abort ends its kernels, this hook lets the stream go.
  const int hook = add_abort_hook([&] {
    ++aborted;
    held.gate = true;
    return std::string("the test's gate");
  });
  const Limit limit(0.3);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    wait_stream(s, "the test's held stream");
  } catch (const Error& e) {
    message = e.what();
  }
  const double waited = seconds_since(start);
  remove_abort_hook(hook);
  EXPECT_NE(message.find("the test's held stream"), std::string::npos) << message;
  EXPECT_NE(message.find("0.3 s (--comm-timeout)"), std::string::npos) << message;
  EXPECT_NE(message.find("aborted: the test's gate"), std::string::npos) << message;
  EXPECT_EQ(aborted, 1);
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 5.0);
  wait_stream(s, "the test's stream, let go");  // the hook opened it: the wait now returns
  EXPECT_EQ(aborted, 1) << "a wait that ends in time runs no hook";
}

TEST(CudaWait, WithinTheLimitAWaitReturnsWhenTheWorkIsDone) {
  HeldStream held;
  int aborted = 0;
  const int hook = add_abort_hook([&] {
    ++aborted;
    return std::string();
  });
  const Limit limit(30);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    held.gate = true;
  });
  const auto start = std::chrono::steady_clock::now();
  wait_stream(held.stream, "the test's held stream");
  EXPECT_GE(seconds_since(start), 0.04);
  opener.join();
  remove_abort_hook(hook);
  EXPECT_EQ(aborted, 0);
}

// Under a limit, reads to the host (HostRead, the copies of Tensor::to) go through the bounded
// waits and still deliver the values; a read dropped before its copy landed does not block.
TEST(CudaWait, ReadsBackToTheHostArriveUnderALimit) {
  const Limit limit(30);
  Tensor t = Tensor::zeros({4}, DType::kI32, MemCategory::kOther, "wait.t", Device::kCUDA);
  Tensor host = Tensor::empty({4}, DType::kI32, MemCategory::kOther, "wait.host");
  for (int i = 0; i < 4; ++i) host.data<int32_t>()[i] = 7 * i + 1;
  t.copy_from(host);
  HostRead read(t);
  const std::vector<int32_t> got = read.take();
  ASSERT_EQ(got.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], 7 * i + 1);
  const Tensor back = t.to(Device::kCPU);
  EXPECT_EQ(back.data<int32_t>()[3], 22);

  HeldStream held;
  {
    StreamScope on(held.stream);
    HostRead dropped(t);  // its copy waits behind the held stream; dropping must not wait
  }
  held.gate = true;
  wait_stream(held.stream, "the test's stream");
}

}  // namespace
}  // namespace tandem::cuda
