// The validator: a structural pass, a per-rank walk (local dependencies, repeated and missing
// work), and a run of all ranks together (message order and deadlock), in that order.
#include "schedule/validator.h"

#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace tandem::schedule {
namespace {

std::string where(const Schedule& s, int32_t rank, size_t index, const Action& a) {
  return detail::concat("schedule '", s.name, "' is invalid: rank ", rank, ", action #", index, " ",
                        to_string(a), ": ");
}

void check_half_structure(const Schedule& s, int32_t r, size_t i, const Action& whole,
                          const Action& a) {
  const auto at = [&] { return where(s, r, i, whole); };  // only built when a check fails
  TANDEM_CHECK(a.stage >= 0 && a.stage < s.num_stages, at(), "stage ", a.stage,
               " is out of range: the schedule has stages 0..", s.num_stages - 1);
  TANDEM_CHECK(a.microbatch >= 0 && a.microbatch < s.num_microbatches, at(), "micro-batch ",
               a.microbatch, " is out of range: the schedule has micro-batches 0..",
               s.num_microbatches - 1);
  const int32_t owner = s.stage_rank[a.stage];
  TANDEM_CHECK(owner == r, at(), "stage ", a.stage, " belongs to rank ", owner, ", not rank ", r,
               " (each stage lives on one rank)");
  const bool fwd_msg = a.kind == ActionKind::kSendF || a.kind == ActionKind::kRecvB;
  const bool bwd_msg = a.kind == ActionKind::kSendB || a.kind == ActionKind::kRecvF;
  if (fwd_msg) {  // talks to stage + 1
    TANDEM_CHECK(a.stage + 1 < s.num_stages, at(), "stage ", a.stage,
                 " is the last stage: there is no next stage to talk to");
    TANDEM_CHECK(s.stage_rank[a.stage + 1] != r, at(), "stage ", a.stage + 1,
                 " is on the same rank: hand the tensor over locally, without SEND/RECV");
  }
  if (bwd_msg) {  // talks to stage - 1
    TANDEM_CHECK(a.stage > 0, at(), "stage 0 is the first stage: there is no previous stage");
    TANDEM_CHECK(s.stage_rank[a.stage - 1] != r, at(), "stage ", a.stage - 1,
                 " is on the same rank: hand the tensor over locally, without SEND/RECV");
  }
}

// The per-(stage, micro-batch) state a rank's walk builds.
enum class WeightGrad : uint8_t { kNotYet, kPending, kDone };
struct Cell {
  int32_t forward_at = -1;   // index of the F on its rank
  int32_t backward_at = -1;  // index of the B or I
  WeightGrad weight = WeightGrad::kNotYet;
  bool sent_f = false, sent_b = false;
  int32_t recv_f_at = -1, recv_b_at = -1;
};

class Walk {
 public:
  explicit Walk(const Schedule& s)
      : s_(s), cells_(static_cast<size_t>(s.num_stages) * s.num_microbatches) {}

  void run() {
    for (int32_t r = 0; r < s_.num_ranks; ++r) {
      for (size_t i = 0; i < s_.ranks[r].size(); ++i) step(r, i, s_.ranks[r][i]);
    }
    check_complete();
  }

 private:
  Cell& cell(int32_t stage, int32_t mb) {
    return cells_[static_cast<size_t>(stage) * s_.num_microbatches + mb];
  }

  // The message prefix of the action being checked; built only when a check fails.
  std::string at() const { return where(s_, rank_, index_, *action_); }

