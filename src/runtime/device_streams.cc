// The GPU's streams, events and measured timeline (device_streams.h).
#include "runtime/device_streams.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#if TANDEM_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/cuda_allocator.h"
#endif

#include "core/error.h"
#include "schedule/intervals.h"

namespace tandem::runtime {

#if TANDEM_WITH_CUDA

namespace {

using DeviceStream = cudaStream_t;
using DeviceEvent = cudaEvent_t;

DeviceEvent new_event(bool timing) {
  cudaEvent_t e = nullptr;
  const unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
  return e;
}

// An event of `pool` (made when the pool runs short) recorded now on `s`.
DeviceEvent record_from(std::vector<DeviceEvent>& pool, size_t& used, bool timing, DeviceStream s) {
  if (used == pool.size()) pool.push_back(new_event(timing));
  DeviceEvent e = pool[used++];
  TANDEM_CUDA_CHECK(cudaEventRecord(e, s));
  return e;
}

class DeviceStreams final : public Streams {
 public:
  DeviceStreams();
  ~DeviceStreams() override;
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  bool issues_ahead() const override { return true; }
  void begin_step(HostTime zero) override;
  void begin_action(const schedule::Action&) override { ++action_; }
  void end_action(const schedule::Action&) override {}
  void run(StreamId s, SpanInfo span, std::function<void()> work) override;
  StreamEvent mark(StreamId s) override { return {nullptr, plain_mark(stream_of(s))}; }
  void wait(StreamId to, const StreamEvent& e, StreamId from, const std::string& what) override;
  void record_use(const Tensor& t, StreamId s) override;
  void host_span(std::string name, HostTime begin, HostTime end) override;
  void join_workers(bool) override {}
  StepTimes times() const override;

 private:
  // compute: the calling thread's current stream.
  DeviceStream stream_of(StreamId s) const;
  bool is_compute(DeviceStream s) const { return s == cuda::current_stream() || s == compute2_; }
  DeviceEvent plain_mark(DeviceStream s) { return record_from(plain_, plain_used_, false, s); }
  DeviceEvent timed_mark(DeviceStream s) { return record_from(timed_, timed_used_, true, s); }
  void end(DeviceStream s, DeviceEvent begin, SpanInfo info, bool after_wait = false) {
    pending_.push_back({begin, timed_mark(s), std::move(info), action_, after_wait});
  }

  DeviceStream fwd_ = nullptr, bwd_ = nullptr, comm_ = nullptr, comm2_ = nullptr,
               compute2_ = nullptr, reduce_ = nullptr, copy_out_ = nullptr, copy_in_ = nullptr;
  std::vector<DeviceEvent> plain_, timed_;  // event pools, reused every step
  size_t plain_used_ = 0, timed_used_ = 0;
  DeviceEvent step_zero_ = nullptr;
  struct Pending {
    DeviceEvent begin, end;
    SpanInfo info;
    int64_t action = 0;       // the action it was issued in (begin_action's count)
    bool after_wait = false;  // issued after its stream was told to wait for another
  };
  std::vector<Pending> pending_;
  int64_t action_ = 0;
  std::vector<DeviceStream> waited_;  // streams told to wait since their last span
  struct NodeGaps;
  HostTime host_zero_;
  std::vector<Span> host_spans_;
};

DeviceStreams::DeviceStreams() {
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&fwd_, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&bwd_, cudaStreamNonBlocking));
  // The all-to-all's kernels (few, short, on the critical path of the other micro-batch) go
  // ahead of the compute stream's whenever both have work ready.
  int least = 0, greatest = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, greatest));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&comm2_, cudaStreamNonBlocking, greatest));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&compute2_, cudaStreamNonBlocking, least));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&reduce_, cudaStreamNonBlocking, least));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_out_, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_in_, cudaStreamNonBlocking));
  step_zero_ = new_event(true);
}

DeviceStreams::~DeviceStreams() {
  for (DeviceStream s : {fwd_, bwd_, comm_, comm2_, compute2_, reduce_, copy_out_, copy_in_}) {
    (void)cudaStreamSynchronize(s);
    (void)cudaStreamDestroy(s);
  }
  for (DeviceEvent e : plain_) (void)cudaEventDestroy(e);
  for (DeviceEvent e : timed_) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(step_zero_);
}

DeviceStream DeviceStreams::stream_of(StreamId s) const {
  switch (s) {
    case StreamId::kCompute:
      return cuda::current_stream();
    case StreamId::kCompute2:
      return compute2_;
    case StreamId::kComm:
      return comm_;
    case StreamId::kComm2:
      return comm2_;
    case StreamId::kPipelineForward:
      return fwd_;
    case StreamId::kPipelineBackward:
      return bwd_;
    case StreamId::kReduce:
      return reduce_;
    case StreamId::kOffloadOut:
      return copy_out_;
    case StreamId::kOffloadIn:
      return copy_in_;
  }
  return cuda::current_stream();
}

void DeviceStreams::begin_step(HostTime zero) {
  // The last step's events have all completed (the trainer synchronized after it).
  plain_used_ = timed_used_ = 0;
  pending_.clear();
  waited_.clear();
  host_spans_.clear();
  host_zero_ = zero;
  TANDEM_CUDA_CHECK(cudaEventRecord(step_zero_, cuda::current_stream()));
}

void DeviceStreams::run(StreamId id, SpanInfo span, std::function<void()> work) {
  const DeviceStream s = stream_of(id);
  cuda::StreamScope on(s);
  const auto waited = std::find(waited_.begin(), waited_.end(), s);
  const bool after_wait = waited != waited_.end();
  if (after_wait) waited_.erase(waited);
  const DeviceEvent begin = timed_mark(s);
  work();
  end(s, begin, std::move(span), after_wait);
}

