// Validator. Oracle: hand-written broken schedules, one per kind of fault, each with the rank,
// action and reason the message must name; and generated schedules broken on purpose.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "schedule/generators.h"
#include "schedule/validator.h"

namespace tandem::schedule {
namespace {

std::string error_of(const Schedule& s) {
  try {
    validate_schedule(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(const char* text) { return error_of(parse_schedule(text, "broken")); }

#define EXPECT_MESSAGE(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

TEST(Validator, AcceptsAHandWrittenOneFOneB) {
  EXPECT_EQ(error_of("rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n"), "");
}

TEST(Validator, Deadlock) {
  // Rank 0 waits for a gradient before it has sent the activation that would produce it.
  const std::string msg =
      error_of("rank 0: 0RECV_B0 0F0 0SEND_F0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n");
  EXPECT_MESSAGE(msg,
                 "schedule 'broken' is invalid: deadlock: rank 0 waits at action #0 0RECV_B0 "
                 "for rank 1's 1SEND_B0, while rank 1 is stopped at action #0 1RECV_F0; "
                 "rank 1 waits at action #0 1RECV_F0 for rank 0's 0SEND_F0");
}

TEST(Validator, DeadlockInAGeneratedScheduleWithARecvMovedUp) {
  Schedule s = generate_schedule(ScheduleKind::k1f1b, {4, 1, 8});
  auto& r0 = s.ranks[0];
  const auto it = std::find(r0.begin(), r0.end(), Action::make(ActionKind::kRecvB, 0, 0));
  ASSERT_NE(it, r0.end());
  const Action recv = *it;
  r0.erase(it);
  r0.insert(r0.begin(), recv);
  EXPECT_MESSAGE(error_of(s), "deadlock: rank 0 waits at action #0 0RECV_B0 for rank 1's 1SEND_B0");
}

TEST(Validator, UnmatchedReceive) {
  const std::string msg = error_of("rank 0: 0F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n");
  EXPECT_MESSAGE(msg, "unmatched receive: rank 1 needs 1RECV_F0 but rank 0 never runs 0SEND_F0");
}

TEST(Validator, UnmatchedSendInAGeneratedSchedule) {
  Schedule s = generate_schedule(ScheduleKind::k1f1b, {3, 1, 4});
  auto& r2 = s.ranks[2];
  r2.erase(std::find(r2.begin(), r2.end(), Action::make(ActionKind::kRecvF, 2, 3)));
  EXPECT_MESSAGE(error_of(s), "rank 2, action #");
  EXPECT_MESSAGE(error_of(s),
                 "2F3: its input has not been received: no 2RECV_F3 before it on "
                 "rank 2 to receive what rank 1 sends with 1SEND_F3");
}

TEST(Validator, MisorderedSendAndReceive) {
  const std::string msg = error_of(
      "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
      "rank 1: 1RECV_F1 1RECV_F0 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1\n");
  EXPECT_MESSAGE(msg,
                 "rank 1, action #0 1RECV_F1: misordered receive: it expects 0SEND_F1 from "
                 "rank 0, but the next message rank 0 sends to rank 1 is 0SEND_F0 (its action #1)");
}

TEST(Validator, ReceiveAfterItsConsumer) {
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1F0 1RECV_F0 1B0 1SEND_B0\n"),
                 "rank 1, action #0 1F0: its input has not been received");
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0SEND_F0 0B0 0RECV_B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n"),
                 "rank 0, action #2 0B0: its output gradient has not been received");
}

TEST(Validator, SendBeforeItsProducer) {
  EXPECT_MESSAGE(error_of("rank 0: 0SEND_F0 0F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n"),
                 "rank 0, action #0 0SEND_F0: sends an activation before its forward 0F0 ran");
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1SEND_B0 1B0\n"),
                 "rank 1, action #2 1SEND_B0: sends a gradient before the backward");
}

TEST(Validator, BackwardBeforeItsForward) {
  EXPECT_MESSAGE(error_of("rank 0: 0B0 0F0\n"),
                 "rank 0, action #0 0B0: backward before its forward: 0F0 has not run on rank 0");
  // The halves of a combined action run together: the backward cannot use the forward.
  EXPECT_MESSAGE(error_of("rank 0: (0F0;0B0)\n"),
                 "action #0 (0F0;0B0): backward before its forward");
  EXPECT_EQ(error_of("rank 0: 0F0 0F1 (0F2;0B0) 0B1 0B2\n"), "");
}

TEST(Validator, MissingWork) {
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0B0 0F1\n"),
                 "missing work: rank 0 never runs the backward of stage 0 micro-batch 1");
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0I0\n"), "missing work: rank 0 runs 0I0 but never 0W0");
  EXPECT_MESSAGE(error_of("rank 0: 0F1 0B1\n"), "missing work: rank 0 never runs 0F0");
}

TEST(Validator, RepeatedWork) {
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0F0 0B0\n"),
                 "rank 0, action #1 0F0: repeated work: 0F0 already ran at action #0");
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0B0 0I0\n"), "action #2 0I0: repeated work: the backward");
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0B0 0W0\n"),
                 "action #2 0W0: repeated work: the weight gradient of stage 0 micro-batch 0 was "
                 "already computed");
  EXPECT_MESSAGE(
      error_of("rank 0: 0F0 0SEND_F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n"),
      "rank 0, action #2 0SEND_F0: repeated send");
  EXPECT_MESSAGE(
      error_of("rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1RECV_F0 1F0 1B0 1SEND_B0\n"),
      "rank 1, action #1 1RECV_F0: repeated receive: already received at action #0");
}

