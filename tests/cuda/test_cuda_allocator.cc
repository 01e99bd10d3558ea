// The CUDA caching allocator (core/cuda/cuda_allocator.h). Oracles: a delayed consumer stream's
// output (had its block been handed out early, the data it reads would be overwritten), the
// identity of reused blocks, and the CPU allocator's statistics for the same allocations.
//
// Every test runs on streams of its own, created here and never destroyed: a fresh stream's pool
// is empty, so which block it gets is predictable, and a handle never comes back as another
// stream with that stream's cached blocks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/cuda_allocator.h"
#include "core/rng.h"
#include "cuda/gpu_test.h"

namespace tandem::cuda {
namespace {

using testing_gpu::new_stream;

// Holds `stream` up for `ms` milliseconds: what is enqueued after runs that much later.
void delay(cudaStream_t stream, int ms) {
  const cudaHostFn_t sleep = [](void* arg) {
    std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(arg)));
  };
  TANDEM_CUDA_CHECK(cudaLaunchHostFunc(stream, sleep, reinterpret_cast<void*>(intptr_t{ms})));
}

// Makes `consumer` wait for the work enqueued so far on `producer`.
void wait_for(cudaStream_t consumer, cudaStream_t producer) {
  cudaEvent_t event = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventRecord(event, producer));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(consumer, event, 0));
  TANDEM_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait has been satisfied
}

// `n` floats: 6 MiB and a bit, a large block split from a 20 MiB segment.
constexpr int64_t kFloats = (int64_t{6} << 20) / 4 + 384;

// After the consumer `b` has been held up and has read `t` (allocated on `a`), frees `t` with
// `free_on` current and checks the block comes back on `a` only after `b` has finished, and that
// `b` read the data `t` had (`free_on` is `a` after record_stream(t, b), or `b` itself).
void check_deferred_reuse(cudaStream_t a, cudaStream_t b, bool record_consumer) {
  const Tensor host = testing_gpu::random_host({kFloats}, 7);
  StreamScope on_a(a);
  Tensor t = host.to(Device::kCUDA, MemCategory::kActivation);  // on a, returns when written
  void* const block = t.raw_data();
  Tensor out;
  {
    StreamScope on_b(b);
    out = Tensor::empty({kFloats}, DType::kF32, MemCategory::kOther, "out", Device::kCUDA);
  }
  wait_for(b, a);
  delay(b, 200);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), t.raw_data(), static_cast<size_t>(t.nbytes()),
                                    cudaMemcpyDeviceToDevice, b));
  if (record_consumer) {
    record_stream(t, b);
    release_storage({&t});  // on a
  } else {
    StreamScope on_b(b);
    release_storage({&t});  // on b: the release itself records b
  }
  EXPECT_TRUE(t.released());
  EXPECT_THROW(t.raw_data(), Error);

  // b is still asleep: its read of the block has not run yet.
  Tensor again =
      Tensor::empty({kFloats}, DType::kF32, MemCategory::kActivation, "again", Device::kCUDA);
  EXPECT_NE(again.raw_data(), block) << "a block was handed out while another stream used it";
  // Had `again` been the block, this would overwrite what b is about to read.
  TANDEM_CUDA_CHECK(
      cudaMemsetAsync(again.raw_data(), 0xFF, static_cast<size_t>(again.nbytes()), a));

  TANDEM_CUDA_CHECK(cudaStreamSynchronize(b));
  Tensor third =
      Tensor::empty({kFloats}, DType::kF32, MemCategory::kActivation, "third", Device::kCUDA);
  EXPECT_EQ(third.raw_data(), block) << "the block did not come back once the consumer finished";

  Tensor got;
  {
    StreamScope on_b(b);
    got = out.to(Device::kCPU);
  }
  EXPECT_EQ(std::memcmp(got.data<float>(), host.data<float>(), static_cast<size_t>(host.nbytes())),
            0)
      << "the consumer read overwritten data";
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(a));
}

// (a) PyTorch's record_stream test: delay the consumer, release, allocate again at once.
TEST(CudaAllocator, RecordedConsumerDefersReuse) {
  check_deferred_reuse(new_stream(), new_stream(), /*record_consumer=*/true);
}

// (a) release_storage on another stream records that stream by itself.
TEST(CudaAllocator, ReleaseOnAnotherStreamDefersReuse) {
  check_deferred_reuse(new_stream(), new_stream(), /*record_consumer=*/false);
}

