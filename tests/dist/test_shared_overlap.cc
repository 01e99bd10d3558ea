// Note [Shared expert in a pair] (planner/simulator.cc): in combined 1F1B the shared expert
// hangs off its micro-batch's chain, so its products run while that pair's all-to-alls are in
// flight. Oracle: the measured timeline of expert parallelism over 2 CPU ranks, with every
// all-to-all of the expert group held for 40 ms (a slow link, far longer than the tiny model's
// products): a shared expert's forward must start before its own dispatch ends (it waits for
// its attention only), and its backward before the other micro-batch's dispatch ends. Were it
// chained after the dispatch, it would start 40 ms later. The losses are those of the run
// without the delay, bit for bit (the order of the values does not change).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/random_tokens.h"
#include "dist_env.h"
#include "model/tiny.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/generators.h"

namespace tandem::runtime {
namespace {

using testing::g_world;

// The expert group, each all-to-all held back `delay`.
class SlowAllToAll final : public comm::Communicator {
 public:
  SlowAllToAll(std::unique_ptr<comm::Communicator> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  void send(const Tensor& t, int peer, int tag) override { inner_->send(t, peer, tag); }
  std::unique_ptr<comm::PendingSend> isend(const Tensor& t, int peer, int tag) override {
    return inner_->isend(t, peer, tag);
  }
  void recv(const Tensor& t, int peer, int tag) override { inner_->recv(t, peer, tag); }
  void all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                    const std::vector<int64_t>& send_rows) override {
    std::this_thread::sleep_for(delay_);
    inner_->all_to_all_v(out, recv_rows, in, send_rows);
  }
  void all_reduce_sum(const Tensor& t) override { inner_->all_reduce_sum(t); }
  void reduce_scatter_sum(const Tensor& out, const Tensor& in) override {
    inner_->reduce_scatter_sum(out, in);
  }
  void all_gather(const Tensor& out, const Tensor& in) override { inner_->all_gather(out, in); }
  void broadcast(const Tensor& t, int root) override { inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    return inner_->all_gather_bytes(mine);
  }
  std::unique_ptr<comm::Communicator> subgroup(const std::vector<int>& ranks,
                                               const std::string& name) override {
    return inner_->subgroup(ranks, name);
  }

 private:
  std::unique_ptr<comm::Communicator> inner_;
  std::chrono::milliseconds delay_;
};

Groups expert_groups() {
  std::vector<int> all;
  for (int r = 0; r < g_world->size(); ++r) all.push_back(r);
  return Groups::make(g_world->subgroup(all, "world"), 1, g_world->size());
}

TEST(SharedExpertOverlap, SharedExpertsRunWhileTheAllToAllIsInFlight) {
  if (g_world->size() != 2) GTEST_SKIP() << "expert parallelism over exactly 2 ranks";
  ModelConfig m = testing::with_qwen2_options(testing::tiny_config(true));
  TrainConfig t;
  t.micro_batch_size = 1;
  t.global_batch_size = 4 * g_world->size();
  testing::RandomTokens data(m.vocab_size);
  const schedule::Schedule sched =
      schedule::generate_schedule(schedule::ScheduleKind::kCombined1f1b, {1, 1, 4, false});

  Groups plain_groups = expert_groups();
  PipelineTrainer plain(m, t, sched, plain_groups, data, DType::kF64);
  const StepResult want = plain.forward_backward(0);

  Groups slow_groups = expert_groups();
  slow_groups.ep =
      std::make_unique<SlowAllToAll>(std::move(slow_groups.ep), std::chrono::milliseconds(40));
  PipelineTrainer slow(m, t, sched, slow_groups, data, DType::kF64);
  const StepResult got = slow.forward_backward(0);
  EXPECT_EQ(got.loss, want.loss);

  std::map<std::string, Span> spans;  // by name, e.g. "F2 shared_expert"
  std::ostringstream all;
  for (const Span& s : slow.timeline()) {
    spans[s.name] = s;
    all << s.stream << " " << s.name << " " << s.start * 1e3 << ".." << s.end * 1e3 << " ms\n";
  }
  // Micro-batches 1..3 run their forwards inside pairs (0's is the first, unpaired forward).
  int forward_beside = 0, backward_beside = 0;
  for (int mb = 1; mb < 4; ++mb) {
    const std::string f = "F" + std::to_string(mb);
    ASSERT_TRUE(spans.count(f + " shared_expert") && spans.count(f + " dispatch")) << all.str();
    forward_beside += spans[f + " shared_expert"].start < spans[f + " dispatch"].end;
  }
  for (int mb = 0; mb < 3; ++mb) {
    // Paired with the forward of mb + 1: beside that forward's dispatch.
    const std::string b = "B" + std::to_string(mb), f = "F" + std::to_string(mb + 1);
    ASSERT_TRUE(spans.count(b + " shared_expert")) << all.str();
    backward_beside += spans[b + " shared_expert"].start < spans[f + " dispatch"].end;
  }
  EXPECT_EQ(forward_beside, 3) << all.str();
  EXPECT_EQ(backward_beside, 3) << all.str();
}

}  // namespace
}  // namespace tandem::runtime
