// The node-times file's reader and writer (node_times.h).
#include "schedule/node_times.h"

#include <algorithm>
#include <variant>

#include "core/error.h"
#include "core/text_file.h"

namespace tandem::schedule {
namespace {

const char* const kPhaseKeys[] = {"forward", "backward_input", "backward_weight"};

NodePhaseTimes parse_phase_times(const nlohmann::json& j, NodeKind kind, std::string_view at) {
  TANDEM_CHECK(j.is_object() && j.contains("forward"), at,
               ": expected an object with at least \"forward\" (seconds), e.g. "
               "{\"forward\": 1e-4, \"backward_input\": 1e-4, \"backward_weight\": 1e-4}");
  for (const auto& [key, value] : j.items()) {
    TANDEM_CHECK(
        std::find(std::begin(kPhaseKeys), std::end(kPhaseKeys), key) != std::end(kPhaseKeys), at,
        ": unknown key \"", key,
        "\"; valid keys are forward, backward_input, "
        "backward_weight");
    TANDEM_CHECK(value.is_number() && value.get<double>() >= 0, at, ".", key,
                 ": expected a time in seconds >= 0, got ", value.dump());
  }
  NodePhaseTimes t;
  t.forward_s = j["forward"].get<double>();
  const double default_input = kind == NodeKind::kEmbed ? 0 : t.forward_s;
  const double default_weight = node_has_weights(kind) ? t.forward_s : 0;
  t.backward_input_s = j.value("backward_input", default_input);
  t.backward_weight_s = j.value("backward_weight", default_weight);
  TANDEM_CHECK(node_has_weights(kind) || t.backward_weight_s == 0, at,
               ".backward_weight: ", node_kind_name(kind), " has no weights, so it must be 0");
  return t;
}

}  // namespace

bool node_has_weights(NodeKind kind) {
  return kind != NodeKind::kDispatch && kind != NodeKind::kCombine;
}

bool node_is_communication(NodeKind kind) {
  return kind == NodeKind::kDispatch || kind == NodeKind::kCombine;
}

nlohmann::json measured_shape_json(const MeasuredShape& at) {
  nlohmann::json model = nlohmann::json::object();
  for (const ModelField& f : model_fields()) {
    std::visit([&](auto member) { model[f.name] = nlohmann::json(at.model.*member); }, f.member);
  }
  return {{"micro-batch-size", at.micro_batch_size},
          {"expert-model-parallel-size", at.expert_parallel_size},
          {"tensor-model-parallel-size", at.tensor_parallel_size},
          {"activation-bytes", at.activation_elem_bytes},
          {"model", model}};
}

MeasuredShape parse_measured_shape(const nlohmann::json& j, std::string_view source) {
  const std::string where = detail::concat(source, ": measured_at");
  TANDEM_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), where,
               ": expected {\"micro-batch-size\": N, \"expert-model-parallel-size\": N, "
               "\"activation-bytes\": N, \"model\": {\"num-layers\": N, ...}}");
  MeasuredShape at;
  at.source = std::string(source);
  const auto positive = [&](const char* key, int64_t& out) {
    TANDEM_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 1, where,
                 ".", key, ": expected an integer >= 1, got ",
                 j.contains(key) ? j[key].dump() : std::string("nothing"));
    out = j[key].get<int64_t>();
  };
  positive("micro-batch-size", at.micro_batch_size);
  positive("expert-model-parallel-size", at.expert_parallel_size);
  if (j.contains("tensor-model-parallel-size")) {
    positive("tensor-model-parallel-size", at.tensor_parallel_size);
  }
  positive("activation-bytes", at.activation_elem_bytes);
  const nlohmann::json& model = j["model"];
  for (const ModelField& f : model_fields()) {
    if (!model.contains(f.name)) continue;  // a field newer than the file: its default
    const nlohmann::json& v = model[f.name];
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(at.model.*member)>;
          const bool ok = std::is_same_v<T, bool>          ? v.is_boolean()
                          : std::is_same_v<T, std::string> ? v.is_string()
                          : std::is_same_v<T, double>      ? v.is_number()
                                                           : v.is_number_integer();
          TANDEM_CHECK(ok, where, ".model.", f.name, ": ", v.dump(), " is not a value of --",
                       f.name);
          at.model.*member = v.get<T>();
        },
        f.member);
  }
  try {
    at.model.validate();
  } catch (const Error& e) {
    throw Error(detail::concat(where, ".model: ", e.what()));
  }
  return at;
}

