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
  c.num_experts = 8;
  c.moe_router_topk = 9;
  EXPECT_NE(error_of(c).find("--moe-router-topk 9"), std::string::npos);
}

// Megatron-LM's recipes write --moe-layer-freq as Python ("([0]*3+[1]*58)"); the reference is
// the list Python's eval gives, spelled out.
TEST(Config, MoeLayerFreqReadsMegatronsPythonLists) {
  const auto pattern = [](const std::string& f, int64_t layers) {
    std::vector<int> out;
    for (const bool b : moe_layer_pattern(f, layers)) out.push_back(b ? 1 : 0);
    return out;
  };
  const std::vector<int> three_dense_first = {0, 0, 0, 1, 1};
  for (const char* f :
       {"([0]*3+[1]*2)", "[0]*3+[1]*2", "[0,0,0]+2*[1]", "'([0]*3+[1]*2)'", "\"[0, 0, 0, 1, 1]\"",
        "[0,0,0,1,1,]", "([0]+[0]*2)+([1]*2)", "[0]*1*3+[1]*2"}) {
    EXPECT_EQ(pattern(f, 5), three_dense_first) << f;
  }
  EXPECT_EQ(pattern("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(pattern("'1'", 2), (std::vector<int>{1, 1}));
  const auto message = [](const std::string& f, int64_t layers) {
    try {
      moe_layer_pattern(f, layers);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("([0]*3+[1]*2", 5).find("a ( is not closed"), std::string::npos);
  EXPECT_NE(message("[0]*3+[2]*2", 5).find("'2' is not 0 or 1"), std::string::npos);
  EXPECT_NE(message("[0]*3+[1]*3", 5).find("6 entries for 5 layers"), std::string::npos);
  EXPECT_NE(message("[0]*99999999999", 5).find("above"), std::string::npos);
  EXPECT_NE(message("[1]*1048576*1048576", 5).find("longer than"), std::string::npos);
  EXPECT_NE(message("[0]-[1]", 2).find("unexpected '-'"), std::string::npos);
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

namespace tandem {
namespace {

// Note [Uneven stages]: even by default; a first or last count of its own with the rest shared
// evenly; and each way it cannot split refused, naming the options.
TEST(StageLayerCounts, EvenOrFirstAndLastOfTheirOwn) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(stage_layer_counts(8, 4), (V{2, 2, 2, 2}));
  EXPECT_EQ(stage_layer_counts(61, 4, 16), (V{16, 15, 15, 15}));
  EXPECT_EQ(stage_layer_counts(61, 8, 0, 5), (V{8, 8, 8, 8, 8, 8, 8, 5}));
  EXPECT_EQ(stage_layer_counts(61, 4, 1, 0), (V{1, 20, 20, 20}));
  EXPECT_EQ(stage_layer_counts(61, 5, 13, 12), (V{13, 12, 12, 12, 12}));
  EXPECT_EQ(stage_layer_counts(7, 2, 3, 4), (V{3, 4}));
  auto refused = [](int64_t layers, int64_t stages, int64_t first, int64_t last,
                    const std::string& says) {
    try {
      stage_layer_counts(layers, stages, first, last);
      ADD_FAILURE() << layers << " layers, " << stages << " stages, " << first << ", " << last;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(61, 4, 0, 0, "--decoder-first-pipeline-num-layers");  // the hint
  refused(61, 4, 2, 0, "leave 59 of --num-layers 61 to 3 other stage(s)");
  refused(7, 2, 3, 3, "add up to the layers");
  refused(8, 1, 2, 0, "there is one stage");
  refused(8, 4, 6, 1, "at least one layer each");
  refused(3, 4, 0, 0, "every stage needs a layer");
  refused(8, 2, -1, 0, "--decoder-first-pipeline-num-layers -1 is invalid");
}

}  // namespace
}  // namespace tandem