// (b) A block freed on its own stream is reused at once there (stream order keeps it safe),
// even while that stream still has work queued; another stream never gets it.
TEST(CudaAllocator, SameStreamReusesAtOnce) {
  const cudaStream_t a = new_stream(), other = new_stream();
  for (const int64_t floats : {int64_t{250}, int64_t{3} << 20}) {  // a small and a large block
    StreamScope on_a(a);
    delay(a, 50);
    Tensor t = Tensor::zeros({floats}, DType::kF32, MemCategory::kOther, "t", Device::kCUDA);
    void* const block = t.raw_data();
    release_storage({&t});
    Tensor again =
        Tensor::empty({floats}, DType::kF32, MemCategory::kOther, "again", Device::kCUDA);
    EXPECT_EQ(again.raw_data(), block) << floats << " floats";
    release_storage({&again});
    {
      StreamScope on_other(other);
      Tensor elsewhere =
          Tensor::empty({floats}, DType::kF32, MemCategory::kOther, "elsewhere", Device::kCUDA);
      EXPECT_NE(elsewhere.raw_data(), block) << floats << " floats";
    }
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(a));
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(other));
}

TEST(CudaAllocator, RecordStreamOnCpuIsANoOpAndOnReleasedThrows) {
  const cudaStream_t a = new_stream();
  StreamScope on_a(a);
  Tensor cpu = Tensor::empty({4}, DType::kF32, MemCategory::kOther, "cpu", Device::kCPU);
  EXPECT_NO_THROW(record_stream(cpu, a));
  EXPECT_NO_THROW(record_stream(Tensor(), a));
  Tensor gpu = Tensor::empty({4}, DType::kF32, MemCategory::kOther, "gone", Device::kCUDA);
  release_storage({&gpu});
  try {
    record_stream(gpu, a);
    ADD_FAILURE() << "record_stream on a released tensor did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gone"), std::string::npos) << e.what();
  }
}

// What an allocator reports over one sequence of allocations: statistics relative to where they
// started (peaks reset first), at each checkpoint, and the trace without its times.
struct Observed {
  std::vector<MemoryStats> checkpoints;
  std::vector<std::tuple<int64_t, MemCategory, std::string>> trace;
};

MemoryStats relative(const MemoryStats& now, const MemoryStats& base) {
  MemoryStats r = now;
  for (int c = 0; c < kNumMemCategories; ++c) {
    r.in_use[c] -= base.in_use[c];
    r.peak[c] -= base.in_use[c];
  }
  r.total_in_use -= base.total_in_use;
  r.total_peak -= base.total_in_use;
  r.num_allocs -= base.num_allocs;
  return r;
}

Observed run_scenario(Allocator& allocator, Device device) {
  allocator.reset_peaks();
  const MemoryStats base = allocator.stats();
  allocator.set_trace(true);
  Observed o;
  const auto checkpoint = [&] { o.checkpoints.push_back(relative(allocator.stats(), base)); };
  {
    Tensor w = Tensor::empty({1000}, DType::kF32, MemCategory::kParameter, "w", device);
    Tensor g = Tensor::empty({1000}, DType::kF32, MemCategory::kGradient, "g", device);
    Tensor x = Tensor::empty({3, 333}, DType::kBF16, MemCategory::kOther, "x", device);
    Tensor big = Tensor::empty({3 << 20}, DType::kF32, MemCategory::kActivation, "big", device);
    Tensor none = Tensor::empty({0}, DType::kF32, MemCategory::kOther, "none", device);
    checkpoint();
    adopt_as_activation(x);  // other -> activation
    checkpoint();
    release_storage({&big});
    checkpoint();
    allocator.reset_peaks();
    checkpoint();
    Tensor y = Tensor::empty({7}, DType::kI32, MemCategory::kCommunication, "y", device);
    checkpoint();
    release_storage({&x, &y});
    checkpoint();
  }
  checkpoint();
  const std::vector<MemEvent> trace = allocator.trace();
  allocator.set_trace(false);
  for (size_t i = 0; i < trace.size(); ++i) {
    o.trace.emplace_back(trace[i].bytes, trace[i].category, trace[i].tag);
    if (i > 0) {
      EXPECT_GT(trace[i].seq, trace[i - 1].seq);
      EXPECT_GE(trace[i].time, trace[i - 1].time);
    }
  }
  return o;
}

void expect_same(const MemoryStats& got, const MemoryStats& want, size_t i) {
  EXPECT_EQ(got.in_use, want.in_use) << "checkpoint " << i;
  EXPECT_EQ(got.peak, want.peak) << "checkpoint " << i;
  EXPECT_EQ(got.total_in_use, want.total_in_use) << "checkpoint " << i;
  EXPECT_EQ(got.total_peak, want.total_peak) << "checkpoint " << i;
  EXPECT_EQ(got.num_allocs, want.num_allocs) << "checkpoint " << i;
}

