// The compute lists of every built-in schedule. Each generator writes rank r's list the way its
// reference implementation does (Megatron-LM for 1f1b, interleaved and combined; PyTorch
// pipelining for zb-h1 and dualpipev); the validator (validator.h) checks every one in tests.
#include "schedule/generators.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <deque>
#include <map>

#include "core/error.h"

namespace tandem::schedule {
namespace {

using ActionList = std::vector<Action>;

Action fwd(int32_t s, int32_t m) { return Action::make(ActionKind::kForward, s, m); }
Action bwd(int32_t s, int32_t m) { return Action::make(ActionKind::kBackward, s, m); }

Schedule empty_schedule(ScheduleKind kind, const ScheduleShape& shape) {
  Schedule s;
  s.name = std::string(schedule_kind_name(kind));
  if (shape.pair_first_forwards) s.name += " (paired first forwards)";
  s.num_ranks = shape.pipeline_size;
  s.num_stages = shape.pipeline_size * shape.virtual_stages;
  s.num_microbatches = shape.num_microbatches;
  s.ranks.resize(s.num_ranks);
  s.stage_rank.resize(s.num_stages);
  const int32_t p = shape.pipeline_size;
  for (int32_t st = 0; st < s.num_stages; ++st) {
    s.stage_rank[st] = placement_of(kind) == StagePlacement::kLoop ? st % p
                       : st < p                                    ? st
                                                                   : 2 * p - 1 - st;
  }
  return s;
}

ActionList gpipe_rank(int32_t r, int32_t m) {
  ActionList out;
  for (int32_t i = 0; i < m; ++i) out.push_back(fwd(r, i));
  for (int32_t i = 0; i < m; ++i) out.push_back(bwd(r, i));
  return out;
}

// warmup forwards, then steady (F(w+i), B(i)) pairs, merged into one FB action when `combined`,
// then the cool-down backwards. 1f1b has warmup P-1-r. combined-1f1b has 2(P-1-r)+1, Megatron's
// interleaved count with one stage per rank: the +1 keeps a pair's halves independent, and the
// step of 2 between neighbours lets rank r+1's pair i use rank r's pair i-2 (with a step of 1 it
// would need pair i-1, and every pair would wait for its neighbour's: half the time idle).
// With pair_first_forwards (combined, P = 1) the warm-up is two forwards run as one pair.
ActionList one_f_one_b_rank(int32_t r, int32_t p, int32_t m, ScheduleKind kind,
                            bool pair_first_forwards) {
  const bool combined = kind == ScheduleKind::kCombined1f1b;
  if (pair_first_forwards) {
    ActionList out = {Action::paired_forwards(r, 0, r, 1)};
    for (int32_t i = 0; i + 2 < m; ++i) {
      out.push_back(Action::combined(r, i + 2, ActionKind::kBackward, r, i));
    }
    for (int32_t i = std::max(0, m - 2); i < m; ++i) out.push_back(bwd(r, i));
    return out;
  }
  const int32_t warmup = std::min(combined ? 2 * (p - 1 - r) + 1 : p - 1 - r, m);
  ActionList out;
  for (int32_t i = 0; i < warmup; ++i) out.push_back(fwd(r, i));
  for (int32_t i = 0; i < m - warmup; ++i) {
    if (combined) {
      out.push_back(Action::combined(r, warmup + i, ActionKind::kBackward, r, i));
    } else {
      out.push_back(fwd(r, warmup + i));
      out.push_back(bwd(r, i));
    }
  }
  for (int32_t i = m - warmup; i < m; ++i) out.push_back(bwd(r, i));
  return out;
}

// Megatron's interleaved order: virtual micro-batch k runs chunk (k / P) % V forward (the
// mirror chunk backward) of micro-batch (k / (P V)) P + k % P.
struct VirtualOrder {
  int32_t p, v, r;
  int32_t mb(int32_t k) const { return (k / (p * v)) * p + k % p; }
  Action forward(int32_t k) const { return fwd(((k / p) % v) * p + r, mb(k)); }
  Action backward(int32_t k) const { return bwd((v - 1 - (k / p) % v) * p + r, mb(k)); }
};

ActionList interleaved_rank(int32_t r, const ScheduleShape& sh, ScheduleKind kind) {
  const bool combined = kind == ScheduleKind::kCombined1f1b;
  const int32_t p = sh.pipeline_size, v = sh.virtual_stages;
  const int32_t total = sh.num_microbatches * v;
  const int32_t warmup = std::min((p - r - 1) * 2 + (v - 1) * p + (combined ? 1 : 0), total);
  const VirtualOrder order{p, v, r};
  ActionList out;
  for (int32_t k = 0; k < warmup; ++k) out.push_back(order.forward(k));
  for (int32_t i = 0; i < total - warmup; ++i) {
    const Action f = order.forward(warmup + i), b = order.backward(i);
    if (combined) {
      out.push_back(
          Action::combined(f.stage, f.microbatch, ActionKind::kBackward, b.stage, b.microbatch));
    } else {
      out.push_back(f);
      out.push_back(b);
    }
  }
  for (int32_t k = total - warmup; k < total; ++k) out.push_back(order.backward(k));
  return out;
}

// ZB-H1 (PyTorch's ZB1P with one stage per rank): 1F1B with I in place of B; rank r runs the W
// of its j-th backward right after its (j + r)-th I, and the last r W's at the end, so the late
// ranks fill their cool-down bubble with weight gradients.
ActionList zb_h1_rank(int32_t r, int32_t p, int32_t m) {
  const int32_t warmup = std::min(p - 1 - r, m);
  ActionList out;
  int32_t next_w = 0;
  auto input_grad = [&](int32_t j) {
    out.push_back(Action::make(ActionKind::kBackwardInput, r, j));
    if (j >= r) out.push_back(Action::make(ActionKind::kBackwardWeight, r, next_w++));
  };
  for (int32_t i = 0; i < warmup; ++i) out.push_back(fwd(r, i));
  for (int32_t j = 0; j < m - warmup; ++j) {
    out.push_back(fwd(r, warmup + j));
    input_grad(j);
  }
  for (int32_t j = m - warmup; j < m; ++j) input_grad(j);
  while (next_w < m) out.push_back(Action::make(ActionKind::kBackwardWeight, r, next_w++));
  return out;
}

// DualPipeV (deepseek-ai/DualPipe dualpipev.py, as ported to PyTorch's ScheduleDualPipeV):
// eight phases per rank over its two stages s0 = r (going down) and s1 = 2P-1-r (coming back).
class DualPipeVRank {
 public:
  DualPipeVRank(int32_t r, int32_t p) : s0_(r), s1_(2 * p - 1 - r) {}

