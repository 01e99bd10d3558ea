// Note [Document masks in the plan] (planner/simulator_state.cc): the document masks, 4 bytes a
// token each, held from a micro-batch's forward on a stage to its backward there, on the GPU
// (device buffers) and on the CPU (the host buffers they are formed in, from the allocator).
// Oracles: the same plan without them, which they leave alone but for the in-flight bytes and
// the peak: one micro-batch at a time (1F1B on one stage) adds exactly one micro-batch's masks
// to the peak; other schedules and pipelines add at least that and at most one more than the
// (stage, micro-batch) pairs alive at once (on the CPU, a stage between the first and the last
// also loads the ids and targets for a moment to form them: Note [Tokens in the plan]). The
// measured peaks: tests/cuda/test_cuda_memory.cc on a GPU, tests/runtime/test_cpu_memory.cc and
// tests/dist/test_whole_peak.cc on the CPU.
#include <gtest/gtest.h>

#include <string>

#include "core/footprint.h"
#include "model/tiny.h"
#include "planner/planner.h"
#include "planner/simulator.h"

namespace tandem::schedule {
namespace {

PlanRequest request(const char* schedule, int32_t pp, bool gpu, int64_t masks) {
  PlanRequest req;
  req.schedule_name = schedule;
  const bool interleaved = std::string(schedule) == "interleaved-1f1b";
  req.shape = {pp, interleaved ? 2 : 1, 4 * pp};
  req.inputs.model = testing::memory_config(true);
  req.inputs.model.num_layers = 4;  // interleaved: two stages a rank
  req.inputs.micro_batch_size = 2;
  req.inputs.gpu = gpu;
  req.inputs.activation_elem_bytes = gpu ? 2 : 4;
  req.inputs.document_masks = masks;
  return req;
}

TEST(DocumentMaskPlan, HeldFromEachForwardToItsBackward) {
  const int64_t tokens = 2 * testing::memory_config(true).seq_length;
  for (const char* schedule : {"1f1b", "gpipe", "zb-h1", "interleaved-1f1b"}) {
    for (const int32_t pp : {1, 2}) {
      for (const int64_t masks : {1, 3}) {
        for (const bool gpu : {true, false}) {
          const std::string what = std::string(schedule) + " pp" + std::to_string(pp) + " masks " +
                                   std::to_string(masks) + (gpu ? " GPU" : " CPU");
          SCOPED_TRACE(what);
          if (pp == 1 && std::string(schedule) == "interleaved-1f1b") continue;
          const PlanRequest with = request(schedule, pp, gpu, masks);
          PlanRequest without = with;
          without.inputs.document_masks = 0;
          const Plan a = make_plan(with), b = make_plan(without);
          const int64_t bytes = masks * 4 * tokens;
          const int64_t loaded = gpu ? 0 : 2 * 4 * tokens;  // a middle stage's ids and targets
          EXPECT_EQ(a.model.stages.front().document_mask_bytes, bytes);
          for (size_t r = 0; r < a.sim.ranks.size(); ++r) {
            const RankResult &x = a.sim.ranks[r], &y = b.sim.ranks[r];
            EXPECT_EQ(x.activation_peak_bytes, y.activation_peak_bytes);
            EXPECT_EQ(x.workspace_peak_bytes, y.workspace_peak_bytes);
            EXPECT_EQ(x.end_s, y.end_s);
            EXPECT_GE(x.peak_bytes, y.peak_bytes + bytes);
            EXPECT_LE(x.peak_bytes, y.peak_bytes + (y.peak_live_microbatches + 1) * bytes + loaded);
            if (pp == 1 && std::string(schedule) == "1f1b") {
              EXPECT_EQ(x.peak_bytes, y.peak_bytes + bytes);
            }
            // Every micro-batch's masks are gone by the step's end.
            EXPECT_EQ(x.memory.back().in_flight_bytes, y.memory.back().in_flight_bytes);
          }
        }
      }
    }
  }
}

// With --eod-mask-loss the MTP modules' head takes each depth's rolled loss mask
// (Note [MTP loss mask] in model/mtp.cc), an f32 temporary of the first depth's B (T - 1) rows
// beside its logits block: the modules' forward workspace holds it where the head's is the larger
// part (a vocabulary of 32000 makes it so), and the loss node's takes the larger of theirs and the
// main head's.
TEST(DocumentMaskPlan, MtpHeadHoldsTheRolledLossMask) {
  ModelConfig cfg = testing::memory_config(true);
  cfg.vocab_size = 32000;
  cfg.mtp_num_layers = 1;
  FootprintShape s = single_rank_shape(cfg, 2, 2);
  s.stat_bytes = 4;
  s.fused_lm_head = true;
  const NodeWorkspace plain = mtp_workspace(cfg, s);
  s.loss_mask = true;
  const NodeWorkspace masked = mtp_workspace(cfg, s);
  EXPECT_EQ(masked.forward, plain.forward + 4 * 2 * (cfg.seq_length - 1));
  EXPECT_EQ(masked.backward_input, plain.backward_input);
  const NodeWorkspace loss = node_workspace_bytes(NodeKind::kLoss, cfg, s);
  EXPECT_GE(loss.forward, masked.forward);
}

}  // namespace
}  // namespace tandem::schedule