// (c) Requested bytes per category, peaks, reset_peaks, hand-over and the trace: the same as the
// CPU allocator's for the same sequence, and the values the sequence implies.
TEST(CudaAllocator, StatisticsMatchTheCpuAllocator) {
  StreamScope on_a(new_stream());
  const Observed cpu = run_scenario(cpu_allocator(), Device::kCPU);
  const Observed gpu = run_scenario(cuda_allocator(), Device::kCUDA);
  ASSERT_EQ(gpu.checkpoints.size(), cpu.checkpoints.size());
  for (size_t i = 0; i < gpu.checkpoints.size(); ++i) {
    expect_same(gpu.checkpoints[i], cpu.checkpoints[i], i);
  }
  EXPECT_EQ(gpu.trace, cpu.trace);

  const auto at = [&](size_t i, MemCategory c) { return gpu.checkpoints[i].in_use_of(c); };
  const auto peak = [&](size_t i, MemCategory c) { return gpu.checkpoints[i].peak_of(c); };
  const int64_t big = int64_t{12} << 20;
  EXPECT_EQ(at(0, MemCategory::kParameter), 4000);
  EXPECT_EQ(at(0, MemCategory::kGradient), 4000);
  EXPECT_EQ(at(0, MemCategory::kOther), 1998);
  EXPECT_EQ(at(0, MemCategory::kActivation), big);
  EXPECT_EQ(gpu.checkpoints[0].total_in_use, 8000 + 1998 + big);
  EXPECT_EQ(gpu.checkpoints[0].num_allocs, 5);
  EXPECT_EQ(at(1, MemCategory::kOther), 0);
  EXPECT_EQ(at(1, MemCategory::kActivation), big + 1998);
  EXPECT_EQ(peak(1, MemCategory::kOther), 1998);
  EXPECT_EQ(at(2, MemCategory::kActivation), 1998);
  EXPECT_EQ(peak(2, MemCategory::kActivation), big + 1998);
  EXPECT_EQ(peak(3, MemCategory::kActivation), 1998);  // reset_peaks: back to what is in use
  EXPECT_EQ(gpu.checkpoints[3].total_peak, 8000 + 1998);
  EXPECT_EQ(at(4, MemCategory::kCommunication), 28);
  EXPECT_EQ(gpu.checkpoints[4].total_peak, 8000 + 1998 + 28);
  for (int c = 0; c < kNumMemCategories; ++c) EXPECT_EQ(gpu.checkpoints.back().in_use[c], 0);
  ASSERT_FALSE(gpu.trace.empty());
  EXPECT_EQ(gpu.trace.front(),
            std::make_tuple(int64_t{4000}, MemCategory::kParameter, std::string("w")));
  EXPECT_EQ(std::get<0>(gpu.trace.back()), -4000);  // w, the first made, is freed last
}

// (d) A request the GPU cannot hold throws naming the bytes and the tag, counts nothing, leaves
// no CUDA error behind, and returns the cached segments of every stream to the driver first.
TEST(CudaAllocator, OutOfMemoryThrowsAndCountsNothing) {
  CudaAllocator& alloc = cuda_allocator();
  const int64_t gib = int64_t{1} << 30;
  {
    StreamScope on_cached(new_stream());
    Tensor t = Tensor::empty({gib / 4}, DType::kF32, MemCategory::kOther, "cached", Device::kCUDA);
  }
  size_t free_bytes = 0, total_bytes = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // 1 PiB, and a request under the GPU's size that still cannot fit beside the CUDA context.
  const int64_t too_much[] = {int64_t{1} << 50,
                              (static_cast<int64_t>(total_bytes) - (int64_t{16} << 20)) / 4 * 4};
  StreamScope on_a(new_stream());
  for (const int64_t bytes : too_much) {
    const MemoryStats before = alloc.stats();
    const int64_t reserved_before = alloc.reserved_bytes();
    try {
      Tensor t = Tensor::empty({bytes / 4}, DType::kF32, MemCategory::kActivation, "huge_buffer",
                               Device::kCUDA);
      ADD_FAILURE() << "allocating " << bytes << " bytes did not throw";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("huge_buffer"), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(bytes)), std::string::npos) << what;
    }
    expect_same(alloc.stats(), before, 0);
    EXPECT_LE(alloc.reserved_bytes(), reserved_before);
    if (bytes == too_much[0]) {  // the cached gibibyte went back to the driver on the retry
      EXPECT_LE(alloc.reserved_bytes(), reserved_before - gib);
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  Tensor small = Tensor::zeros({16}, DType::kF32, MemCategory::kOther, "after", Device::kCUDA);
  EXPECT_EQ(small.to(Device::kCPU).data<float>()[15], 0.0f);
}

