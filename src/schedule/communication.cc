// add_communication: lowers a compute-only schedule by adding the pipeline SEND/RECV actions.
// Rule: SEND right after the producer; RECV right before the consumer, preceded by the RECVs of
// any message the same peer sent earlier and that was not received yet (P2P matches in order).
#include <unordered_map>

#include "core/error.h"
#include "schedule/generators.h"

namespace tandem::schedule {
namespace {

// A pipeline message, named by the sending half: F = activation of (stage, mb) to stage + 1,
// B = gradient of (stage, mb) to stage - 1.
enum class Direction : uint8_t { kForward, kBackward };

struct Message {
  Direction dir;
  int32_t stage;  // the sending stage
  int32_t mb;
};

class Lowering {
 public:
  explicit Lowering(const Schedule& s) : s_(s) {}

  void run(Schedule& out) {
    collect_sends();
    for (int32_t r = 0; r < s_.num_ranks; ++r) out.ranks[r] = lower_rank(r);
  }

 private:
  // The messages a compute half sends, to which rank.
  bool sends_forward(const Action& f, int32_t rank) const {
    return f.stage + 1 < s_.num_stages && s_.stage_rank[f.stage + 1] != rank;
  }
  bool sends_backward(const Action& b, int32_t rank) const {
    return b.stage > 0 && s_.stage_rank[b.stage - 1] != rank;
  }
  int64_t key(Direction d, int32_t stage, int32_t mb) const {
    return ((static_cast<int64_t>(stage) * s_.num_microbatches + mb) << 1) |
           (d == Direction::kBackward ? 1 : 0);
  }
  int64_t channel(int32_t src, int32_t dst) const {
    return static_cast<int64_t>(src) * s_.num_ranks + dst;
  }

  void add_send(int32_t rank, const Message& m) {
    const int32_t dst = s_.stage_rank[m.dir == Direction::kForward ? m.stage + 1 : m.stage - 1];
    auto& queue = channels_[channel(rank, dst)];
    position_[key(m.dir, m.stage, m.mb)] = static_cast<int64_t>(queue.messages.size());
    queue.messages.push_back(m);
  }

  void collect_sends() {
    for (int32_t r = 0; r < s_.num_ranks; ++r) {
      for (const Action& a : s_.ranks[r]) {
        for (const Action& h : halves(a)) {
          if (h.kind == ActionKind::kForward && sends_forward(h, r))
            add_send(r, {Direction::kForward, h.stage, h.microbatch});
          if (is_backward_of_input(h.kind) && sends_backward(h, r))
            add_send(r, {Direction::kBackward, h.stage, h.microbatch});
        }
      }
    }
  }

  static Action recv_of(const Message& m) {
    return m.dir == Direction::kForward ? Action::make(ActionKind::kRecvF, m.stage + 1, m.mb)
                                        : Action::make(ActionKind::kRecvB, m.stage - 1, m.mb);
  }

  // Appends the RECVs on `rank` up to and including message `m` from `src`.
  void receive(std::vector<Action>& out, int32_t rank, int32_t src, const Message& m) {
    auto it = channels_.find(channel(src, rank));
    const auto pos = position_.find(key(m.dir, m.stage, m.mb));
    if (it == channels_.end() || pos == position_.end())
      return;  // never sent: the validator says so
    auto& queue = it->second;
    while (queue.received <= pos->second) out.push_back(recv_of(queue.messages[queue.received++]));
  }

  std::vector<Action> lower_rank(int32_t r) {
    std::vector<Action> out;
    out.reserve(s_.ranks[r].size() * 3);
    for (const Action& a : s_.ranks[r]) {
      const std::vector<Action> hs = halves(a);
      for (const Action& h : hs) {
        if (h.kind == ActionKind::kForward && h.stage > 0 && s_.stage_rank[h.stage - 1] != r)
          receive(out, r, s_.stage_rank[h.stage - 1],
                  {Direction::kForward, h.stage - 1, h.microbatch});
        if (is_backward_of_input(h.kind) && h.stage + 1 < s_.num_stages &&
            s_.stage_rank[h.stage + 1] != r)
          receive(out, r, s_.stage_rank[h.stage + 1],
                  {Direction::kBackward, h.stage + 1, h.microbatch});
      }
      out.push_back(a);
      for (const Action& h : hs) {
        if (h.kind == ActionKind::kForward && sends_forward(h, r))
          out.push_back(Action::make(ActionKind::kSendF, h.stage, h.microbatch));
        if (is_backward_of_input(h.kind) && sends_backward(h, r))
          out.push_back(Action::make(ActionKind::kSendB, h.stage, h.microbatch));
      }
    }
    return out;
  }

  struct Channel {
    std::vector<Message> messages;
    int64_t received = 0;
  };
  const Schedule& s_;
  std::unordered_map<int64_t, Channel> channels_;
  std::unordered_map<int64_t, int64_t> position_;
};

}  // namespace

void add_communication(Schedule& schedule) {
  for (const auto& list : schedule.ranks) {
    for (const Action& a : list) {
      TANDEM_CHECK(is_compute(a.kind), "add_communication: rank lists already hold ", to_string(a),
                   "; give it a compute-only schedule");
    }
  }
  const Schedule compute = schedule;
  Lowering(compute).run(schedule);
}

}  // namespace tandem::schedule
