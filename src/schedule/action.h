// The schedule IR: one action per entry of a rank's list, printed and parsed in PyTorch
// pipelining's notation (`0F3`, `1I2`, `0W2`, `2SEND_F1`, `(0F4;1B2)`); a Schedule is the
// per-rank lists plus the stage -> rank map. Pure data: no device, no timing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::schedule {

// What an action does. kBackward is the full backward (input and weight gradients together);
// a schedule that splits the weight gradient off writes kBackwardInput (`I`) and, later,
// kBackwardWeight (`W`) for the same stage and micro-batch instead. Stage indices in SEND/RECV
// are the stage on the acting rank: `2SEND_F1` is stage 2 sending micro-batch 1's activation
// to stage 3, `3RECV_F1` is stage 3 receiving it; `3SEND_B1` / `2RECV_B1` carry the gradient
// back.
enum class ActionKind : uint8_t {
  kForward,          // F
  kBackward,         // B: input and weight gradients
  kBackwardInput,    // I: input gradient only (its W follows later)
  kBackwardWeight,   // W: weight gradient of an earlier I
  kForwardBackward,  // (F;B) or (F;I): a forward and a backward of the same rank, overlapped
  kSendF,
  kRecvF,
  kSendB,
  kRecvB,
  kForwardForward,  // (F;F): two forwards of the same rank, overlapped (Note [Paired forwards])
};
constexpr int kNumActionKinds = 10;

// The text of a kind: "F", "B", "I", "W", "FB", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "FF".
std::string_view action_kind_name(ActionKind kind);

bool is_compute(ActionKind kind);            // F, B, I, W, FB, FF
bool is_communication(ActionKind kind);      // SEND_*, RECV_*
bool is_backward_of_input(ActionKind kind);  // B or I: produces the input gradient
bool is_pair(ActionKind kind);               // FB or FF: two halves run together

// Note [Paired forwards]: the first forward of combined 1F1B with one stage has no backward to
// pair with, so each of its all-to-alls is exposed: every node reads the one before. (F;F) runs
// two forwards layer by layer, each one's all-to-all beside the other's attention or experts;
// the steady (F;B) pairs then start one micro-batch later, so the rank holds one more
// micro-batch's activations. The halves must be different micro-batches (neither may read the
// other's output).

// One entry of a rank's list. For a pair, (stage, microbatch) is the first half, a forward, and
// (second_stage, second_microbatch, second_kind) the second half: kBackward or kBackwardInput
// for kForwardBackward, kForward for kForwardForward. For every other kind the second_* fields
// are unused and left at their defaults.
struct Action {
  ActionKind kind = ActionKind::kForward;
  int32_t stage = 0;
  int32_t microbatch = 0;
  ActionKind second_kind = ActionKind::kBackward;
  int32_t second_stage = 0;
  int32_t second_microbatch = 0;

  static Action make(ActionKind kind, int32_t stage, int32_t microbatch);
  static Action combined(int32_t f_stage, int32_t f_mb, ActionKind second_kind, int32_t b_stage,
                         int32_t b_mb);
  static Action paired_forwards(int32_t stage, int32_t mb, int32_t second_stage, int32_t second_mb);
  // The halves of a pair (kForward and second_kind); *this for a single action.
  Action first_half() const;
  Action second_half() const;

  bool operator==(const Action& other) const;
};

// The halves of an action: one for a single action, two for a pair.
std::vector<Action> halves(const Action& action);

// `0F3`, `1B2`, `0I2`, `0W2`, `2SEND_F1`, `(0F4;1B2)`, `(0F0;0F1)`.
std::string to_string(const Action& action);

// Parses one action; throws tandem::Error naming the text and the accepted forms. A combined
// action may carry PyTorch's `OVERLAP_F_B` suffix: `(0F7;7B3)OVERLAP_F_B`.
Action parse_action(std::string_view text);

// Every rank's list. stage_rank[s] is the rank that runs stage s (one rank per stage).
struct Schedule {
  std::string name;
  int32_t num_ranks = 0;
  int32_t num_stages = 0;
  int32_t num_microbatches = 0;
  std::vector<int32_t> stage_rank;
  std::vector<std::vector<Action>> ranks;

  // The stages rank r runs, in increasing order.
  std::vector<int32_t> stages_of_rank(int32_t rank) const;
  int64_t num_actions() const;
};

// The text form (docs/schedules.md): a `#` comment header, then one line per rank,
// `rank R: A A A ...`.
std::string format_schedule(const Schedule& schedule);

// Parses the text form; `#` starts a comment, blank lines are skipped, actions are separated by
// spaces or commas. The stage -> rank map, stage count and micro-batch count are inferred from
// the compute actions (a stage belongs to the first rank that computes it; the validator rejects
// a stage computed on two ranks). Throws tandem::Error naming `source`, the line and the text.
Schedule parse_schedule(std::string_view text, std::string_view source);

// Reads and parses a schedule file; throws tandem::Error if it cannot be read.
Schedule load_schedule_file(const std::string& path);

}  // namespace tandem::schedule