// The byte ranges live allocations own, across threads; counts any byte handed out twice.
class Owners {
 public:
  void claim(void* p, int64_t bytes) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + uintptr_t(bytes);
    std::lock_guard lock(mutex_);
    const auto next = ranges_.lower_bound(begin);
    if (next != ranges_.end() && next->first < end) ++overlaps_;
    if (next != ranges_.begin() && std::prev(next)->second > begin) ++overlaps_;
    ranges_.emplace(begin, end);
  }
  void unclaim(void* p) {
    std::lock_guard lock(mutex_);
    ranges_.erase(reinterpret_cast<uintptr_t>(p));
  }
  int64_t overlaps() const { return overlaps_.load(); }

 private:
  std::mutex mutex_;
  std::map<uintptr_t, uintptr_t> ranges_;  // [begin, end)
  std::atomic<int64_t> overlaps_{0};
};

// One thread's random walk on stream `streams[id % 4]`: allocates (1 byte to 3 MiB, any
// category), records a second stream on some blocks, frees some on a third; returns how many
// allocations it made. Frees everything it allocated before returning.
int64_t churn(int id, const std::vector<cudaStream_t>& streams, Owners& owners) {
  CudaAllocator& alloc = cuda_allocator();
  const size_t n = streams.size();
  StreamScope own(streams[size_t(id) % n]);
  struct Live {
    void* ptr;
    int64_t bytes;
    MemCategory category;
  };
  std::vector<Live> live;
  int64_t allocs = 0;
  for (uint64_t step = 0; step < 3000; ++step) {
    const uint64_t r = splitmix64(uint64_t(id) << 32 | step);
    if (live.size() < 24 && (live.empty() || (r & 1))) {
      const int64_t bytes = 1 + int64_t((r >> 8) % ((r & 2) ? (uint64_t{3} << 20) : 5000));
      const auto category = static_cast<MemCategory>((r >> 40) % kNumMemCategories);
      void* p = alloc.allocate(bytes, category, "thread");
      owners.claim(p, bytes);
      ++allocs;
      if ((r >> 50) % 4 == 0) alloc.record_stream(p, streams[size_t(id + 2) % n]);
      live.push_back({p, bytes, category});
      continue;
    }
    const size_t i = (r >> 8) % live.size();
    const Live l = live[i];
    live[i] = live.back();
    live.pop_back();
    owners.unclaim(l.ptr);
    const bool elsewhere = (r >> 50) % 3 == 0;
    StreamScope on(elsewhere ? streams[size_t(id + 1) % n] : streams[size_t(id) % n]);
    alloc.deallocate(l.ptr, l.bytes, l.category, "thread");
  }
  for (const Live& l : live) {
    owners.unclaim(l.ptr);
    alloc.deallocate(l.ptr, l.bytes, l.category, "thread");
  }
  return allocs;
}

// (e) Threads allocating, recording streams and freeing on other streams at once: no byte is
// handed to two owners, and the statistics add up.
TEST(CudaAllocator, ThreadsKeepStatisticsConsistent) {
  CudaAllocator& alloc = cuda_allocator();
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(new_stream());
  const MemoryStats base = alloc.stats();
  Owners owners;
  std::atomic<int64_t> allocs{0};
  std::mutex errors_mutex;
  std::string errors;  // an exception must not end the process from a thread
  std::vector<std::thread> threads;
  for (int id = 0; id < 8; ++id) {
    threads.emplace_back([&, id] {
      try {
        allocs += churn(id, streams, owners);
      } catch (const std::exception& e) {
        std::lock_guard lock(errors_mutex);
        errors += std::string(e.what()) + "\n";
      }
    });
  }
  for (std::thread& t : threads) t.join();

  ASSERT_EQ(errors, "");
  EXPECT_EQ(owners.overlaps(), 0);
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(after.in_use, base.in_use);
  EXPECT_EQ(after.total_in_use, base.total_in_use);
  EXPECT_EQ(after.num_allocs, base.num_allocs + allocs.load());
  EXPECT_GE(alloc.peak_reserved_bytes(), alloc.reserved_bytes());
  for (cudaStream_t s : streams) TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
}

// With nothing allocated and the GPU idle, empty_cache gives every segment back.
TEST(CudaAllocator, EmptyCacheReturnsEverySegment) {
  CudaAllocator& alloc = cuda_allocator();
  {
    StreamScope on_a(new_stream());
    Tensor t = Tensor::empty({1 << 20}, DType::kF32, MemCategory::kOther, "t", Device::kCUDA);
    EXPECT_GT(alloc.reserved_bytes(), 0);
  }
  ASSERT_EQ(alloc.stats().total_in_use, 0) << "a CUDA tensor outlived its test";
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  alloc.empty_cache();
  EXPECT_EQ(alloc.reserved_bytes(), 0);
  EXPECT_GT(alloc.peak_reserved_bytes(), 0);
}

}  // namespace
}  // namespace tandem::cuda