  ActionList build(int32_t r, int32_t p, int32_t m) {
    for (int32_t i = 0; i < (p - r - 1) * 2; ++i) forward(s0_);      // 1: F0
    for (int32_t i = 0; i < r + 1; ++i) forward(s0_), forward(s1_);  // 2: F0 F1
    for (int32_t i = 0; i < p - r - 1; ++i) {                        // 3: I1 W F1
      backward(s1_, ActionKind::kBackwardInput);
      weight_if_pending();
      forward(s1_);
    }
    for (int32_t i = 0; i < m - 2 * p + r + 1; ++i) {  // 4: F0B1 F1B0
      if (i == 0 && r == p - 1) {
        forward(s0_);
        backward(s1_, ActionKind::kBackward);
      } else {
        overlapped(s0_, s1_);
      }
      overlapped(s1_, s0_);
    }
    for (int32_t i = 0; i < p - r - 1; ++i) {  // 5: B1 F1B0
      backward(s1_, ActionKind::kBackward);
      overlapped(s1_, s0_);
    }
    const int32_t step6 = r + 1;  // 6: B1 B0
    bool zb = false;
    for (int32_t i = 0; i < step6; ++i) {
      if (i == step6 / 2 && r % 2 == 1) zb = true;
      backward(s1_, zb ? ActionKind::kBackwardInput : ActionKind::kBackward);
      if (i == step6 / 2 && r % 2 == 0) zb = true;
      backward(s0_, zb ? ActionKind::kBackwardInput : ActionKind::kBackward);
    }
    for (int32_t i = 0; i < p - r - 1; ++i) {  // 7: W B0
      weight_if_pending();
      backward(s0_, zb ? ActionKind::kBackwardInput : ActionKind::kBackward);
    }
    while (!weights_.empty()) weight_if_pending();  // 8: W
    return std::move(out_);
  }

 private:
  void forward(int32_t s) { out_.push_back(fwd(s, next_f_[s]++)); }
  void backward(int32_t s, ActionKind kind) {
    const int32_t mb = next_b_[s]++;
    out_.push_back(Action::make(kind, s, mb));
    if (kind == ActionKind::kBackwardInput)
      weights_.push_back(Action::make(ActionKind::kBackwardWeight, s, mb));
  }
  void overlapped(int32_t f_stage, int32_t b_stage) {
    out_.push_back(Action::combined(f_stage, next_f_[f_stage]++, ActionKind::kBackward, b_stage,
                                    next_b_[b_stage]++));
  }
  void weight_if_pending() {
    if (weights_.empty()) return;
    out_.push_back(weights_.front());
    weights_.pop_front();
  }

