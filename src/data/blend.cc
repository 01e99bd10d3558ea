// Megatron's blended data (blend.h).
#include "data/blend.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace tandem::data {
namespace {

constexpr const char* kBlendForms =
    "one prefix (A), weight and prefix pairs (0.3 A 0.7 B), or prefixes alone (A B, weighted by "
    "their sizes)";

// The word as a number, or nullopt when it is not one as a whole.
std::optional<double> as_number(const std::string& word) {
  if (word.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(word.c_str(), &end);
  if (end != word.c_str() + word.size() || errno != 0) return std::nullopt;
  return v;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace

BlendSpec parse_blend(const std::string& flag, const std::vector<std::string>& words) {
  BlendSpec spec;
  spec.text = joined(words);
  TANDEM_CHECK(!words.empty(), flag, " is given no path: give ", kBlendForms);
  // An odd number of words holds no pairs; an even one holds pairs when every other word is a
  // number, prefixes alone when none is.
  size_t numbers = 0;
  if (words.size() % 2 == 0) {
    for (size_t i = 0; i < words.size(); i += 2) numbers += as_number(words[i]) ? 1 : 0;
  }
  if (numbers == 0) {
    spec.paths = words;
    return spec;
  }
  TANDEM_CHECK(numbers == words.size() / 2, flag, " ", spec.text,
               ": some prefixes have a weight and some not; give ", kBlendForms);
  for (size_t i = 0; i < words.size(); i += 2) {
    const double w = *as_number(words[i]);
    TANDEM_CHECK(std::isfinite(w) && w > 0, flag, " ", spec.text, ": the weight ", words[i], " of ",
                 words[i + 1], " is invalid: a weight must be a finite number > 0");
    spec.weights.push_back(w);
    spec.paths.push_back(words[i + 1]);
  }
  return spec;
}

size_t blend_choice(const std::vector<double>& weights, const std::vector<int64_t>& counts,
                    int64_t index) {
  const double at = std::max(static_cast<double>(index), 1.0);
  size_t best = 0;
  double best_error = weights[0] * at - static_cast<double>(counts[0]);
  for (size_t d = 1; d < weights.size(); ++d) {
    const double error = weights[d] * at - static_cast<double>(counts[d]);
    if (error > best_error) best_error = error, best = d;
  }
  return best;
}

BlendedDataset::BlendedDataset(std::vector<std::unique_ptr<Dataset>> parts,
                               std::vector<double> weights)
    : parts_(std::move(parts)), weights_(std::move(weights)) {
  TANDEM_ASSERT(!parts_.empty() && parts_.size() == weights_.size(), "a blend of ", parts_.size(),
                " parts and ", weights_.size(), " weights");
  double sum = 0;
  for (double w : weights_) {
    TANDEM_ASSERT(std::isfinite(w) && w > 0, "blend weight ", w);
    sum += w;
  }
  for (double& w : weights_) w /= sum;
  counts_.push_back(std::vector<int64_t>(parts_.size(), 0));
}

std::pair<size_t, int64_t> BlendedDataset::locate(int64_t index) const {
  TANDEM_CHECK(index >= 0, "sample index ", index, " is invalid: it must be >= 0");
  const auto block = static_cast<size_t>(index / kBlendStride);
  std::vector<int64_t> counts;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    while (counts_.size() <= block) {
      std::vector<int64_t> next = counts_.back();
      const auto first = static_cast<int64_t>(counts_.size() - 1) * kBlendStride;
      for (int64_t i = first; i < first + kBlendStride; ++i)
        next[blend_choice(weights_, next, i)]++;
      counts_.push_back(std::move(next));
    }
    counts = counts_[block];
  }
  for (int64_t i = static_cast<int64_t>(block) * kBlendStride; i < index; ++i) {
    counts[blend_choice(weights_, counts, i)]++;
  }
  const size_t d = blend_choice(weights_, counts, index);
  return {d, counts[d]};
}

void BlendedDataset::sample(int64_t index, int32_t* out, int64_t length) const {
  const auto [d, i] = locate(index);
  parts_[d]->sample(i, out, length);
}

int64_t BlendedDataset::vocab_size() const {
  int64_t most = 0;
  for (const auto& p : parts_) most = std::max(most, p->vocab_size());
  return most;
}

std::string BlendedDataset::describe() const {
  std::string out = "a blend of";
  for (size_t d = 0; d < parts_.size(); ++d) {
    out += detail::concat(d ? "," : "", " ", weights_[d], " x ", parts_[d]->describe());
  }
  return out;
}

std::unique_ptr<Dataset> open_blend(const BlendSpec& spec, DatasetFormat format, int64_t vocab_size,
                                    uint64_t seed, int64_t seq_plus_one,
                                    const std::optional<SplitWeights>& split, SplitPart part) {
  std::vector<std::unique_ptr<Dataset>> parts;
  std::vector<double> sizes;
  for (const std::string& path : spec.paths) {
    std::unique_ptr<FileTokenDataset> file =
        open_file_dataset(path, format, vocab_size, seed, seq_plus_one);
    if (split) {
      std::unique_ptr<TokenRangeDataset> range =
          split_dataset(std::move(file), *split, part, seq_plus_one);
      sizes.push_back(static_cast<double>(range->end() - range->begin()));
      parts.push_back(std::move(range));
    } else {
      sizes.push_back(static_cast<double>(file->num_tokens()));
      parts.push_back(std::move(file));
    }
  }
  if (parts.size() == 1 && spec.weights.empty()) return std::move(parts.front());
  return std::make_unique<BlendedDataset>(std::move(parts),
                                          spec.weights.empty() ? sizes : spec.weights);
}

}  // namespace tandem::data
