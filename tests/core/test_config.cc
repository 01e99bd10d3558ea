// Config validation: each bad value gets a message that names it and what is valid.
#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"
#include "core/footprint.h"

namespace tandem {
namespace {

std::string error_of(const ModelConfig& c) {
  try {
    c.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreValid) {
  EXPECT_NO_THROW(ModelConfig{}.validate());
  EXPECT_NO_THROW(TrainConfig{}.validate());
}

TEST(Config, HeadsMustDivideHidden) {
  ModelConfig c;
  c.num_attention_heads = 7;
  EXPECT_NE(error_of(c).find("--num-attention-heads 7 does not divide --hidden-size 256"),
            std::string::npos);
}

TEST(Config, GroupsMustDivideHeads) {
  ModelConfig c;
  c.num_query_groups = 3;
  EXPECT_NE(error_of(c).find("--num-query-groups 3"), std::string::npos);
}

TEST(Config, TopkAboveExperts) {
  ModelConfig c;
  c.moe_router_topk = 9;
  EXPECT_NE(error_of(c).find("--moe-router-topk 9"), std::string::npos);
}

TEST(Config, GlobalBatchMultipleOfMicroBatch) {
  TrainConfig t;
  t.micro_batch_size = 3;
  t.global_batch_size = 10;
  try {
    t.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--global-batch-size 10"), std::string::npos);
  }
}

TEST(Footprint, DenseLayerHasNoRoutingState) {
  ModelConfig c;
  c.num_experts = 0;
  const FootprintShape s = single_rank_shape(c, 2, 4);
  const int64_t n = 2 * c.seq_length;
  EXPECT_EQ(node_saved_bytes(NodeKind::kMlp, c, s), 3 * n * c.ffn_hidden_size * 4);
  EXPECT_EQ(node_saved_bytes(NodeKind::kDispatch, c, s), 0);
}

}  // namespace
}  // namespace tandem