NodeTimesTable parse_node_times(std::string_view text, std::string_view source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat(source, ": not valid JSON: ", e.what()));
  }
  TANDEM_CHECK(j.is_object() && j.contains("nodes") && j["nodes"].is_object(), source,
               ": expected {\"nodes\": {\"attention\": {\"forward\": ...}, ...}, \"p2p\": ...}");
  NodeTimesTable table;
  for (const auto& [key, value] : j.items()) {
    TANDEM_CHECK(key == "nodes" || key == "p2p" || key == "recompute_experts" ||
                     key == "update_per_weight" || key == "grad_reduce_bus_bytes_per_s" ||
                     key == "step_end_per_weight" || key == "defer_optimizer" ||
                     key == "measured_at" || key == "node_overhead_s" || key == "node_gap_s" ||
                     key == "moe_wgrad_merge" || key == "recompute",
                 source, ": unknown key \"", key,
                 "\"; valid keys are nodes, p2p, recompute_experts, recompute, moe_wgrad_merge, "
                 "update_per_weight, grad_reduce_bus_bytes_per_s, step_end_per_weight, "
                 "defer_optimizer, measured_at, node_overhead_s and node_gap_s");
  }
  if (j.contains("moe_wgrad_merge")) {
    const nlohmann::json& m = j["moe_wgrad_merge"];
    TANDEM_CHECK(m.is_number_integer() && m.get<int64_t>() >= 1, source,
                 ": moe_wgrad_merge: expected an integer >= 1, got ", m.dump());
    table.moe_wgrad_merge = m.get<int64_t>();
  }
  if (j.contains("recompute")) {  // parse_recompute's text (core/footprint.h)
    const nlohmann::json& r = j["recompute"];
    TANDEM_CHECK(r.is_string(), source, ": recompute: expected a string such as \"mlp\", got ",
                 r.dump());
    parse_recompute(r.get<std::string>());
    table.recompute = r.get<std::string>();
  }
  for (const char* key : {"recompute_experts", "defer_optimizer"}) {
    if (!j.contains(key)) continue;
    TANDEM_CHECK(j[key].is_boolean(), source, ": ", key, ": expected true or false, got ",
                 j[key].dump());
    (std::string_view(key) == "recompute_experts" ? table.recompute_experts
                                                  : table.defer_optimizer) = j[key].get<bool>();
  }
  for (const auto& [name, value] : j["nodes"].items()) {
    const std::optional<NodeKind> kind = parse_enum<NodeKind>(name);
    TANDEM_CHECK(kind.has_value(), source, ": unknown node \"", name, "\"; valid nodes are ",
                 enum_choices<NodeKind>());
    const int found = static_cast<int>(*kind);
    table.nodes[found] = parse_phase_times(value, *kind, detail::concat(source, ": nodes.", name));
  }
  // A positive rate under `key`, when the file has one.
  auto positive = [&](const char* key, const char* what, std::optional<double>& out) {
    if (!j.contains(key)) return;
    const nlohmann::json& v = j[key];
    TANDEM_CHECK(v.is_number() && v.get<double>() > 0, source, ": ", key, ": expected ", what,
                 " (> 0), got ", v.dump());
    out = v.get<double>();
  };
  // Note [Deferred update in the plan], Note [The step's end in the plan] and
  // Note [Gradient reduction in the plan] (simulator.cc).
  positive("update_per_weight", "the deferred update's seconds per weight",
           table.update_s_per_weight);
  positive("step_end_per_weight", "the step's end's seconds per weight",
           table.step_end_s_per_weight);
  positive("grad_reduce_bus_bytes_per_s", "the gradient all-reduce's bus bandwidth in bytes/s",
           table.grad_reduce_bus_bytes_per_s);
  if (j.contains("measured_at")) table.measured_at = parse_measured_shape(j["measured_at"], source);
  if (j.contains("node_overhead_s")) {
    const nlohmann::json& v = j["node_overhead_s"];
    TANDEM_CHECK(table.measured_at && v.is_number() && v.get<double>() >= 0, source,
                 ": node_overhead_s: expected the fixed seconds of a node (>= 0) beside "
                 "measured_at, got ",
                 v.dump());
    table.node_overhead_s = v.get<double>();
  }
  if (j.contains("node_gap_s")) {  // Note [Gaps between nodes] (pipeline_model.cc)
    const nlohmann::json& v = j["node_gap_s"];
    TANDEM_CHECK(v.is_number() && v.get<double>() >= 0, source,
                 ": node_gap_s: expected the seconds the GPU idles before a node phase (>= 0), "
                 "got ",
                 v.dump());
    table.node_gap_s = v.get<double>();
  }
  if (j.contains("p2p")) {
    TANDEM_CHECK(j["p2p"].is_number() && j["p2p"].get<double>() >= 0, source,
                 ": p2p: expected the time of one pipeline message in seconds, got ",
                 j["p2p"].dump());
    table.p2p_s = j["p2p"].get<double>();
  }
  return table;
}

NodeTimesTable load_node_times(const std::string& path) {
  return parse_node_times(
      read_text_input(path, "node-times file '" + path + "'", kMaxTextInputBytes), path);
}

nlohmann::json node_times_json(const NodeTimesTable& table) {
  nlohmann::json nodes = nlohmann::json::object();
  for (int k = 0; k < kNumNodeKinds; ++k) {
    const auto& t = table.nodes[k];
    if (!t) continue;
    nodes[std::string(node_kind_name(static_cast<NodeKind>(k)))] = {
        {"forward", t->forward_s},
        {"backward_input", t->backward_input_s},
        {"backward_weight", t->backward_weight_s}};
  }
  nlohmann::json out = {{"nodes", nodes}, {"recompute_experts", table.recompute_experts}};
  if (!table.recompute.empty()) out["recompute"] = table.recompute;
  if (table.moe_wgrad_merge) out["moe_wgrad_merge"] = *table.moe_wgrad_merge;
  if (table.p2p_s) out["p2p"] = *table.p2p_s;
  if (table.update_s_per_weight) out["update_per_weight"] = *table.update_s_per_weight;
  if (table.grad_reduce_bus_bytes_per_s) {
    out["grad_reduce_bus_bytes_per_s"] = *table.grad_reduce_bus_bytes_per_s;
  }
  if (table.node_gap_s) out["node_gap_s"] = *table.node_gap_s;
  if (table.step_end_s_per_weight) out["step_end_per_weight"] = *table.step_end_s_per_weight;
  out["defer_optimizer"] = table.defer_optimizer;
  if (table.measured_at) out["measured_at"] = measured_shape_json(*table.measured_at);
  if (table.node_overhead_s) out["node_overhead_s"] = *table.node_overhead_s;
  return out;
}

}  // namespace tandem::schedule