  void step(int32_t r, size_t i, const Action& a) {
    rank_ = r;
    index_ = i;
    action_ = &a;
    switch (a.kind) {
      case ActionKind::kForward:
        forward(r, i, a);
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        backward(r, i, a);
        break;
      case ActionKind::kBackwardWeight:
        weight(a);
        break;
      case ActionKind::kForwardBackward: {
        // The halves run together, so the backward may not need the forward: check it first.
        backward(r, i, a.second_half());
        forward(r, i, a.first_half());
        break;
      }
      case ActionKind::kForwardForward: {
        // Note [Paired forwards]: neither half may read the other's output.
        TANDEM_CHECK(a.microbatch != a.second_microbatch, at(), "both forwards are micro-batch ",
                     a.microbatch, ": pair forwards of two different micro-batches");
        forward(r, i, a.first_half());
        forward(r, i, a.second_half());
        break;
      }
      case ActionKind::kSendF: {
        Cell& c = cell(a.stage, a.microbatch);
        TANDEM_CHECK(c.forward_at >= 0, at(), "sends an activation before its forward ",
                     to_string(Action::make(ActionKind::kForward, a.stage, a.microbatch)), " ran");
        TANDEM_CHECK(!c.sent_f, at(), "repeated send: this activation was already sent");
        c.sent_f = true;
        break;
      }
      case ActionKind::kSendB: {
        Cell& c = cell(a.stage, a.microbatch);
        TANDEM_CHECK(c.backward_at >= 0, at(), "sends a gradient before the backward of stage ",
                     a.stage, " micro-batch ", a.microbatch, " ran");
        TANDEM_CHECK(!c.sent_b, at(), "repeated send: this gradient was already sent");
        c.sent_b = true;
        break;
      }
      case ActionKind::kRecvF:
      case ActionKind::kRecvB: {
        int32_t& slot = a.kind == ActionKind::kRecvF ? cell(a.stage, a.microbatch).recv_f_at
                                                     : cell(a.stage, a.microbatch).recv_b_at;
        TANDEM_CHECK(slot < 0, at(), "repeated receive: already received at action #", slot);
        slot = static_cast<int32_t>(i);
        break;
      }
    }
  }

  void forward(int32_t r, size_t i, const Action& f) {
    Cell& c = cell(f.stage, f.microbatch);
    TANDEM_CHECK(c.forward_at < 0, at(), "repeated work: ", to_string(f),
                 " already ran at action #", c.forward_at);
    if (f.stage > 0) {
      if (s_.stage_rank[f.stage - 1] == r) {
        TANDEM_CHECK(cell(f.stage - 1, f.microbatch).forward_at >= 0, at(), "its input comes from ",
                     to_string(Action::make(ActionKind::kForward, f.stage - 1, f.microbatch)),
                     " on the same rank, which has not run yet");
      } else {
        TANDEM_CHECK(c.recv_f_at >= 0, at(), "its input has not been received: no ",
                     to_string(Action::make(ActionKind::kRecvF, f.stage, f.microbatch)),
                     " before it on rank ", r, " to receive what rank ", s_.stage_rank[f.stage - 1],
                     " sends with ",
                     to_string(Action::make(ActionKind::kSendF, f.stage - 1, f.microbatch)));
      }
    }
    c.forward_at = static_cast<int32_t>(i);
  }

  void backward(int32_t r, size_t i, const Action& b) {
    Cell& c = cell(b.stage, b.microbatch);
    TANDEM_CHECK(c.forward_at >= 0, at(), "backward before its forward: ",
                 to_string(Action::make(ActionKind::kForward, b.stage, b.microbatch)),
                 " has not run on rank ", r);
    TANDEM_CHECK(c.backward_at < 0, at(), "repeated work: the backward of stage ", b.stage,
                 " micro-batch ", b.microbatch, " already ran");
    if (b.stage + 1 < s_.num_stages) {
      if (s_.stage_rank[b.stage + 1] == r) {
        TANDEM_CHECK(cell(b.stage + 1, b.microbatch).backward_at >= 0, at(),
                     "its output gradient comes from the backward of stage ", b.stage + 1,
                     " on the same rank, which has not run yet");
      } else {
        TANDEM_CHECK(c.recv_b_at >= 0, at(), "its output gradient has not been received: no ",
                     to_string(Action::make(ActionKind::kRecvB, b.stage, b.microbatch)),
                     " before it on rank ", r, " to receive what rank ", s_.stage_rank[b.stage + 1],
                     " sends with ",
                     to_string(Action::make(ActionKind::kSendB, b.stage + 1, b.microbatch)));
      }
    }
    c.backward_at = static_cast<int32_t>(i);
    c.weight = b.kind == ActionKind::kBackward ? WeightGrad::kDone : WeightGrad::kPending;
  }

  void weight(const Action& w) {
    Cell& c = cell(w.stage, w.microbatch);
    TANDEM_CHECK(c.weight != WeightGrad::kNotYet, at(),
                 "weight gradient before its input gradient ",
                 to_string(Action::make(ActionKind::kBackwardInput, w.stage, w.microbatch)));
    TANDEM_CHECK(c.weight == WeightGrad::kPending, at(),
                 "repeated work: the weight gradient of stage ", w.stage, " micro-batch ",
                 w.microbatch, " was already computed (by a full B or an earlier W)");
    c.weight = WeightGrad::kDone;
  }

  void check_complete();

