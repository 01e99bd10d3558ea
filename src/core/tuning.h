// Note [Performance settings]: settings that change how fast a run computes, never what it
// computes (the results are bitwise the same for every value): the GEMM tuner, the experts'
// streams and grouped products, the attention kernels' tile shapes. They are rows of the
// settings (tuning_settings, core/setting_tables.cc; --help's "Performance" section), and the
// ops read them here, process-wide; the program sets them from its options before the first op
// runs.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct Tuning {
  // --gemm-tune: time up to 8 of cuBLASLt's candidates on a product's first call and keep the
  // fastest of those with the first choice's bits (Note [Tuned algorithms] in ops/cuda/gemm.cc).
  bool gemm_tune = true;
  // --expert-lanes: streams the experts' products of a node run on (Note [Lanes] in ops/ops.h).
  int64_t expert_lanes = 4;
  // --expert-grouped: which phases of the experts' products run as one call for all experts
  // (Note [Grouped expert products] in ops/ops.h): auto (by the rows per expert), none,
  // forward, input, or forward,input.
  std::string expert_grouped = "auto";
  // --attention-*-variant: the tile shape of the attention kernels, by name or index in their
  // tables (Note [Attention variants] in ops/cuda/attention.cu); "": the first.
  std::string attention_forward;
  std::string attention_backward;
  std::string attention_forward128;
  std::string attention_backward128;
};

// The most lanes --expert-lanes may ask for.
inline constexpr int64_t kMaxExpertLanes = 8;
// --expert-grouped's valid values.
inline constexpr const char* kExpertGroupedValues[] = {"auto", "none", "forward", "input",
                                                       "forward,input"};

// The process's performance settings (the defaults until set_tuning).
const Tuning& tuning();
// Throws tandem::Error naming the value for --expert-lanes outside [1, kMaxExpertLanes] or an
// unknown --expert-grouped (the attention variants are the kernels' to check: ops::check_tuning).
void validate_tuning(const Tuning& t);
// Replaces them (validated); call before ops run, not beside running ops.
void set_tuning(const Tuning& t);
// Counts the calls of set_tuning, so that a reader that parses a value can keep it until the
// next.
uint64_t tuning_generation();

}  // namespace tandem
