// Bounded host waits for the GPU (Note [Bounded waits on the GPU] in wait.h).
#include "core/cuda/wait.h"

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/check.h"
#include "core/error.h"

namespace tandem::cuda {
namespace {

std::atomic<double> g_limit{0};

struct Hooks {
  std::mutex mutex;
  std::map<int, std::function<std::string()>> by_id;  // in the order added (ids grow)
  int next = 1;
};

Hooks& hooks() {
  static auto* h = new Hooks;  // never destroyed: communicators may outlive main's statics
  return *h;
}

// What the hooks aborted, "; "-separated.
std::string run_abort_hooks() {
  std::vector<std::function<std::string()>> run;
  {
    std::lock_guard lock(hooks().mutex);
    for (const auto& [id, hook] : hooks().by_id) run.push_back(hook);
  }
  std::string aborted;
  for (const auto& hook : run) {  // outside the lock: a hook may remove itself
    const std::string what = hook();
    if (!what.empty()) aborted += (aborted.empty() ? "" : "; ") + what;
  }
  return aborted;
}

}  // namespace

void set_wait_limit(double seconds) {
  TANDEM_CHECK(seconds >= 0,
               "the limit of a wait for the GPU must be >= 0 seconds (0: none), "
               "not ",
               seconds);
  g_limit = seconds;
}

int add_abort_hook(std::function<std::string()> hook) {
  std::lock_guard lock(hooks().mutex);
  const int id = hooks().next++;
  hooks().by_id.emplace(id, std::move(hook));
  return id;
}

void remove_abort_hook(int id) {
  std::lock_guard lock(hooks().mutex);
  hooks().by_id.erase(id);
}

namespace {

// Polls `done` (true: finished) until it says so or the limit passes
// (Note [Bounded waits on the GPU]).
template <typename Done>
void wait_until(double limit, Done done, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  constexpr auto kSpin = std::chrono::seconds(1);
  while (!done()) {
    const auto waited = Clock::now() - start;
    if (std::chrono::duration<double>(waited).count() > limit) {
      const std::string aborted = run_abort_hooks();
      TANDEM_CHECK(false, "waited ", limit, " s (--comm-timeout) for the GPU to finish ", what,
                   ": its work waits for another rank's, which has probably died, hung or "
                   "diverged (or was started with a different configuration)",
                   aborted.empty() ? "" : "; aborted: " + aborted);
    }
    if (waited > kSpin) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace

void wait_event(cudaEvent_t event, const char* what) {
  const double limit = g_limit;
  if (limit <= 0) {
    TANDEM_CUDA_CHECK(cudaEventSynchronize(event));
    return;
  }
  wait_until(
      limit,
      [event] {
        const cudaError_t status = cudaEventQuery(event);
        if (status != cudaErrorNotReady) TANDEM_CUDA_CHECK(status);
        return status == cudaSuccess;
      },
      what);
}

void wait_device(const char* what) {
  const double limit = g_limit;
  if (limit <= 0) {
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  // No stream to query covers the whole device: a helper thread makes the blocking call, this
  // one waits for it (bounded). After a timeout the aborted communicators let the helper end.
  struct State {
    std::atomic<bool> done{false};
    cudaError_t status = cudaSuccess;
  };
  auto state = std::make_shared<State>();
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  std::thread([state, device] {
    cudaError_t status = cudaSetDevice(device);
    if (status == cudaSuccess) status = cudaDeviceSynchronize();
    state->status = status;
    state->done = true;
  }).detach();
  wait_until(
      limit, [&] { return state->done.load(); }, what);
  TANDEM_CUDA_CHECK(state->status);
}

void wait_stream(cudaStream_t stream, const char* what) {
  if (g_limit <= 0) {
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  // One event per thread, recorded anew for each wait (a wait that threw leaves it recorded;
  // the next record replaces that).
  thread_local cudaEvent_t event = nullptr;
  if (event == nullptr) {
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  TANDEM_CUDA_CHECK(cudaEventRecord(event, stream));
  wait_event(event, what);
}

}  // namespace tandem::cuda
