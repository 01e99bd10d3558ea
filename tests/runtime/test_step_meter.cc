// The node times a run writes for the planner (Note [Node times over steps] in
// runtime/step_meter.cc): each node phase's median over the steps after the first, the last
// step's other rates. Oracle: medians worked out by hand over made-up step times.
#include <gtest/gtest.h>

#include "runtime/step_meter.h"

namespace tandem::runtime {
namespace {

StepTimes step(double experts_weight_s, double step_end_s_per_weight) {
  StepTimes t;
  const auto experts = static_cast<size_t>(NodeKind::kExperts);
  t.node_times.nodes[experts] = schedule::NodePhaseTimes{1.0, 2.0, experts_weight_s};
  t.node_times.step_end_s_per_weight = step_end_s_per_weight;
  return t;
}

TEST(StepMeter, NodeTimesAreMediansOverTheStepsAfterTheFirst) {
  const auto experts = static_cast<size_t>(NodeKind::kExperts);
  StepMeter m;
  m.record(step(50, 1));  // the first step: tuning every product
  ASSERT_TRUE(m.node_times().nodes[experts]);
  EXPECT_EQ(m.node_times().nodes[experts]->backward_weight_s, 50);  // one step: its own
  m.record(step(3, 2));
  m.record(step(5, 3));
  EXPECT_EQ(m.node_times().nodes[experts]->backward_weight_s, 4);  // the first left out
  m.record(step(40, 4));                                           // a later step tunes one
  const schedule::NodeTimesTable t = m.node_times();
  EXPECT_EQ(t.nodes[experts]->backward_weight_s, 5);
  EXPECT_EQ(t.nodes[experts]->forward_s, 1);
  EXPECT_EQ(t.nodes[experts]->backward_input_s, 2);
  EXPECT_FALSE(t.nodes[static_cast<size_t>(NodeKind::kAttention)]);  // never measured
  EXPECT_EQ(t.step_end_s_per_weight, 4);                             // the last step's
}

TEST(StepMeter, NodeTimesKeepTheLastStepsOnly) {
  const auto experts = static_cast<size_t>(NodeKind::kExperts);
  StepMeter m;
  m.record(step(1, 1));
  for (int i = 0; i < 200; ++i) m.record(step(i < 150 ? 100 : 7, 1));  // the last 50 at 7
  EXPECT_EQ(m.node_times().nodes[experts]->backward_weight_s, 7);      // 50 of the last 64
}

}  // namespace
}  // namespace tandem::runtime
