// Megatron's --split over a file's documents or tokens (split.h).
#include "data/split.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace tandem::data {
namespace {

constexpr const char* kSplitForm =
    "one to three non-negative weights separated by commas or slashes, e.g. 969,30,1 "
    "(training, validation, test)";

std::string trimmed(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace

constexpr EnumName<SplitPart> kSplitPartNames[] = {
    {SplitPart::kTrain, "training"}, {SplitPart::kValid, "validation"}, {SplitPart::kTest, "test"}};

const char* split_part_name(SplitPart part) { return name_in(kSplitPartNames, part).data(); }

SplitWeights parse_split(const std::string& text) {
  // Quotes are dropped (`--split "'99,1,0'"`, as a launch script's quoted variable passes it);
  // the weights are separated by slashes, commas or, with neither, spaces, as Megatron reads them.
  std::string bare;
  for (char c : text)
    if (c != '\'' && c != '"') bare += c;
  const bool spaces = bare.find_first_of(",/") == std::string::npos;
  const char sep = bare.find('/') != std::string::npos ? '/' : spaces ? ' ' : ',';
  if (spaces) {
    std::replace(bare.begin(), bare.end(), '\t', ' ');
    bare = trimmed(bare);
    for (size_t at; (at = bare.find("  ")) != std::string::npos;) bare.erase(at, 1);
  }
  std::vector<std::string> items;
  size_t from = 0;
  for (size_t at; (at = bare.find(sep, from)) != std::string::npos; from = at + 1) {
    items.push_back(trimmed(bare.substr(from, at - from)));
  }
  items.push_back(trimmed(bare.substr(from)));
  TANDEM_CHECK(items.size() <= 3, "--split ", text, " has ", items.size(), " weights; give ",
               kSplitForm);
  SplitWeights w{text, {0, 0, 0}};
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    char* end = nullptr;
    errno = 0;
    const double v = item.empty() ? -1 : std::strtod(item.c_str(), &end);
    const bool whole = !item.empty() && end == item.c_str() + item.size() && errno == 0;
    TANDEM_CHECK(whole && std::isfinite(v) && v >= 0, "--split ", text, ": '", item,
                 "' is not a non-negative number; give ", kSplitForm);
    w.weight[i] = v;
  }
  TANDEM_CHECK(w.weight[0] + w.weight[1] + w.weight[2] > 0, "--split ", text,
               ": the weights add up to 0; give ", kSplitForm);
  return w;
}

std::array<int64_t, 4> split_bounds(const SplitWeights& w, int64_t units) {
  const double sum = w.weight[0] + w.weight[1] + w.weight[2];
  std::array<int64_t, 4> b = {0, 0, 0, 0};
  for (size_t p = 0; p < 3; ++p) {
    // std::nearbyint rounds ties to even under the default rounding mode, as Python's round.
    b[p + 1] =
        b[p] + static_cast<int64_t>(std::nearbyint(w.weight[p] / sum * static_cast<double>(units)));
  }
  const int64_t excess = b[3] - units;
  // Megatron moves every bound after the first by the excess; where that would pass the bound
  // before it (a part of weight 0 first), the bound stays there instead.
  for (size_t p = 1; p < 4; ++p) b[p] = std::clamp(b[p] - excess, b[p - 1], units);
  return b;
}

TokenRangeDataset::TokenRangeDataset(std::shared_ptr<const FileTokenDataset> file, int64_t begin,
                                     int64_t end, std::string what)
    : file_(std::move(file)), begin_(begin), end_(end), what_(std::move(what)) {
  TANDEM_ASSERT(0 <= begin && begin <= end && end <= file_->num_tokens(), "tokens [", begin, ", ",
                end, ") of ", file_->num_tokens());
}

void TokenRangeDataset::sample(int64_t index, int32_t* out, int64_t length) const {
  TANDEM_CHECK(index >= 0, "sample index ", index, " is invalid: it must be >= 0");
  TANDEM_CHECK(length >= 1 && length <= end_ - begin_, "a sample of ", length, " tokens from ",
               what_, " is impossible: it holds ", end_ - begin_,
               " tokens; use a sequence length below that");
  const int64_t start = window_start(file_->seed(), index, end_ - begin_, length);
  file_->read_tokens(begin_ + start, out, length);
}

std::unique_ptr<TokenRangeDataset> split_dataset(std::shared_ptr<const FileTokenDataset> file,
                                                 const SplitWeights& w, SplitPart part,
                                                 int64_t seq_plus_one) {
  const int64_t documents = file->num_documents();
  const bool by_documents = documents > 0;
  const std::array<int64_t, 4> b = split_bounds(w, by_documents ? documents : file->num_tokens());
  const auto p = static_cast<size_t>(part);
  const int64_t begin = by_documents ? file->document_start(b[p]) : b[p];
  const int64_t end = by_documents ? file->document_start(b[p + 1]) : b[p + 1];
  TANDEM_CHECK(begin <= end && end <= file->num_tokens(), file->describe(), ": documents ", b[p],
               " to ", b[p + 1], " start at tokens ", begin, " and ", end,
               ": its document indices are out of order");
  const std::string units = by_documents
                                ? detail::concat("documents [", b[p], ", ", b[p + 1], ") of ",
                                                 documents, ", tokens [", begin, ", ", end, ")")
                                : detail::concat("tokens [", begin, ", ", end, ")");
  const std::string what = detail::concat(split_part_name(part), " part of --split ", w.text, " (",
                                          units, ") of ", file->describe());
  TANDEM_CHECK(end - begin >= seq_plus_one, "--split ", w.text, " leaves the ",
               split_part_name(part), " part ", end - begin, " tokens (", units, " of ",
               file->describe(), "), fewer than one sample of seq-length + 1 = ", seq_plus_one,
               " tokens; give that part more weight or use more data");
  return std::make_unique<TokenRangeDataset>(std::move(file), begin, end, what);
}

}  // namespace tandem::data
