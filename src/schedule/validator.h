// The validator: runs every rank's list against the others before anything executes and rejects
// a schedule that would deadlock, mismatch its messages, or compute the wrong set of work.
#pragma once

#include "schedule/action.h"

namespace tandem::schedule {

// Checks that indices are in range, every stage lives on one rank, every action names a stage
// of its own rank, and SEND/RECV connect stages on different ranks. Throws tandem::Error.
void validate_structure(const Schedule& schedule);

// validate_structure, then, with these execution semantics (docs/schedules.md):
//  - each rank runs its list in order; a compute action needs its inputs already on the rank
//    (a RECV earlier in the list, or the neighbouring stage's action when both stages share the
//    rank), a backward needs its forward, a W needs its I;
//  - a SEND never waits; a RECV waits until the peer has sent, and messages between a pair of
//    ranks are received in the order they were sent;
//  - every (stage, micro-batch) gets exactly one F and either one B or one I and one W; every
//    needed message is sent once and received once.
// Throws tandem::Error naming the schedule, the rank, the action (index and text) and why: a
// backward before its forward, missing or repeated work, an unmatched or misordered send or
// receive, or a deadlock (with what each blocked rank waits for).
void validate_schedule(const Schedule& schedule);

}  // namespace tandem::schedule
