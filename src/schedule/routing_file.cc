// Measured routing tables as JSON (routing_file.h).
#include "schedule/routing_file.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_file.h"

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

std::map<int, RoutingCounts> parse_routing_tables(std::string_view text, std::string_view source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat(source, ": not valid JSON: ", e.what()));
  }
  const char* shape =
      "{\"num_microbatches\": M, \"num_layers\": L, \"ranks\": [{\"rank\": 0, "
      "\"expert_rows\": [...]}, ...]} (tandem train --routing-out)";
  TANDEM_CHECK(j.is_object() && j.contains("num_microbatches") && j.contains("num_layers") &&
                   j.contains("ranks") && j["num_microbatches"].is_number_integer() &&
                   j["num_layers"].is_number_integer() && j["ranks"].is_array(),
               source, ": expected ", shape);
  const RoutingCounts empty(j["num_microbatches"].get<int32_t>(), j["num_layers"].get<int32_t>());
  TANDEM_CHECK(empty.num_microbatches >= 1 && empty.num_layers >= 1, source, ": num_microbatches ",
               empty.num_microbatches, " and num_layers ", empty.num_layers, " must be at least 1");
  std::map<int, RoutingCounts> tables;
  for (const nlohmann::json& r : j["ranks"]) {
    TANDEM_CHECK(r.is_object() && r.contains("rank") && r["rank"].is_number_integer() &&
                     r.contains("expert_rows") && r["expert_rows"].is_array(),
                 source, ": each entry of ranks must be {\"rank\": R, \"expert_rows\": [...]}");
    const int rank = r["rank"].get<int>();
    RoutingCounts out = empty;
    const nlohmann::json& rows = r["expert_rows"];
    TANDEM_CHECK(rows.size() == out.expert_rows.size(), source, ": rank ", rank, " has ",
                 rows.size(),
                 " counts, expected num_microbatches x num_layers = ", out.expert_rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      TANDEM_CHECK(rows[i].is_number_integer() && rows[i].get<int64_t>() >= 0, source, ": rank ",
                   rank, " expert_rows[", i, "] is ", rows[i].dump(), ", expected a count >= 0");
      out.expert_rows[i] = rows[i].get<int64_t>();
    }
    TANDEM_CHECK(tables.emplace(rank, std::move(out)).second, source, ": rank ", rank,
                 " appears twice");
  }
  return tables;
}

RoutingCounts routing_table_of(const std::map<int, RoutingCounts>& tables, int rank,
                               std::string_view source) {
  const auto it = tables.find(rank);
  if (it != tables.end()) return it->second;
  std::string ranks;
  for (const auto& [r, t] : tables) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  throw Error(detail::concat(source, ": no table for rank ", rank, "; the file has ranks ",
                             ranks.empty() ? "(none)" : ranks));
}

RoutingCounts parse_routing_file(std::string_view text, std::string_view source, int rank) {
  return routing_table_of(parse_routing_tables(text, source), rank, source);
}

std::vector<ExpertPace> expert_pace(const std::vector<RoutingCounts>& group, size_t me) {
  if (group.empty()) return {};
  TANDEM_ASSERT(me < group.size(), "expert_pace: rank ", me, " of a group of ", group.size());
  const RoutingCounts& mine = group[me];
  std::vector<ExpertPace> pace(static_cast<size_t>(mine.num_layers));
  for (int32_t l = 0; l < mine.num_layers; ++l) {
    double own = 0, slowest = 0, mean = 0;
    for (int32_t mb = 0; mb < mine.num_microbatches; ++mb) {
      int64_t most = -1, sum = 0, count = 0;
      for (const RoutingCounts& t : group) {
        const int64_t rows = t.at(mb, l);
        if (rows < 0) continue;
        most = std::max(most, rows);
        sum += rows;
        ++count;
      }
      if (count == 0 || mine.at(mb, l) < 0) continue;
      own += static_cast<double>(mine.at(mb, l));
      slowest += static_cast<double>(most);
      mean += static_cast<double>(sum) / static_cast<double>(count);
    }
    if (mean > 0) pace[static_cast<size_t>(l)] = {own / mean, (slowest - own) / mean};
  }
  return pace;
}

RowsSpread expert_rows_spread(const std::vector<RoutingCounts>& group) {
  RowsSpread out;
  if (group.empty()) return out;
  const RoutingCounts& first = group.front();
  std::vector<double> per_mb;
  double most_sum = 0, mean_sum = 0;
  for (int32_t l = 0; l < first.num_layers; ++l) {
    std::vector<int64_t> step(group.size(), 0);
    bool measured = false;
    for (int32_t mb = 0; mb < first.num_microbatches; ++mb) {
      int64_t most = 0, sum = 0;
      for (size_t r = 0; r < group.size(); ++r) {
        const int64_t rows = group[r].at(mb, l);
        if (rows < 0) continue;
        measured = true;
        most = std::max(most, rows);
        sum += rows;
        step[r] += rows;
      }
      if (sum > 0) {
        per_mb.push_back(static_cast<double>(most) * static_cast<double>(group.size()) /
                         static_cast<double>(sum));
      }
    }
    if (!measured) continue;
    int64_t sum = 0;
    for (const int64_t x : step) sum += x;
    most_sum += static_cast<double>(*std::max_element(step.begin(), step.end()));
    mean_sum += static_cast<double>(sum) / static_cast<double>(group.size());
  }
  if (mean_sum > 0) out.step = most_sum / mean_sum;
  if (!per_mb.empty()) {
    std::sort(per_mb.begin(), per_mb.end());
    const size_t n = per_mb.size();
    out.microbatch_median = n % 2 ? per_mb[n / 2] : 0.5 * (per_mb[n / 2 - 1] + per_mb[n / 2]);
    out.microbatch_max = per_mb.back();
  }
  return out;
}

std::map<int, RoutingCounts> load_routing_tables(const std::string& path) {
  return parse_routing_tables(read_text_input(path, "--routing " + path, kMaxTextInputBytes), path);
}

}  // namespace tandem::schedule
