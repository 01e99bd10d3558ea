// Measured routing tables as JSON (routing_file.h).
#include "schedule/routing_file.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem::schedule {

std::string routing_file_text(const std::vector<RoutingCounts>& tables) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < tables.size(); ++r) {
    ranks.push_back({{"rank", r}, {"expert_rows", tables[r].expert_rows}});
  }
  const RoutingCounts first = tables.empty() ? RoutingCounts() : tables.front();
  const nlohmann::json j = {{"num_microbatches", first.num_microbatches},
                            {"num_layers", first.num_layers},
                            {"ranks", ranks}};
  return j.dump() + "\n";
}

RoutingCounts parse_routing_file(std::string_view text, std::string_view source, int rank) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat(source, ": not valid JSON: ", e.what()));
  }
  const char* shape = "{\"num_microbatches\": M, \"num_layers\": L, \"ranks\": [{\"rank\": 0, "
                      "\"expert_rows\": [...]}, ...]} (tandem train --routing-out)";
  TANDEM_CHECK(j.is_object() && j.contains("num_microbatches") && j.contains("num_layers") &&
                   j.contains("ranks") && j["num_microbatches"].is_number_integer() &&
                   j["num_layers"].is_number_integer() && j["ranks"].is_array(),
               source, ": expected ", shape);
  RoutingCounts out(j["num_microbatches"].get<int32_t>(), j["num_layers"].get<int32_t>());
  TANDEM_CHECK(out.num_microbatches >= 1 && out.num_layers >= 1, source, ": num_microbatches ",
               out.num_microbatches, " and num_layers ", out.num_layers, " must be at least 1");
  std::vector<int> present;
  for (const nlohmann::json& r : j["ranks"]) {
    TANDEM_CHECK(r.is_object() && r.contains("rank") && r["rank"].is_number_integer() &&
                     r.contains("expert_rows") && r["expert_rows"].is_array(),
                 source, ": each entry of ranks must be {\"rank\": R, \"expert_rows\": [...]}");
    present.push_back(r["rank"].get<int>());
    if (present.back() != rank) continue;
    const nlohmann::json& rows = r["expert_rows"];
    TANDEM_CHECK(rows.size() == out.expert_rows.size(), source, ": rank ", rank, " has ",
                 rows.size(), " counts, expected num_microbatches x num_layers = ",
                 out.expert_rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      TANDEM_CHECK(rows[i].is_number_integer() && rows[i].get<int64_t>() >= 0, source,
                   ": rank ", rank, " expert_rows[", i, "] is ", rows[i].dump(),
                   ", expected a count >= 0");
      out.expert_rows[i] = rows[i].get<int64_t>();
    }
    return out;
  }
  std::string ranks;
  for (int p : present) ranks += (ranks.empty() ? "" : ", ") + std::to_string(p);
  throw Error(detail::concat(source, ": no table for rank ", rank, "; the file has ranks ",
                             ranks.empty() ? "(none)" : ranks));
}

RoutingCounts load_routing_file(const std::string& path, int rank) {
  std::ifstream in(path);
  TANDEM_CHECK(in.good(), "--routing ", path, ": cannot read the file");
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_routing_file(buf.str(), path, rank);
}

}  // namespace tandem::schedule
