// Note [Send buffers released when known delivered] (schedule/send_release.cc): where each
// SEND's buffer goes. Oracle: the release points worked out by hand from 1F1B's lists on two
// ranks (tests/schedule/test_generators.cc holds the lists themselves).
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "schedule/generators.h"
#include "schedule/send_release.h"

namespace tandem::schedule {
namespace {

// The non-empty entries of one rank's releases: RECV index -> SEND indices.
std::map<int32_t, std::vector<int32_t>> non_empty(const std::vector<std::vector<int32_t>>& r) {
  std::map<int32_t, std::vector<int32_t>> out;
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r[i].empty()) out[static_cast<int32_t>(i)] = r[i];
  }
  return out;
}

TEST(SendRelease, OneFOneBOnTwoRanks) {
  // rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2
  // rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2
  // Rank 1 sends B k after it received F k, so rank 0's RECV_B k proves F k delivered. Rank 0
  // sends F k + 2 after it received B k, so rank 1's RECV_F2 proves B0 delivered; B1 and B2
  // nothing proves: they go at the step's end.
  const Schedule s = generate_schedule(ScheduleKind::k1f1b, {2, 1, 3});
  const SendReleases r = send_releases(s);
  ASSERT_EQ(r.size(), 2u);
  ASSERT_EQ(r[0].size(), s.ranks[0].size());
  EXPECT_EQ(non_empty(r[0]),
            (std::map<int32_t, std::vector<int32_t>>{{4, {1}}, {8, {3}}, {10, {7}}}));
  EXPECT_EQ(non_empty(r[1]), (std::map<int32_t, std::vector<int32_t>>{{8, {3}}}));
}

// Every SEND is released at most once, by a RECV of its own rank after it.
TEST(SendRelease, EachSendAtMostOnceByALaterReceive) {
  for (const ScheduleKind kind : {ScheduleKind::k1f1b, ScheduleKind::kInterleaved1f1b,
                                  ScheduleKind::kZbH1, ScheduleKind::kGpipe}) {
    for (const int32_t pp : {2, 4}) {
      const int32_t v = kind == ScheduleKind::kInterleaved1f1b ? 2 : 1;
      const Schedule s = generate_schedule(kind, {pp, v, 2 * pp});
      const SendReleases r = send_releases(s);
      for (int32_t rank = 0; rank < pp; ++rank) {
        std::vector<int> times(s.ranks[rank].size(), 0);
        for (size_t i = 0; i < r[rank].size(); ++i) {
          for (const int32_t send : r[rank][i]) {
            const ActionKind k = s.ranks[rank][i].kind;
            EXPECT_TRUE(k == ActionKind::kRecvF || k == ActionKind::kRecvB);
            EXPECT_LT(send, static_cast<int32_t>(i));
            const ActionKind sk = s.ranks[rank][static_cast<size_t>(send)].kind;
            EXPECT_TRUE(sk == ActionKind::kSendF || sk == ActionKind::kSendB);
            ++times[static_cast<size_t>(send)];
          }
        }
        for (const int t : times) EXPECT_LE(t, 1);
      }
    }
  }
}

}  // namespace
}  // namespace tandem::schedule
