// CPU streams and events, and the executor's streams on them (cpu_streams.h).
#include "runtime/cpu_streams.h"

#include <chrono>
#include <utility>

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

CpuStreams::CpuStreams(bool comm_worker) : compute_("compute", StreamMode::kInline) {
  if (comm_worker) comm_ = std::make_unique<CpuStream>("comm", StreamMode::kWorker);
}

CpuStream& CpuStreams::stream(StreamId s) {
  const bool comm = s == StreamId::kComm || s == StreamId::kComm2;
  return comm && comm_ ? *comm_ : compute_;
}

void CpuStreams::begin_step(HostTime zero) {
  zero_ = zero;
  reduce_.clear();  // left by a step that failed
  std::lock_guard lock(spans_mutex_);
  spans_.clear();
  all_to_all_s_ = 0;
  waited_before_ = compute_.waited_seconds();
}

void CpuStreams::begin_action(const schedule::Action& a) {
  action_begin_ = std::chrono::steady_clock::now();
  in_pair_ = schedule::is_pair(a.kind);
}

void CpuStreams::end_action(const schedule::Action& a) {
  std::vector<std::function<void()>> reduce = std::exchange(reduce_, {});
  for (const std::function<void()>& work : reduce) work();
  if (!in_pair_) {  // Note [Measured on the CPU]
    SpanInfo span;
    span.track = schedule::is_communication(a.kind) ? "comm" : "compute";
    span.name = schedule::to_string(a);
    record(span, action_begin_, std::chrono::steady_clock::now());
  }
  in_pair_ = false;
}

void CpuStreams::record(const SpanInfo& span, HostTime begin, HostTime end) {
  auto secs = [&](HostTime t) { return std::chrono::duration<double>(t - zero_).count(); };
  std::lock_guard lock(spans_mutex_);
  spans_.push_back({span.track, span.name, secs(begin), secs(end)});
  if (span.all_to_all) all_to_all_s_ += secs(end) - secs(begin);
}

void CpuStreams::run(StreamId s, SpanInfo span, std::function<void()> work) {
  if (s == StreamId::kReduce) {
    reduce_.push_back(std::move(work));
    return;
  }
  if (!in_pair_) {  // measured as a whole by end_action
    stream(s).enqueue(std::move(work));
    return;
  }
  stream(s).enqueue([this, span = std::move(span), work = std::move(work)] {
    const HostTime begin = std::chrono::steady_clock::now();
    work();
    record(span, begin, std::chrono::steady_clock::now());
  });
}

StreamEvent CpuStreams::mark(StreamId s) {
  if (s == StreamId::kReduce) return {};  // its work runs after the action, after everything
  return {stream(s).mark(), nullptr};
}

void CpuStreams::wait(StreamId to, const StreamEvent& e, StreamId from, const std::string&) {
  if (!e.cpu || to == StreamId::kReduce) return;
  CpuStream& waiting = stream(to);
  if (from != StreamId::kReduce && &waiting == &stream(from)) return;  // in order already
  waiting.enqueue([] {}, {e.cpu});
}

void CpuStreams::join_workers(bool quietly) {
  if (quietly) {
    // The worker may still run tasks that refer to the caller's frame: let them finish first.
    if (comm_) {
      try {
        comm_->synchronize();
      } catch (...) {
      }
    }
    return;
  }
  if (comm_) comm_->synchronize();
  compute_.synchronize();
}

StepTimes CpuStreams::times() const {
  StepTimes t;
  std::lock_guard lock(spans_mutex_);
  t.spans = spans_;
  t.all_to_all_s = all_to_all_s_;
  t.exposed_s = compute_.waited_seconds() - waited_before_;
  return t;
}

}  // namespace tandem::runtime
