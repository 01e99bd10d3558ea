// The data options' rules (data_options.h).
#include "cli/data_options.h"

#include "core/error.h"

namespace tandem::cli {
namespace {

struct DataList {
  const char* flag;
  const StringList* words;
};

std::vector<DataList> data_lists(const RunOptions& o) {
  return {{"--data-path", &o.data_path},
          {"--train-data-path", &o.train_data_path},
          {"--valid-data-path", &o.valid_data_path},
          {"--test-data-path", &o.test_data_path}};
}

}  // namespace

void check_data_sources(const RunOptions& o) {
  for (const DataList& l : data_lists(o)) {
    if (!l.words->empty()) (void)data::parse_blend(l.flag, *l.words);
  }
  std::string per_part;
  for (const DataList& l : data_lists(o)) {
    if (l.words->empty() || l.words == &o.data_path) continue;
    per_part += (per_part.empty() ? "" : " ") + std::string(l.flag);
  }
  const std::string text = value_text(o.data_path);
  TANDEM_CHECK(!(o.mock_data && !o.data_path.empty()), "--mock-data and --data-path ", text,
               " both name the training data: give one of them");
  TANDEM_CHECK(!(o.mock_data && !per_part.empty()), "--mock-data and ", per_part,
               " both name the run's data: give one of them");
  TANDEM_CHECK(o.data_path.empty() || per_part.empty(), "--data-path ", text, " and ", per_part,
               " both name the run's data: give --data-path (with --split for its validation "
               "and test parts) or --train-data-path with --valid-data-path and "
               "--test-data-path, as Megatron");
  TANDEM_CHECK(o.split.empty() || per_part.empty(), "--split ", o.split,
               " cuts --data-path into "
               "parts, but ",
               per_part, " name each part's data of its own: leave --split out");
}

std::vector<NamedPath> data_paths(const RunOptions& o) {
  std::vector<NamedPath> out;
  for (const DataList& l : data_lists(o)) {
    if (l.words->empty()) continue;
    for (const std::string& path : data::parse_blend(l.flag, *l.words).paths)
      out.push_back({l.flag, path});
  }
  return out;
}

}  // namespace tandem::cli
