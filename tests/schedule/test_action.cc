// Action IR text form. Oracle: PyTorch pipelining's notation written out by hand (`0F3`,
// `2SEND_F1`, `(0F7;7B3)OVERLAP_F_B`), and parse(print(x)) == x over every generated schedule.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "schedule/action.h"
#include "schedule/generators.h"

namespace tandem::schedule {
namespace {

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Action, PrintsPyTorchNotation) {
  EXPECT_EQ(to_string(Action::make(ActionKind::kForward, 0, 3)), "0F3");
  EXPECT_EQ(to_string(Action::make(ActionKind::kBackward, 1, 2)), "1B2");
  EXPECT_EQ(to_string(Action::make(ActionKind::kBackwardInput, 0, 2)), "0I2");
  EXPECT_EQ(to_string(Action::make(ActionKind::kBackwardWeight, 0, 2)), "0W2");
  EXPECT_EQ(to_string(Action::make(ActionKind::kSendF, 2, 1)), "2SEND_F1");
  EXPECT_EQ(to_string(Action::make(ActionKind::kRecvF, 3, 1)), "3RECV_F1");
  EXPECT_EQ(to_string(Action::make(ActionKind::kSendB, 3, 0)), "3SEND_B0");
  EXPECT_EQ(to_string(Action::make(ActionKind::kRecvB, 3, 0)), "3RECV_B0");
  EXPECT_EQ(to_string(Action::combined(0, 4, ActionKind::kBackward, 1, 2)), "(0F4;1B2)");
  EXPECT_EQ(to_string(Action::combined(0, 4, ActionKind::kBackwardInput, 1, 2)), "(0F4;1I2)");
  EXPECT_EQ(to_string(Action::paired_forwards(0, 0, 0, 1)), "(0F0;0F1)");
}

TEST(Action, ParsesEveryKind) {
  for (const char* text : {"0F3", "12B20", "0I2", "7W0", "2SEND_F1", "3RECV_F1", "3SEND_B0",
                           "2RECV_B0", "(0F4;1B2)", "(10F0;3I99)", "(0F0;0F1)", "(0F4;1F2)"}) {
    EXPECT_EQ(to_string(parse_action(text)), text);
  }
  const Action fb = parse_action("(0F7;7B3)OVERLAP_F_B");
  EXPECT_EQ(fb.kind, ActionKind::kForwardBackward);
  EXPECT_EQ(fb.stage, 0);
  EXPECT_EQ(fb.microbatch, 7);
  EXPECT_EQ(fb.second_stage, 7);
  EXPECT_EQ(fb.second_microbatch, 3);
  EXPECT_EQ(fb.second_kind, ActionKind::kBackward);
  EXPECT_EQ(parse_action("(1B2;0F4)"), parse_action("(0F4;1B2)"));
  EXPECT_EQ(parse_action("( 0F4 ; 1B2 )"), parse_action("(0F4;1B2)"));
  const Action ff = parse_action("(0F0;2F1)");
  EXPECT_EQ(ff.kind, ActionKind::kForwardForward);
  EXPECT_EQ(ff.first_half(), Action::make(ActionKind::kForward, 0, 0));
  EXPECT_EQ(ff.second_half(), Action::make(ActionKind::kForward, 2, 1));
  EXPECT_EQ(halves(ff).size(), 2u);
  EXPECT_EQ(halves(Action::make(ActionKind::kForward, 0, 0)).size(), 1u);
  EXPECT_FALSE(parse_action("(0F0;0F1)") == parse_action("(0F1;0F0)"));  // order is kept
}

TEST(Action, RejectsMalformed) {
  for (const char* text : {"", "F3", "0F", "0X3", "0f3", "(0F4)", "(0FF4;1F2)", "(0B4;1B2)",
                           "(0F4;1W2)", "0SEND3", "0F3x", "(0F4;1B2", "(0F4;1SEND_F2)"}) {
    const std::string msg = error_of([&] { parse_action(text); });
    EXPECT_NE(msg.find("bad action '" + std::string(text) + "'"), std::string::npos) << text;
    EXPECT_NE(msg.find("such as 0F3"), std::string::npos) << msg;
  }
}

TEST(Schedule, TextRoundTripOfEveryGenerator) {
  const std::pair<ScheduleKind, ScheduleShape> cases[] = {
      {ScheduleKind::kGpipe, {3, 1, 4}},
      {ScheduleKind::k1f1b, {4, 1, 8}},
      {ScheduleKind::kInterleaved1f1b, {2, 3, 4}},
      {ScheduleKind::kCombined1f1b, {1, 1, 5}},
      {ScheduleKind::kCombined1f1b, {4, 2, 8}},
      {ScheduleKind::kZbH1, {4, 1, 6}},
      {ScheduleKind::kCombined1f1b, {1, 1, 5, true}},
      {ScheduleKind::kDualPipeV, {3, 2, 8}}};
  for (const auto& [kind, shape] : cases) {
    const Schedule s = generate_schedule(kind, shape);
    const Schedule back = parse_schedule(format_schedule(s), s.name);
    EXPECT_EQ(back.num_ranks, s.num_ranks);
    EXPECT_EQ(back.num_stages, s.num_stages);
    EXPECT_EQ(back.num_microbatches, s.num_microbatches);
    EXPECT_EQ(back.stage_rank, s.stage_rank) << s.name;
    EXPECT_EQ(back.ranks, s.ranks) << s.name;
  }
}

TEST(Schedule, ParsesCommentsBlankLinesCommasAndAnyRankOrder) {
  const Schedule s = parse_schedule(
      "# two ranks\n\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0  # last stage\n"
      "rank 0: 0F0, 0SEND_F0, 0RECV_B0, 0B0\n",
      "inline");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.num_stages, 2);
  EXPECT_EQ(s.num_microbatches, 1);
  EXPECT_EQ(s.stage_rank, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(s.ranks[0].size(), 4u);
  EXPECT_EQ(to_string(s.ranks[0][2]), "0RECV_B0");
}

TEST(Schedule, ParseErrorsNameFileLineAndText) {
  EXPECT_NE(error_of([] {
              parse_schedule("rank 0: 0F0\nrank0 0B0\n", "f.txt");
            }).find("f.txt:2: expected 'rank <R>: <actions>'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_schedule("rank 0: 0F0 0Q0\n", "f.txt");
            }).find("f.txt:1: rank 0: bad action '0Q0'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_schedule("rank 0: 0F0\nrank 0: 0B0\n", "f.txt");
            }).find("rank 0 was already listed on line 1"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { parse_schedule("rank 1: 0F0 0B0\n", "f.txt"); }).find("rank 0 is missing"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              parse_schedule("rank 0: 0F0 0B0 2F0 2B0\n", "f.txt");
            }).find("stage 1 has no forward or backward on any rank"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { parse_schedule("# nothing\n", "f.txt"); }).find("no 'rank <R>: ...' lines"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              load_schedule_file("/nonexistent/sched.txt");
            }).find("cannot read schedule file '/nonexistent/sched.txt'"),
            std::string::npos);
}

TEST(Schedule, LoadsAFile) {
  const std::string path = ::testing::TempDir() + "/tandem_sched_test.txt";
  {
    std::ofstream f(path);
    f << format_schedule(generate_schedule(ScheduleKind::k1f1b, {2, 1, 3}));
  }
  const Schedule s = load_schedule_file(path);
  EXPECT_EQ(s.name, path);
  EXPECT_EQ(s.ranks, generate_schedule(ScheduleKind::k1f1b, {2, 1, 3}).ranks);
}

}  // namespace
}  // namespace tandem::schedule
