// The split of the exposed all-to-all into waiting for a later rank and the transfer
// (Note [Waiting for the slowest expert rank]).
#include <gtest/gtest.h>

#include "runtime/alltoall_wait.h"

namespace tandem::runtime {
namespace {

constexpr double kEps = 1e-12;

TEST(AllToAllWait, WaitIsTheSpanLessTheLastArrivalsDuration) {
  // This rank: dispatch [0,10], combine [20,22]; the compute stream busy [10,20]. The other rank
  // took 4 and 2: it arrived 6 late at the dispatch and on time at the combine. Exposed 10 + 2;
  // of it the transfers [6,10] and [20,22] = 6, the rest (6) waiting.
  const std::vector<AllToAllSpan> mine = {{"F0 dispatch", 0, 10}, {"F0 combine", 20, 22}};
  const std::vector<AllToAllSpan> other = {{"F0 dispatch", 50, 54}, {"F0 combine", 70, 72}};
  const std::vector<std::string> group = {alltoall_durations_text(mine),
                                          alltoall_durations_text(other)};
  EXPECT_NEAR(exposed_waiting_seconds(mine, group, {{10, 20}}), 6, kEps);
  // Compute covering the first 6 leaves no wait exposed, only the transfers.
  EXPECT_NEAR(exposed_waiting_seconds(mine, group, {{0, 6}, {10, 20}}), 0, kEps);
  // The last arrival itself waits for no one.
  EXPECT_NEAR(exposed_waiting_seconds(other, group, {}), 0, kEps);
  // A rank alone (or all arriving together): no wait.
  EXPECT_NEAR(exposed_waiting_seconds(mine, {alltoall_durations_text(mine)}, {}), 0, kEps);
}

TEST(AllToAllWait, OverlappingSpansCountOnce) {
  // Two all-to-alls in flight at once (one on each stream): [0,8] waiting [0,6]; [4,10] (the
  // peer's took 6, so no wait). Exposed [0,10] = 10; transfers [6,8] u [4,10] = 6; waiting 4.
  const std::vector<AllToAllSpan> mine = {{"B1 combine", 0, 8}, {"F2 dispatch", 4, 10}};
  const std::vector<AllToAllSpan> other = {{"B1 combine", 0, 2}, {"F2 dispatch", 0, 6}};
  const std::vector<std::string> group = {alltoall_durations_text(mine),
                                          alltoall_durations_text(other)};
  EXPECT_NEAR(exposed_waiting_seconds(mine, group, {}), 4, kEps);
}

TEST(AllToAllWait, UnmatchedListsGiveNoFigure) {
  const std::vector<AllToAllSpan> mine = {{"F0 dispatch", 0, 10}, {"F0 combine", 20, 22}};
  const std::string self = alltoall_durations_text(mine);
  const std::vector<AllToAllSpan> renamed = {{"F0 dispatch", 0, 4}, {"F1 combine", 5, 7}};
  const std::vector<AllToAllSpan> shorter = {{"F0 dispatch", 0, 4}};
  EXPECT_LT(exposed_waiting_seconds(mine, {self, alltoall_durations_text(renamed)}, {}), 0);
  EXPECT_LT(exposed_waiting_seconds(mine, {self, alltoall_durations_text(shorter)}, {}), 0);
  EXPECT_LT(exposed_waiting_seconds(mine, {self, self + "F2 dispatch\t1\n"}, {}), 0);
  EXPECT_LT(exposed_waiting_seconds(mine, {self, "garbage"}, {}), 0);
}

}  // namespace
}  // namespace tandem::runtime
