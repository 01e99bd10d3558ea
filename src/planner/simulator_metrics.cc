// Metrics of a finished simulation: busy and bubble fractions, exposed communication, the memory
// curve and its peaks, the most (stage, micro-batch) pairs alive at once.
#include <algorithm>
#include <array>

#include "planner/simulator_state.h"

namespace tandem::schedule {
namespace {

// kNodesOnly: not pipeline messages; kNodesAfterWait: the same, each from the end of its wait
// for the slowest expert rank (Span::wait).
enum class Which : uint8_t { kAll, kNodesOnly, kNodesAfterWait };

Intervals stream_intervals(const std::vector<Span>& spans, Stream stream, Which which) {
  Intervals out;
  for (const Span& s : spans) {
    if (s.stream != stream || (which != Which::kAll && s.kind != SpanKind::kNode)) continue;
    const double start =
        which == Which::kNodesAfterWait ? std::min(s.start + s.wait, s.end) : s.start;
    out.emplace_back(start, s.end);
  }
  return out;
}

double total(const Intervals& v) {
  double t = 0;
  for (const auto& [a, b] : v) t += b - a;
  return t;
}

void memory_curve(RankState& st, RankResult& out) {
  // Stable: events of one time keep the order they were simulated in, which is causal for each
  // buffer (allocated before it is freed, even when a zero-time message ends at that instant).
  std::stable_sort(st.mem.begin(), st.mem.end(),
                   [](const MemEvent& a, const MemEvent& b) { return a.time < b.time; });
  // Note [Tokens in the plan] (simulator_state.cc) and
  // Note [Send buffers released when known delivered] (schedule/send_release.cc): held until the
  // last event.
  if (const int64_t held = st.tokens_held + st.sends_held; held > 0) {
    double end = 0;
    for (const MemEvent& e : st.mem) end = std::max(end, e.time);
    st.mem.push_back({end, -held, MemKind::kInFlight, NodeKind::kEmbed});
  }
  const int64_t base = out.static_memory.static_bytes();
  int64_t act = 0, flight = 0, work = 0;
  std::array<int64_t, kNumNodeKinds> by_node{};
  out.memory.push_back({0, 0, 0, 0});
  out.peak_bytes = base;
  for (const MemEvent& e : st.mem) {
    switch (e.kind) {
      case MemKind::kActivation:
        act += e.delta;
        by_node[static_cast<int>(e.node)] += e.delta;
        break;
      case MemKind::kInFlight:
        flight += e.delta;
        break;
      case MemKind::kWorkspace:
        work += e.delta;
        break;
    }
    out.activation_peak_bytes = std::max(out.activation_peak_bytes, act);
    out.in_flight_peak_bytes = std::max(out.in_flight_peak_bytes, flight);
    out.workspace_peak_bytes = std::max(out.workspace_peak_bytes, work);
    if (base + act + flight + work > out.peak_bytes) {
      out.peak_bytes = base + act + flight + work;
      out.peak_time_s = e.time;
      out.activation_at_peak_by_node = by_node;
      out.activation_at_peak_bytes = act;
      out.in_flight_at_peak_bytes = flight;
      out.workspace_at_peak_bytes = work;
    }
    if (out.memory.back().time == e.time) {
      out.memory.back() = {e.time, act, flight, work};
    } else {
      out.memory.push_back({e.time, act, flight, work});
    }
  }
}

// Note [Offload in the plan]: the host bytes' peak (events of one time in simulated order, as
// memory_curve's).
int64_t host_peak(std::vector<std::pair<double, int64_t>>& host) {
  std::stable_sort(host.begin(), host.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t now = 0, peak = 0;
  for (const auto& [t, d] : host) {
    now += d;
    peak = std::max(peak, now);
  }
  return peak;
}

int32_t peak_live(std::vector<std::pair<double, int>>& live) {
  std::sort(live.begin(), live.end());  // at a tie, -1 before +1
  int32_t now = 0, peak = 0;
  for (const auto& [t, d] : live) {
    now += d;
    peak = std::max(peak, now);
  }
  return peak;
}

}  // namespace

SimResult summarize(SimState& sim) {
  SimResult res;
  const int32_t n = sim.schedule.num_ranks;
  res.ranks.resize(n);
  for (int32_t r = 0; r < n; ++r) {
    RankState& st = sim.ranks[r];
    RankResult& out = res.ranks[r];
    out.rank = r;
    out.stages = sim.schedule.stages_of_rank(r);
    out.static_memory = sim.model.ranks[r];
    out.end_s = std::max(st.free[0], st.free[1]);
    const Intervals compute = stream_intervals(st.spans, Stream::kCompute, Which::kAll);
    const Intervals comm = stream_intervals(st.spans, Stream::kComm, Which::kAll);
    // Dispatch and combine are an all-to-all only between expert ranks (as the runtime counts
    // them, Note [Exposed all-to-all] in runtime/device_streams.h).
    const Intervals a2a = sim.model.expert_parallel_size > 1
                              ? stream_intervals(st.spans, Stream::kComm, Which::kNodesOnly)
                              : Intervals{};
    out.compute_busy_s = total(compute);
    out.comm_busy_s = total(comm);
    out.exposed_comm_s = uncovered_time(comm, compute);
    out.exposed_alltoall_s = uncovered_time(a2a, compute);
    if (!a2a.empty()) {  // less the exposed time of the transfers (each span after its wait)
      const Intervals transfer = stream_intervals(st.spans, Stream::kComm, Which::kNodesAfterWait);
      out.exposed_alltoall_waiting_s =
          std::max(0.0, out.exposed_alltoall_s - uncovered_time(transfer, compute));
    }
    // Note [Gradient reduction in the plan]
    out.grad_reduce_s = total(stream_intervals(st.spans, Stream::kReduce, Which::kAll));
    out.grad_reduce_end_s = st.free[2];
    out.grad_reduce_tail_s = std::max(0.0, st.free[2] - out.end_s);
    memory_curve(st, out);
    out.peak_live_microbatches = peak_live(st.live);
    out.offload_host_peak_bytes = host_peak(st.host);
    out.spans = std::move(st.spans);
    res.step_time_s = std::max(res.step_time_s, out.end_s);
    res.step_with_reduce_s = std::max({res.step_with_reduce_s, out.end_s, st.free[2]});
    // Note [The step's end in the plan]
    int64_t params = 0;
    for (const int32_t s : out.stages) {
      params += sim.model.stages[static_cast<size_t>(s)].num_params;
    }
    out.step_end_work_s = static_cast<double>(params) * sim.model.step_end_s_per_param;
    out.full_step_end_s = std::max(out.end_s, st.free[2]) + out.step_end_work_s;
    res.full_step_s = std::max(res.full_step_s, out.full_step_end_s);
  }
  double busy = 0;
  for (RankResult& out : res.ranks) {
    out.busy_fraction = res.step_time_s > 0 ? out.compute_busy_s / res.step_time_s : 0;
    out.bubble_fraction = 1 - out.busy_fraction;
    busy += out.compute_busy_s;
  }
  res.bubble_fraction = res.step_time_s > 0 ? 1 - busy / (n * res.step_time_s) : 0;
  return res;
}

}  // namespace tandem::schedule
