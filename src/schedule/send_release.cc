// Note [Send buffers released when known delivered]: a send on the CPU (MPI_Isend) keeps its
// buffer until MPI has moved the message, which past the eager limit waits for the receiver to
// post its receive: whenever that is, in the other process's time. Freed at the first action
// that finds it done, the buffer's life (and so a rank's peak) would depend on the other rank's
// pace. Instead it goes at a point of the sender's own list: its first RECV (from any rank) that
// happened after the receiver's RECV of the message, by the schedule's causal order (program
// order on each rank, each SEND before its RECV), where waiting for the send cannot block: the
// message is delivered. A message with no such RECV after it goes at the step's end. Every
// run of the schedule releases the same buffers at the same places, and the plan frees them
// there too.
#include "schedule/send_release.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"

namespace tandem::schedule {
namespace {

// A message: its direction (true: an activation), the sending stage, the micro-batch.
using MessageKey = std::tuple<bool, int32_t, int32_t>;

MessageKey key_of(const Action& a) {
  switch (a.kind) {
    case ActionKind::kSendF:
      return {true, a.stage, a.microbatch};
    case ActionKind::kRecvF:
      return {true, a.stage - 1, a.microbatch};
    case ActionKind::kSendB:
      return {false, a.stage, a.microbatch};
    default:  // kRecvB
      return {false, a.stage + 1, a.microbatch};
  }
}

}  // namespace

SendReleases send_releases(const Schedule& s) {
  const auto n = static_cast<size_t>(s.num_ranks);
  SendReleases out(n);
  // Vector clocks: per rank, how many actions of each rank happened before (its own included);
  // at each RECV the clock it had once received.
  std::vector<std::vector<int64_t>> clock(n, std::vector<int64_t>(n, 0));
  std::vector<std::vector<std::vector<int64_t>>> at_recv(n);
  struct Sent {
    int32_t rank, index;
    std::vector<int64_t> clock;
    int32_t to_rank = -1, recv_index = -1;
  };
  std::map<MessageKey, Sent> sent;
  std::vector<size_t> pc(n, 0);
  for (size_t r = 0; r < n; ++r) {
    out[r].resize(s.ranks[r].size());
    at_recv[r].resize(s.ranks[r].size());
  }
  // Runs each rank as far as its receives allow, round after round (a validated schedule ends).
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < n; ++r) {
      const std::vector<Action>& list = s.ranks[r];
      for (; pc[r] < list.size(); ++pc[r]) {
        const Action& a = list[pc[r]];
        const bool recv = a.kind == ActionKind::kRecvF || a.kind == ActionKind::kRecvB;
        if (recv) {
          auto it = sent.find(key_of(a));
          if (it == sent.end()) break;  // its SEND has not run yet
          for (size_t k = 0; k < n; ++k) clock[r][k] = std::max(clock[r][k], it->second.clock[k]);
          it->second.to_rank = static_cast<int32_t>(r);
          it->second.recv_index = static_cast<int32_t>(pc[r]);
        }
        clock[r][r] = static_cast<int64_t>(pc[r]) + 1;
        if (recv) at_recv[r][pc[r]] = clock[r];
        if (a.kind == ActionKind::kSendF || a.kind == ActionKind::kSendB) {
          sent[key_of(a)] = {static_cast<int32_t>(r), static_cast<int32_t>(pc[r]), clock[r]};
        }
        moved = true;
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    TANDEM_ASSERT(pc[r] == s.ranks[r].size(), "send_releases: rank ", r,
                  " is blocked; validate_schedule must run first");
  }
  for (const auto& [key, m] : sent) {
    const std::vector<Action>& list = s.ranks[static_cast<size_t>(m.rank)];
    for (size_t p = static_cast<size_t>(m.index) + 1; p < list.size(); ++p) {
      const std::vector<int64_t>& c = at_recv[static_cast<size_t>(m.rank)][p];
      if (!c.empty() && c[static_cast<size_t>(m.to_rank)] > m.recv_index) {
        out[static_cast<size_t>(m.rank)][p].push_back(m.index);
        break;
      }
    }
  }
  return out;
}

}  // namespace tandem::schedule
