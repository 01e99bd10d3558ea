// CPU streams and events, the same rules as CUDA's without a GPU (docs/design.md "Stream safety"):
// a stream runs its tasks in the order enqueued; an event completes when its task has run; a task
// waits for the events it depends on before it starts. The compute stream runs tasks inline on
// the calling thread; a worker stream runs them on its own thread, so communication overlaps the
// caller's compute. An exception in a task is rethrown by whoever waits on its event.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::runtime {

class CpuEvent {
 public:
  // Blocks until the task ran; rethrows its exception. Returns the seconds spent blocked.
  double wait() const;
  // Blocks until the task ran, without rethrowing.
  void wait_quietly() const;
  bool done() const;
  bool failed() const;
  void complete(std::exception_ptr error);

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};
using Event = std::shared_ptr<CpuEvent>;

// Whether a stream runs its tasks on the caller's thread or on a worker thread of its own.
enum class StreamMode : uint8_t { kInline, kWorker };

class CpuStream {
 public:
  CpuStream(std::string name, StreamMode mode);
  ~CpuStream();
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  // Runs fn after every event in deps has completed, after the tasks enqueued before it.
  Event enqueue(std::function<void()> fn, std::vector<Event> deps = {});
  // Blocks until every task enqueued so far has run (rethrows the first error).
  void synchronize();
  const std::string& name() const { return name_; }
  // Seconds this stream's tasks spent waiting on events of other streams.
  double waited_seconds() const { return waited_s_; }

 private:
  void worker_loop();

  std::string name_;
  StreamMode mode_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, Event>> queue_;
  Event last_;
  Event first_failed_;  // the first task that threw, rethrown by synchronize()
  bool stop_ = false;
  double waited_s_ = 0;
  std::thread worker_;
};

}  // namespace tandem::runtime
