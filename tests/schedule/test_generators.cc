// Generators. Oracles: hand-written lists for small cases (Megatron's 1F1B / interleaved /
// combined warm-up counts, PyTorch's ZB1P W delay and DualPipeV phases worked out on paper), the
// validator over a grid of PP x VPP x micro-batch sizes, and the error text for what is refused.
#include <gtest/gtest.h>

#include <sstream>

#include "core/error.h"
#include "schedule/generators.h"
#include "schedule/validator.h"

namespace tandem::schedule {
namespace {

std::string join(const std::vector<Action>& list) {
  std::string out;
  for (const Action& a : list) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

std::string error_of(ScheduleKind kind, ScheduleShape shape) {
  try {
    generate_schedule(kind, shape);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Generators, OneFOneBWithCommunication) {
  const Schedule s = generate_schedule(ScheduleKind::k1f1b, {2, 1, 3});
  EXPECT_EQ(join(s.ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2");
  EXPECT_EQ(join(s.ranks[1]),
            "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2");
}

TEST(Generators, GPipe) {
  const Schedule s = generate_compute_schedule(ScheduleKind::kGpipe, {2, 1, 2});
  EXPECT_EQ(join(s.ranks[0]), "0F0 0F1 0B0 0B1");
  EXPECT_EQ(join(s.ranks[1]), "1F0 1F1 1B0 1B1");
}

TEST(Generators, InterleavedMegatronOrder) {
  const Schedule s = generate_compute_schedule(ScheduleKind::kInterleaved1f1b, {2, 2, 2});
  EXPECT_EQ(s.stage_rank, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(join(s.ranks[0]), "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1");
  EXPECT_EQ(join(s.ranks[1]), "1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1");
}

TEST(Generators, CombinedPairsForwardOfOneMicroBatchWithBackwardOfAnother) {
  EXPECT_EQ(join(generate_schedule(ScheduleKind::kCombined1f1b, {1, 1, 3}).ranks[0]),
            "0F0 (0F1;0B0) (0F2;0B1) 0B2");
  // PP = 2: warm-up 2(P-1-r)+1 (Megatron's interleaved count with one stage per rank), so that
  // rank r+1's pair i needs rank r's pair i-2, not i-1, and no pair waits on its neighbour's.
  const Schedule s = generate_compute_schedule(ScheduleKind::kCombined1f1b, {2, 1, 4});
  EXPECT_EQ(join(s.ranks[0]), "0F0 0F1 0F2 (0F3;0B0) 0B1 0B2 0B3");
  EXPECT_EQ(join(s.ranks[1]), "1F0 (1F1;1B0) (1F2;1B1) (1F3;1B2) 1B3");
}

// Note [Paired forwards]: the first two forwards as one pair, the steady pairs one micro-batch
// later, two backwards alone at the end.
TEST(Generators, CombinedWithPairedFirstForwards) {
  EXPECT_EQ(join(generate_schedule(ScheduleKind::kCombined1f1b, {1, 1, 4, true}).ranks[0]),
            "(0F0;0F1) (0F2;0B0) (0F3;0B1) 0B2 0B3");
  EXPECT_EQ(join(generate_schedule(ScheduleKind::kCombined1f1b, {1, 1, 2, true}).ranks[0]),
            "(0F0;0F1) 0B0 0B1");
  // What the run's banner, the plan's table and its JSON call it.
  EXPECT_EQ(generate_schedule(ScheduleKind::kCombined1f1b, {1, 1, 2, true}).name,
            "combined-1f1b (paired first forwards)");
  for (int32_t m = 2; m <= 9; ++m) {
    EXPECT_NO_THROW(
        validate_schedule(generate_schedule(ScheduleKind::kCombined1f1b, {1, 1, m, true})))
        << m;
  }
  EXPECT_NE(error_of(ScheduleKind::kCombined1f1b, {2, 1, 4, true})
                .find("--pair-first-forwards needs one stage: --pipeline-model-parallel-size 1 "
                      "and --virtual-pipeline-model-parallel-size 1 (got 2 and 1)"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::k1f1b, {1, 1, 4, true})
                .find("--schedule 1f1b has no such pairs (use combined-1f1b)"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kCombined1f1b, {1, 1, 1, true})
                .find("--pair-first-forwards needs --num-microbatches >= 2 (got 1)"),
            std::string::npos);
}

TEST(Generators, ZeroBubbleH1DelaysWeightGradientsByRank) {
  const Schedule s = generate_compute_schedule(ScheduleKind::kZbH1, {2, 1, 3});
  EXPECT_EQ(join(s.ranks[0]), "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2");
  EXPECT_EQ(join(s.ranks[1]), "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2");
}

TEST(Generators, DualPipeVPhases) {
  const Schedule one = generate_compute_schedule(ScheduleKind::kDualPipeV, {1, 2, 2});
  EXPECT_EQ(join(one.ranks[0]), "0F0 1F0 0F1 1B0 (1F1;0B0) 1B1 0I1 0W1");
  const Schedule s = generate_compute_schedule(ScheduleKind::kDualPipeV, {2, 2, 4});
  EXPECT_EQ(s.stage_rank, (std::vector<int32_t>{0, 1, 1, 0}));
  // Rank 0: F0 x2, F0 F1, I1 W F1, main (F0B1)(F1B0) x1, B1 (F1B0), B1 B0 (zero bubble from
  // the first B0 on an even rank), W B0, W.
  EXPECT_EQ(join(s.ranks[0]),
            "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1) (3F2;0B0) 3B2 (3F3;0B1) 3B3 0I2 0W2 0I3 0W3");
  EXPECT_EQ(join(s.ranks[1]),
            "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0) (1F3;2B1) (2F3;1B1) 2B2 1B2 2I3 1I3 2W3 1W3");
}

TEST(Generators, EveryScheduleValidatesOverAGrid) {
  int checked = 0;
  for (int32_t p = 1; p <= 6; ++p) {
    for (int32_t m = 1; m <= 13; ++m) {
      for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1f1b, ScheduleKind::kZbH1,
                             ScheduleKind::kCombined1f1b}) {
        EXPECT_NO_THROW(validate_schedule(generate_schedule(k, {p, 1, m})))
            << schedule_kind_name(k) << " P" << p << " M" << m;
        ++checked;
      }
      if (m >= 2 * p) {
        EXPECT_NO_THROW(validate_schedule(generate_schedule(ScheduleKind::kDualPipeV, {p, 2, m})))
            << "dualpipev P" << p << " M" << m;
        ++checked;
      }
      for (int32_t v = 2; v <= 4 && m % p == 0; ++v) {
        EXPECT_NO_THROW(
            validate_schedule(generate_schedule(ScheduleKind::kInterleaved1f1b, {p, v, m})))
            << "interleaved P" << p << " V" << v << " M" << m;
        ++checked;
        if (p >= 2) {
          EXPECT_NO_THROW(
              validate_schedule(generate_schedule(ScheduleKind::kCombined1f1b, {p, v, m})))
              << "combined P" << p << " V" << v << " M" << m;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 450);
}

TEST(Generators, RefusesWhatTheyDoNotSupportWithAClearMessage) {
  EXPECT_NE(error_of(ScheduleKind::kGpipe, {2, 2, 4})
                .find("gpipe runs one stage per rank: --virtual-pipeline-model-parallel-size 2 is "
                      "not supported"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kZbH1, {2, 3, 4}).find("zb-h1 runs one stage per rank"),
            std::string::npos);
  EXPECT_NE(
      error_of(ScheduleKind::kInterleaved1f1b, {4, 2, 6})
          .find("--num-microbatches (6) to be a multiple of --pipeline-model-parallel-size (4)"),
      std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kInterleaved1f1b, {4, 1, 8}).find("use 1f1b"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kCombined1f1b, {1, 2, 8})
                .find("--virtual-pipeline-model-parallel-size must be 1 (got 2)"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kDualPipeV, {4, 1, 8}).find("must be 2 (got 1)"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kDualPipeV, {4, 2, 7})
                .find(">= 2 x --pipeline-model-parallel-size = 8 (got 7)"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::k1f1b, {0, 1, 4}).find("--pipeline-model-parallel-size 0"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::k1f1b, {2, 1, 0}).find("--num-microbatches 0"),
            std::string::npos);
  try {
    parse_schedule_kind("zb-h2");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'zb-h2' is unknown: valid schedules are gpipe, 1f1b, "
                                         "interleaved-1f1b, combined-1f1b, zb-h1, dualpipev"),
              std::string::npos);
  }
  EXPECT_EQ(parse_schedule_kind("DualPipeV"), ScheduleKind::kDualPipeV);
}

TEST(Generators, LoweringReceivesInSendOrder) {
  // Rank 1 consumes mb 1 before mb 0, but rank 0 sends mb 0 first: the RECV of mb 0 is hoisted.
  Schedule s = parse_schedule("rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F1 1F0 1B0 1B1\n", "swap");
  add_communication(s);
  EXPECT_EQ(join(s.ranks[1]), "1RECV_F0 1RECV_F1 1F1 1F0 1B0 1SEND_B0 1B1 1SEND_B1");
  EXPECT_NO_THROW(validate_schedule(s));
}

}  // namespace
}  // namespace tandem::schedule
