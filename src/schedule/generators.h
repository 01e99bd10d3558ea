// Schedule generators: gpipe, 1f1b, interleaved-1f1b, combined-1f1b, zb-h1 and dualpipev, each
// producing every rank's compute list and then the SEND/RECV actions (add_communication).
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>

#include "core/config.h"
#include "core/enum_names.h"
#include "schedule/action.h"

namespace tandem::schedule {

// The pipeline schedules (core/config.h, where --schedule's setting is declared).
using tandem::kNumScheduleKinds;
using tandem::kScheduleKindNames;
using tandem::ScheduleKind;

// "gpipe", "1f1b", "interleaved-1f1b", "combined-1f1b", "zb-h1", "dualpipev".
std::string_view schedule_kind_name(ScheduleKind kind);
// Case-insensitive; throws tandem::Error listing the valid names.
ScheduleKind parse_schedule_kind(std::string_view name);
// "gpipe, 1f1b, ..." for help texts and messages.
std::string schedule_kind_names();

struct ScheduleShape {
  int32_t pipeline_size = 1;     // P: pipeline ranks
  int32_t virtual_stages = 1;    // V: stages per rank
  int32_t num_microbatches = 1;  // M
  // combined-1f1b with P = 1: (0F0;0F1), then (0F2;0B0) ... (Note [Paired forwards]).
  bool pair_first_forwards = false;
};

// How stages sit on ranks: loop style (interleaved) puts stage s on rank s % P; V style
// (dualpipev) puts stages r and 2P-1-r on rank r.
enum class StagePlacement : uint8_t { kLoop, kV };
StagePlacement placement_of(ScheduleKind kind);

// The stages of each kind (V chunks per rank, rank r):
//  gpipe, 1f1b, zb-h1: V = 1, any M >= 1.
//  interleaved-1f1b:   V >= 2, M a multiple of P (Megatron's micro-batch groups).
//  combined-1f1b:      V = 1 (any P, M >= 1; P = 1 is the no-pipeline case) or V >= 2 with
//                      P >= 2 and M a multiple of P.
//  dualpipev:          V = 2, M >= 2P.
//  pair_first_forwards: combined-1f1b with P = 1 and M >= 2 only.
// Throws tandem::Error naming the option and the values that would be valid.
void check_supported(ScheduleKind kind, const ScheduleShape& shape);
// The most (micro-batch, stage) pairs a schedule holds, each a few actions: past any run's, and
// a bound on what building and validating one costs.
constexpr int64_t kMaxScheduleSlots = int64_t{1} << 18;

// The compute actions only (F, B, I, W, FB), stage_rank filled in.
Schedule generate_compute_schedule(ScheduleKind kind, const ScheduleShape& shape);

// Adds SEND/RECV wherever consecutive stages sit on different ranks: the sender's SEND right
// after the compute action that produced the tensor; the receiver's RECV right before the
// compute action that consumes it, hoisted further up when needed so that each pair of ranks
// receives in the order it sends (P2P messages between two ranks match in order).
void add_communication(Schedule& schedule);

// generate_compute_schedule followed by add_communication.
Schedule generate_schedule(ScheduleKind kind, const ScheduleShape& shape);

}  // namespace tandem::schedule
