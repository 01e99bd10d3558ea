// The CPU's streams: CpuStream and CpuEvent, CUDA's rules without a GPU (a stream runs its tasks
// in the order enqueued; an event completes when its task has run; a task waits for the events
// it depends on before it starts), and CpuStreams, the executor's Streams on them (streams.h).
// The compute stream runs tasks inline on the calling thread; a worker stream runs them on its
// own thread, so communication overlaps the caller's compute. An exception in a task is
// rethrown by whoever waits on its event.
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

#include "runtime/streams.h"

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
  // An event that completes once every task enqueued so far has run.
  Event mark() {
    return enqueue([] {});
  }
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

// Note [Measured on the CPU]: the host runs a plain action's nodes back to back, so the action
// is one span of the timeline, named after it ("0F3", "0SEND_F1"; a message's on the comm
// track). A combined pair's nodes run on two threads and are spans of their own ("F3 attention"
// on compute, "B2 combine" on comm). The exposed all-to-all is the time the compute stream
// stood waiting for the communication worker.
//
// CpuStreams maps the executor's streams onto two CpuStreams: the compute, pipeline and second
// compute streams are this thread's (MPI on this thread), the communication streams the worker
// (or this thread too without overlap). The reduce stream's work runs on this thread when the
// action ends: MPI is called by one thread at a time, and inside a pair the worker may be in an
// all-to-all.
class CpuStreams final : public Streams {
 public:
  // comm_worker: the communication streams get a worker thread of their own.
  explicit CpuStreams(bool comm_worker);

  bool issues_ahead() const override { return false; }
  void begin_step(HostTime zero) override;
  void begin_action(const schedule::Action& a) override;
  void end_action(const schedule::Action& a) override;
  void run(StreamId s, SpanInfo span, std::function<void()> work) override;
  StreamEvent mark(StreamId s) override;
  void wait(StreamId to, const StreamEvent& e, StreamId from, const std::string& what) override;
  void record_use(const Tensor&, StreamId) override {}
  void host_span(std::string, HostTime, HostTime) override {}
  void join_workers(bool quietly) override;
  StepTimes times() const override;

 private:
  CpuStream& stream(StreamId s);
  void record(const SpanInfo& span, HostTime begin, HostTime end);

  CpuStream compute_;
  std::unique_ptr<CpuStream> comm_;            // null without a worker
  std::vector<std::function<void()>> reduce_;  // run at end_action
  HostTime zero_, action_begin_;
  bool in_pair_ = false;  // node spans are recorded (Note [Measured on the CPU])
  double waited_before_ = 0;
  mutable std::mutex spans_mutex_;
  std::vector<Span> spans_;
  double all_to_all_s_ = 0;
};

}  // namespace tandem::runtime