// Note [Paired forwards]: the halves run together, so neither may read the other's output.
TEST(Validator, PairedForwards) {
  EXPECT_EQ(error_of("rank 0: (0F0;0F1) 0B0 0B1\n"), "");
  EXPECT_EQ(error_of("rank 0: (0F1;0F0) (0F2;0B0) 0B1 0B2\n"), "");
  EXPECT_MESSAGE(error_of("rank 0: (0F0;0F0) 0B0\n"),
                 "rank 0, action #0 (0F0;0F0): both forwards are micro-batch 0: pair forwards "
                 "of two different micro-batches");
  // Stage 1 of micro-batch 0 reads stage 0's output of the same micro-batch.
  EXPECT_MESSAGE(error_of("rank 0: (0F0;1F0) 1B0 0B0\n"), "both forwards are micro-batch 0");
  EXPECT_MESSAGE(error_of("rank 0: (0F0;0F1) 0B0\n"),
                 "missing work: rank 0 never runs the backward of stage 0 micro-batch 1");
}

TEST(Validator, WeightGradientBeforeItsInputGradient) {
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0W0 0I0\n"),
                 "rank 0, action #1 0W0: weight gradient before its input gradient 0I0");
}

TEST(Validator, StageOnTwoRanksAndNeedlessMessages) {
  EXPECT_MESSAGE(error_of("rank 0: 0F0 1F0 1B0 0B0\nrank 1: 1F0 1B0\n"),
                 "rank 1, action #0 1F0: stage 1 belongs to rank 0, not rank 1");
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0SEND_F0 1RECV_F0 1F0 1B0 0B0\n"),
                 "action #1 0SEND_F0: stage 1 is on the same rank: hand the tensor over locally");
  EXPECT_MESSAGE(error_of("rank 0: 0F0 0SEND_B0 0B0\n"), "stage 0 is the first stage");
}

TEST(Validator, OutOfRangeIndices) {
  Schedule s = generate_schedule(ScheduleKind::k1f1b, {2, 1, 2});
  s.ranks[1].push_back(Action::make(ActionKind::kForward, 1, 5));
  EXPECT_MESSAGE(error_of(s),
                 "rank 1, action #8 1F5: micro-batch 5 is out of range: the schedule "
                 "has micro-batches 0..1");
  s.ranks[1].back() = Action::make(ActionKind::kForward, 9, 0);
  EXPECT_MESSAGE(error_of(s), "stage 9 is out of range: the schedule has stages 0..1");
}

}  // namespace
}  // namespace tandem::schedule
