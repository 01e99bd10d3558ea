// The validator's joint run of all ranks: SENDs never wait, a RECV waits for its peer's SEND,
// and each pair of ranks must receive in send order. Reports misordered messages and deadlocks.
#include <deque>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "schedule/validator.h"

namespace tandem::schedule {
namespace {

// The send that a receive matches: RECV_F(s, m) <- SEND_F(s-1, m); RECV_B(s, m) <- SEND_B(s+1, m).
Action matching_send(const Action& recv) {
  return recv.kind == ActionKind::kRecvF
             ? Action::make(ActionKind::kSendF, recv.stage - 1, recv.microbatch)
             : Action::make(ActionKind::kSendB, recv.stage + 1, recv.microbatch);
}

int32_t peer_stage(const Action& a) {
  return a.kind == ActionKind::kSendF || a.kind == ActionKind::kRecvB ? a.stage + 1 : a.stage - 1;
}

class JointRun {
 public:
  explicit JointRun(const Schedule& s) : s_(s), pc_(s.num_ranks, 0) {}

  void run() {
    std::vector<int32_t> work;
    for (int32_t r = s_.num_ranks - 1; r >= 0; --r) work.push_back(r);
    while (!work.empty()) {
      const int32_t r = work.back();
      work.pop_back();
      advance(r, work);
    }
    report_deadlock();
  }

 private:
  struct Sent {
    Action send;
    size_t index;
  };
  struct Channel {
    std::deque<Sent> queue;
    int32_t waiter = -1;
  };
  Channel& channel(int32_t src, int32_t dst) {
    return channels_[static_cast<int64_t>(src) * s_.num_ranks + dst];
  }

  void advance(int32_t r, std::vector<int32_t>& work) {
    const auto& list = s_.ranks[r];
    for (; pc_[r] < list.size(); ++pc_[r]) {
      const Action& a = list[pc_[r]];
      if (a.kind == ActionKind::kSendF || a.kind == ActionKind::kSendB) {
        Channel& ch = channel(r, s_.stage_rank[peer_stage(a)]);
        ch.queue.push_back({a, pc_[r]});
        if (ch.waiter >= 0) work.push_back(ch.waiter);
        ch.waiter = -1;
      } else if (a.kind == ActionKind::kRecvF || a.kind == ActionKind::kRecvB) {
        const int32_t src = s_.stage_rank[peer_stage(a)];
        Channel& ch = channel(src, r);
        if (ch.queue.empty()) {
          ch.waiter = r;
          return;
        }
        const Action want = matching_send(a);
        const Sent& head = ch.queue.front();
        TANDEM_CHECK(head.send == want, "schedule '", s_.name, "' is invalid: rank ", r,
                     ", action #", pc_[r], " ", to_string(a), ": misordered receive: it expects ",
                     to_string(want), " from rank ", src, ", but the next message rank ", src,
                     " sends to rank ", r, " is ", to_string(head.send), " (its action #",
                     head.index,
                     "); messages between two ranks are received in the order "
                     "they are sent");
        ch.queue.pop_front();
      }
    }
  }

  void report_deadlock() const {
    std::ostringstream msg;
    int blocked = 0;
    for (int32_t r = 0; r < s_.num_ranks; ++r) {
      if (pc_[r] >= s_.ranks[r].size()) continue;
      const Action& a = s_.ranks[r][pc_[r]];
      const int32_t src = s_.stage_rank[peer_stage(a)];
      msg << (blocked++ ? "; " : "") << "rank " << r << " waits at action #" << pc_[r] << " "
          << to_string(a) << " for rank " << src << "'s " << to_string(matching_send(a));
      if (pc_[src] < s_.ranks[src].size()) {
        msg << ", while rank " << src << " is stopped at action #" << pc_[src] << " "
            << to_string(s_.ranks[src][pc_[src]]);
      }
    }
    TANDEM_CHECK(blocked == 0, "schedule '", s_.name, "' is invalid: deadlock: ", msg.str());
  }

  const Schedule& s_;
  std::vector<size_t> pc_;
  std::unordered_map<int64_t, Channel> channels_;
};

}  // namespace

void check_message_order(const Schedule& s);
void check_message_order(const Schedule& s) { JointRun(s).run(); }

}  // namespace tandem::schedule