// Note [Nodes on the communication stream] (combined.cc).
void DeviceStreams::record_use(const Tensor& t, StreamId s) {
  if (t.defined() && !t.released() && !t.evicted() && t.device() == Device::kCUDA) {
    cuda::record_stream(t, stream_of(s));
  }
}

void DeviceStreams::host_span(std::string name, HostTime begin, HostTime end) {
  auto secs = [&](HostTime t) { return std::chrono::duration<double>(t - host_zero_).count(); };
  host_spans_.push_back({"host", std::move(name), secs(begin), secs(end)});
}

void DeviceStreams::wait(StreamId to_id, const StreamEvent& e, StreamId from_id,
                         const std::string& what) {
  const DeviceStream to = stream_of(to_id), from = stream_of(from_id);
  // A compute stream's wait for an all-to-all or for offloaded activations coming back is
  // measured (the trace's "wait" spans); other waits are not.
  if (!is_compute(to) || (from != comm_ && from != comm2_ && from != copy_in_)) {
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(to, e.device, 0));
    // Note [Gaps between nodes]: the next span on `to` may start late for this wait.
    if (to != from && std::find(waited_.begin(), waited_.end(), to) == waited_.end()) {
      waited_.push_back(to);
    }
    return;
  }
  const DeviceEvent before = timed_mark(to);
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(to, e.device, 0));
  SpanInfo info;
  info.track = to == compute2_ ? "compute2" : "compute";
  info.name = "wait " + what;
  end(to, before, std::move(info));
}

// Note [Gaps between nodes] (planner/pipeline_model.cc): on each compute stream, the time from
// a node phase's end to the next's start, where the next was issued right after it in the same
// action with no wait for another stream (nor other work) between them.
struct DeviceStreams::NodeGaps {
  struct Last {
    int64_t action = -1;  // -1: no node phase last
    double end = 0;
  };
  std::array<Last, 2> last;  // compute, compute2
  double seconds = 0;
  int64_t count = 0;

  void add(const Pending& p, double begin, double end) {
    const bool first = p.info.track == "compute";
    if (!first && p.info.track != "compute2") return;
    Last& l = last[first ? 0 : 1];
    const bool node = p.info.kind >= 0;
    if (node && !p.after_wait && l.action == p.action) {
      seconds += std::max(0.0, begin - l.end);
      ++count;
    }
    l = node ? Last{p.action, end} : Last{};
  }
};

StepTimes DeviceStreams::times() const {
  StepTimes out;
  auto seconds = [&](DeviceEvent e) {
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, step_zero_, e));
    return static_cast<double>(ms) * 1e-3;
  };
  double update_s = 0, reduce_s = 0, reduce_bus_bytes = 0;
  int64_t update_weights = 0;
  std::array<std::array<double, 3>, kNumNodeKinds> sum{};
  std::array<std::array<int64_t, 3>, kNumNodeKinds> count{};
  NodeGaps gaps;
  for (const Pending& p : pending_) {
    const double b = seconds(p.begin), e = seconds(p.end);
    gaps.add(p, b, e);
    out.spans.push_back({p.info.track, p.info.name, b, e});
    double& end = p.info.track == "reduce" ? out.reduce_end_s : out.end_s;
    end = std::max(end, e);
    if (p.info.all_to_all) {
      out.all_to_all_s += e - b;
      out.all_to_all.push_back({p.info.name, b, e});
    } else if ((p.info.track == "compute" || p.info.track == "compute2") &&
               (p.info.kind >= 0 || p.info.busy)) {
      out.compute.emplace_back(b, e);
    }
    if (p.info.weights > 0) {
      update_s += e - b;
      update_weights += p.info.weights;
    }
    if (p.info.bus_bytes > 0) {
      reduce_s += e - b;
      reduce_bus_bytes += p.info.bus_bytes;
    }
    if (p.info.kind >= 0) {
      const auto ph = static_cast<size_t>(p.info.phase);
      sum[p.info.kind][ph] += e - b;
      if (!p.info.part) ++count[p.info.kind][ph];
    }
  }
  out.spans.insert(out.spans.end(), host_spans_.begin(), host_spans_.end());
  // Note [Exposed all-to-all]
  std::vector<std::pair<double, double>> all_to_all;
  for (const AllToAllSpan& s : out.all_to_all) all_to_all.emplace_back(s.start, s.end);
  out.exposed_s = schedule::uncovered_time(schedule::merge_intervals(std::move(all_to_all)),
                                           schedule::merge_intervals(out.compute));
  for (int k = 0; k < kNumNodeKinds; ++k) {
    if (count[k][0] == 0) continue;  // not on this rank
    auto mean = [&](size_t ph) { return count[k][ph] > 0 ? sum[k][ph] / count[k][ph] : 0.0; };
    out.node_times.nodes[k] = schedule::NodePhaseTimes{mean(0), mean(1), mean(2)};
  }
  if (update_weights > 0) {
    out.node_times.update_s_per_weight = update_s / static_cast<double>(update_weights);
  }
  if (reduce_s > 0) out.node_times.grad_reduce_bus_bytes_per_s = reduce_bus_bytes / reduce_s;
  if (gaps.count > 0) out.node_times.node_gap_s = gaps.seconds / static_cast<double>(gaps.count);
  return out;
}

}  // namespace

std::unique_ptr<Streams> make_device_streams() { return std::make_unique<DeviceStreams>(); }

#else  // no CUDA

std::unique_ptr<Streams> make_device_streams() {
  TANDEM_CHECK(false, "GPU streams need a binary built with CUDA");
  return nullptr;
}

#endif

}  // namespace tandem::runtime
