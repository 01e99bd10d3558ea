// ArrivalBoard (Note [Who did not arrive] in comm/arrivals.h) on CPU ranks. Oracle: the ranks
// the test makes skip an announcement, and their world ranks computed from the group's order.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/arrivals.h"
#include "comm/self_communicator.h"
#include "dist_env.h"

namespace tandem::comm {
namespace {

using testing::g_world;

// What `board` says once it says `expected`, or after 30 s: an announcement is an eager send,
// but one sent before a barrier may still be on its way after it.
std::string not_arrived_once(ArrivalBoard& board, const std::string& expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string said = board.not_arrived();
  while (said != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    said = board.not_arrived();
  }
  return said;
}

// The group lists the world in reverse, so group rank g is world rank n - 1 - g. Every rank
// announces two collectives but the even group ranks only one: each odd one names the even
// ones, and an even one names nobody (no peer is behind it). Once they announce the second,
// nobody is named.
TEST(Arrivals, RanksThatSkipAnAnnouncementAreNamed) {
  const int n = g_world->size();
  std::vector<int> reversed(n);
  for (int i = 0; i < n; ++i) reversed[i] = n - 1 - i;
  auto group = g_world->subgroup(reversed, "reversed");
  const std::unique_ptr<ArrivalBoard> board = arrival_board(*group);
  ASSERT_NE(board, nullptr);
  const int me = group->rank();
  EXPECT_EQ(board->world_rank(me), g_world->rank());
  const bool skips = me % 2 == 0;

  board->arrive();
  if (!skips) board->arrive();
  g_world->barrier();
  std::string skipped;
  for (int g = 0; g < n; g += 2) {
    skipped += detail::concat(g == 0 ? "" : ", ", "rank ", g, " (world rank ", n - 1 - g, ")");
  }
  const std::string expected =
      skips ? "" : "not arrived: " + skipped + " (stopped, hung, or still in an earlier operation)";
  EXPECT_EQ(not_arrived_once(*board, expected), expected) << "group rank " << me;
  g_world->barrier();  // every rank has looked before the even ones catch up

  if (skips) board->arrive();
  g_world->barrier();
  EXPECT_EQ(not_arrived_once(*board, ""), "") << "group rank " << me;
}

// A group that is not MPI's has no board: the NCCL groups of a run without mpirun.
TEST(Arrivals, NoBoardOutsideMpi) {
  const std::unique_ptr<Communicator> self = self_world();
  EXPECT_EQ(arrival_board(*self), nullptr);
}

}  // namespace
}  // namespace tandem::comm
