// CPU streams and events (stream.h).
#include "runtime/stream.h"

#include <chrono>

namespace tandem::runtime {

double CpuEvent::wait() const {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CpuEvent::wait_quietly() const {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
}

bool CpuEvent::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

bool CpuEvent::failed() const {
  std::lock_guard lock(mutex_);
  return done_ && error_ != nullptr;
}

void CpuEvent::complete(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

CpuStream::CpuStream(std::string name, StreamMode mode) : name_(std::move(name)), mode_(mode) {
  if (mode_ == StreamMode::kWorker) worker_ = std::thread([this] { worker_loop(); });
}

CpuStream::~CpuStream() {
  if (mode_ != StreamMode::kWorker) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

// Runs one task: waits for its dependencies, then fn; any exception completes the event with it.
static void run_task(const std::function<void()>& fn, const std::vector<Event>& deps,
                     const Event& done, double& waited) {
  try {
    for (const Event& d : deps) {
      if (d) waited += d->wait();
    }
    fn();
    done->complete(nullptr);
  } catch (...) {
    done->complete(std::current_exception());
  }
}

Event CpuStream::enqueue(std::function<void()> fn, std::vector<Event> deps) {
  auto done = std::make_shared<CpuEvent>();
  if (mode_ == StreamMode::kInline) {
    run_task(fn, deps, done, waited_s_);
    last_ = done;
    if (done->done()) done->wait();  // rethrow at once on the caller's thread
    return done;
  }
  {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(
        [fn = std::move(fn), deps = std::move(deps), done, this] {
          run_task(fn, deps, done, waited_s_);
          if (done->failed()) {
            std::lock_guard lock(mutex_);
            if (!first_failed_) first_failed_ = done;
          }
        },
        done);
    last_ = done;
  }
  cv_.notify_all();
  return done;
}

void CpuStream::synchronize() {
  Event last;
  {
    std::lock_guard lock(mutex_);
    last = last_;
  }
  if (last) last->wait_quietly();
  Event failed;
  {
    std::lock_guard lock(mutex_);
    failed = first_failed_;
  }
  if (failed) failed->wait();  // rethrows
  if (last) last->wait();
}

void CpuStream::worker_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left to run
      task = std::move(queue_.front().first);
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace tandem::runtime