  const Schedule& s_;
  std::vector<Cell> cells_;
  int32_t rank_ = 0;
  size_t index_ = 0;
  const Action* action_ = nullptr;
};

void Walk::check_complete() {
  const std::string at = detail::concat("schedule '", s_.name, "' is invalid: ");
  for (int32_t st = 0; st < s_.num_stages; ++st) {
    const int32_t r = s_.stage_rank[st];
    const bool f_remote = st + 1 < s_.num_stages && s_.stage_rank[st + 1] != r;
    const bool b_remote = st > 0 && s_.stage_rank[st - 1] != r;
    for (int32_t m = 0; m < s_.num_microbatches; ++m) {
      const Cell& c = cell(st, m);
      TANDEM_CHECK(c.forward_at >= 0, at, "missing work: rank ", r, " never runs ",
                   to_string(Action::make(ActionKind::kForward, st, m)));
      TANDEM_CHECK(c.backward_at >= 0, at, "missing work: rank ", r,
                   " never runs the backward of stage ", st, " micro-batch ", m);
      TANDEM_CHECK(c.weight == WeightGrad::kDone, at, "missing work: rank ", r, " runs ",
                   to_string(Action::make(ActionKind::kBackwardInput, st, m)), " but never ",
                   to_string(Action::make(ActionKind::kBackwardWeight, st, m)));
      if (f_remote) {
        const Cell& next = cell(st + 1, m);
        TANDEM_CHECK(c.sent_f, at, "unmatched receive: rank ", s_.stage_rank[st + 1], " needs ",
                     to_string(Action::make(ActionKind::kRecvF, st + 1, m)), " but rank ", r,
                     " never runs ", to_string(Action::make(ActionKind::kSendF, st, m)));
        TANDEM_CHECK(next.recv_f_at >= 0, at, "unmatched send: rank ", r, " runs ",
                     to_string(Action::make(ActionKind::kSendF, st, m)), " but rank ",
                     s_.stage_rank[st + 1], " never runs ",
                     to_string(Action::make(ActionKind::kRecvF, st + 1, m)));
      }
      if (b_remote) {
        const Cell& prev = cell(st - 1, m);
        TANDEM_CHECK(c.sent_b, at, "unmatched receive: rank ", s_.stage_rank[st - 1], " needs ",
                     to_string(Action::make(ActionKind::kRecvB, st - 1, m)), " but rank ", r,
                     " never runs ", to_string(Action::make(ActionKind::kSendB, st, m)));
        TANDEM_CHECK(prev.recv_b_at >= 0, at, "unmatched send: rank ", r, " runs ",
                     to_string(Action::make(ActionKind::kSendB, st, m)), " but rank ",
                     s_.stage_rank[st - 1], " never runs ",
                     to_string(Action::make(ActionKind::kRecvB, st - 1, m)));
      }
    }
  }
}

}  // namespace

void validate_structure(const Schedule& s) {
  const std::string at = detail::concat("schedule '", s.name, "' is invalid: ");
  TANDEM_CHECK(s.num_ranks >= 1 && static_cast<int32_t>(s.ranks.size()) == s.num_ranks, at,
               "it lists ", s.ranks.size(), " ranks but declares ", s.num_ranks);
  TANDEM_CHECK(s.num_stages >= 1 && static_cast<int32_t>(s.stage_rank.size()) == s.num_stages, at,
               "the stage -> rank map has ", s.stage_rank.size(), " entries for ", s.num_stages,
               " stages");
  TANDEM_CHECK(s.num_microbatches >= 1, at, "it has no micro-batches");
  for (int32_t st = 0; st < s.num_stages; ++st) {
    TANDEM_CHECK(s.stage_rank[st] >= 0 && s.stage_rank[st] < s.num_ranks, at, "stage ", st,
                 " is placed on rank ", s.stage_rank[st], ", outside ranks 0..", s.num_ranks - 1);
  }
  for (int32_t r = 0; r < s.num_ranks; ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      check_half_structure(s, r, i, a, a.first_half());
      if (a.kind == ActionKind::kForwardBackward) {
        TANDEM_CHECK(is_backward_of_input(a.second_kind), where(s, r, i, a),
                     "the second half of a combined action must be B or I");
      }
      if (a.kind == ActionKind::kForwardForward) {
        TANDEM_CHECK(a.second_kind == ActionKind::kForward, where(s, r, i, a),
                     "the second half of a pair of forwards must be F");
      }
      if (is_pair(a.kind)) check_half_structure(s, r, i, a, a.second_half());
    }
  }
}

void check_message_order(const Schedule& s);  // validator_run.cc

void validate_schedule(const Schedule& s) {
  validate_structure(s);
  Walk(s).run();
  check_message_order(s);
}

}  // namespace tandem::schedule
