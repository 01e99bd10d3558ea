// The units the gradient reduction goes by (Note [Gradients reduced beside the backward] in
// runtime/grad_reduce.cc): for a whole model and for pipeline stages without the embedding or
// the head, dense and MoE. Oracle: the parameter entries themselves, by name.
#include <gtest/gtest.h>

#include <string>

#include "model/chunk.h"
#include "model/tiny.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {
namespace {

ModelConfig model(bool moe) {
  ModelConfig m = testing::tiny_config(moe);
  m.num_layers = 4;
  return m;
}

// The unit an entry belongs to, from its name alone.
std::string unit_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) == 0) {
    return "layer " + name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size());
  }
  return name.rfind("model.embed_tokens.", 0) == 0 ? "embed" : "head";
}

void check(const ModelConfig& m, const model::ChunkSpec& spec) {
  const model::Parameters params(m, spec, DType::kF32);
  const model::ModelChunk chunk(params);
  std::vector<int32_t> node_unit;
  const auto units = gradient_units(params, chunk.nodes(), node_unit);
  // Side by side, in order, covering the whole buffer.
  ASSERT_FALSE(units.empty());
  EXPECT_EQ(units.front().begin, 0);
  EXPECT_EQ(units.back().end, params.numel());
  for (size_t k = 1; k < units.size(); ++k) EXPECT_EQ(units[k].begin, units[k - 1].end);
  // Every entry inside the unit its name says.
  for (const model::ParamEntry& e : params.entries()) {
    bool found = false;
    for (const auto& u : units) {
      if (u.name != unit_of(e.name)) continue;
      found = true;
      EXPECT_GE(e.offset, u.begin) << e.name;
      EXPECT_LE(e.offset + shape_numel(e.shape), u.end) << e.name;
    }
    EXPECT_TRUE(found) << e.name << " in no unit";
  }
  // Each node in its own layer's unit (embed and loss in theirs); weighted nodes counted.
  ASSERT_EQ(node_unit.size(), chunk.nodes().size());
  std::vector<int64_t> weighted(units.size(), 0);
  for (size_t i = 0; i < chunk.nodes().size(); ++i) {
    const model::NodeRef n = chunk.nodes()[i];
    const auto& u = units.at(static_cast<size_t>(node_unit[i]));
    const std::string want = n.kind == NodeKind::kEmbed ? "embed"
                             : n.kind == NodeKind::kLoss
                                 ? "head"
                                 : "layer " + std::to_string(spec.layer_begin + n.layer);
    EXPECT_EQ(u.name, want) << "node " << i;
    weighted[static_cast<size_t>(node_unit[i])] += schedule::node_has_weights(n.kind);
  }
  for (size_t k = 0; k < units.size(); ++k) {
    EXPECT_EQ(units[k].weighted_nodes, weighted[k]) << units[k].name;
    EXPECT_GT(units[k].weighted_nodes, 0) << units[k].name;
  }
  const size_t want_units = (spec.layer_end - spec.layer_begin) + spec.has_embed + spec.has_head;
  EXPECT_EQ(units.size(), want_units);
}

TEST(GradUnits, CoverEachStagesWeightsLayerByLayer) {
  for (bool moe : {false, true}) {
    const ModelConfig m = model(moe);
    SCOPED_TRACE(moe ? "moe" : "dense");
    check(m, model::ChunkSpec::whole(m));
    model::ChunkSpec middle = model::ChunkSpec::whole(m);
    middle.layer_begin = 1;
    middle.layer_end = 3;
    middle.has_embed = middle.has_head = false;
    check(m, middle);
    model::ChunkSpec last = middle;
    last.layer_begin = 3;
    last.layer_end = 4;
    last.has_head = true;
    check(m, last);
  }
}

}  // namespace
}  // namespace tandem::runtime