  int32_t s0_, s1_;
  std::map<int32_t, int32_t> next_f_, next_b_;
  std::deque<Action> weights_;
  ActionList out_;
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string_view schedule_kind_name(ScheduleKind kind) { return enum_name(kind); }

std::string schedule_kind_names() { return enum_choices<ScheduleKind>(); }

ScheduleKind parse_schedule_kind(std::string_view name) {
  const std::string key = lower(name);
  if (const std::optional<ScheduleKind> kind = parse_enum<ScheduleKind>(key)) return *kind;
  throw Error(detail::concat("--schedule '", name, "' is unknown: valid schedules are ",
                             schedule_kind_names()));
}

StagePlacement placement_of(ScheduleKind kind) {
  return kind == ScheduleKind::kDualPipeV ? StagePlacement::kV : StagePlacement::kLoop;
}

void check_supported(ScheduleKind kind, const ScheduleShape& sh) {
  const std::string_view name = schedule_kind_name(kind);
  const int32_t p = sh.pipeline_size, v = sh.virtual_stages, m = sh.num_microbatches;
  TANDEM_CHECK(p >= 1, "--pipeline-model-parallel-size ", p, " is invalid: need at least 1");
  TANDEM_CHECK(v >= 1, "--virtual-pipeline-model-parallel-size ", v,
               " is invalid: need at least 1");
  TANDEM_CHECK(m >= 1, "--num-microbatches ", m, " is invalid: need at least 1");
  TANDEM_CHECK(int64_t{m} * p * v <= kMaxScheduleSlots, m, " micro-batches x ", int64_t{p} * v,
               " stages = ", int64_t{m} * p * v,
               " (micro-batch, stage) pairs are too many for a schedule: at most ",
               kMaxScheduleSlots,
               " (the micro-batches: --num-microbatches, or --global-batch-size over "
               "--micro-batch-size and the data-parallel ranks; the stages: "
               "--pipeline-model-parallel-size x --virtual-pipeline-model-parallel-size); use a "
               "larger --micro-batch-size");
  if (sh.pair_first_forwards) {
    TANDEM_CHECK(kind == ScheduleKind::kCombined1f1b,
                 "--pair-first-forwards pairs combined-1f1b's first two forwards; --schedule ",
                 name, " has no such pairs (use combined-1f1b)");
    TANDEM_CHECK(p == 1 && v == 1,
                 "--pair-first-forwards needs one stage: --pipeline-model-parallel-size 1 and "
                 "--virtual-pipeline-model-parallel-size 1 (got ",
                 p, " and ", v, ")");
    TANDEM_CHECK(m >= 2, "--pair-first-forwards needs --num-microbatches >= 2 (got ", m, ")");
  }
  switch (kind) {
    case ScheduleKind::kGpipe:
    case ScheduleKind::k1f1b:
    case ScheduleKind::kZbH1:
      TANDEM_CHECK(v == 1, name,
                   " runs one stage per rank: --virtual-pipeline-model-parallel-size ", v,
                   " is not supported (use 1, or interleaved-1f1b / dualpipev for more)");
      return;
    case ScheduleKind::kInterleaved1f1b:
      TANDEM_CHECK(v >= 2,
                   "interleaved-1f1b needs --virtual-pipeline-model-parallel-size >= 2 "
                   "(got ",
                   v, "); use 1f1b for one stage per rank");
      TANDEM_CHECK(m % p == 0, "interleaved-1f1b needs --num-microbatches (", m,
                   ") to be a multiple of --pipeline-model-parallel-size (", p, ")");
      return;
    case ScheduleKind::kCombined1f1b:
      if (v == 1) return;
      TANDEM_CHECK(p >= 2,
                   "combined-1f1b with --pipeline-model-parallel-size 1 runs one stage: "
                   "--virtual-pipeline-model-parallel-size must be 1 (got ",
                   v, ")");
      TANDEM_CHECK(m % p == 0, "combined-1f1b with virtual stages needs --num-microbatches (", m,
                   ") to be a multiple of --pipeline-model-parallel-size (", p, ")");
      return;
    case ScheduleKind::kDualPipeV:
      TANDEM_CHECK(v == 2,
                   "dualpipev places exactly 2 stages on each rank: "
                   "--virtual-pipeline-model-parallel-size must be 2 (got ",
                   v, ")");
      TANDEM_CHECK(m >= 2 * p,
                   "dualpipev needs --num-microbatches >= 2 x "
                   "--pipeline-model-parallel-size = ",
                   2 * p, " (got ", m, ")");
      return;
  }
}

Schedule generate_compute_schedule(ScheduleKind kind, const ScheduleShape& sh) {
  check_supported(kind, sh);
  Schedule s = empty_schedule(kind, sh);
  const int32_t p = sh.pipeline_size, m = sh.num_microbatches;
  for (int32_t r = 0; r < p; ++r) {
    auto& list = s.ranks[r];
    switch (kind) {
      case ScheduleKind::kGpipe:
        list = gpipe_rank(r, m);
        break;
      case ScheduleKind::k1f1b:
        list = one_f_one_b_rank(r, p, m, kind, false);
        break;
      case ScheduleKind::kInterleaved1f1b:
        list = interleaved_rank(r, sh, kind);
        break;
      case ScheduleKind::kCombined1f1b:
        list = sh.virtual_stages == 1 ? one_f_one_b_rank(r, p, m, kind, sh.pair_first_forwards)
                                      : interleaved_rank(r, sh, kind);
        break;
      case ScheduleKind::kZbH1:
        list = zb_h1_rank(r, p, m);
        break;
      case ScheduleKind::kDualPipeV:
        list = DualPipeVRank(r, p).build(r, p, m);
        break;
    }
  }
  return s;
}

Schedule generate_schedule(ScheduleKind kind, const ScheduleShape& shape) {
  Schedule s = generate_compute_schedule(kind, shape);
  add_communication(s);
  return s;
}

}  // namespace tandem::schedule
