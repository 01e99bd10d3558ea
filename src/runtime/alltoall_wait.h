// Note [Waiting for the slowest expert rank]: an all-to-all moves no data until every rank of
// its expert group has reached it; the ranks that came first wait for the last, which was still
// busy (running its experts on more rows, say). An all-to-all ends at about the same moment on
// every rank of the group, so the part of one rank's span spent waiting is its duration less
// the group's shortest duration of the same all-to-all (the last arrival's, which waited for no
// one); the rest is the transfer, with the node's own local work. The exposed all-to-all (Note
// [Exposed all-to-all] in device_streams.h) then splits in two: the exposed time of the
// transfer parts alone, which overlap can hide, and the rest, the compute stream idle only
// because another rank was late, which no schedule can hide on this rank (balanced routing
// can). The ranks issue the same all-to-alls in the same order (one schedule), which is how
// their spans are matched; the exchange is checked by name.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tandem::runtime {

// One all-to-all span of a step, seconds since the step began on its rank.
struct AllToAllSpan {
  std::string name;
  double start = 0, end = 0;
};

// This rank's spans in issue order, as text for the group exchange ("name\tduration" lines).
std::string alltoall_durations_text(const std::vector<AllToAllSpan>& mine);

// The exposed seconds of `mine` spent waiting for a later rank: `groups_text` holds every group
// rank's alltoall_durations_text (this rank's among them), `compute` the compute stream's busy
// intervals. Returns a negative value when a rank's list does not name the same all-to-alls in
// the same order as this rank's (nothing to match).
double exposed_waiting_seconds(const std::vector<AllToAllSpan>& mine,
                               const std::vector<std::string>& groups_text,
                               const std::vector<std::pair<double, double>>& compute);

}  // namespace tandem::runtime
