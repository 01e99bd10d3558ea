// Megatron's blended data: `--data-path 0.3 A 0.7 B` draws 30% of the samples from A and 70%
// from B; so do --train-data-path, --valid-data-path and --test-data-path.
//
// Note [Blending order]: sample i of a blend comes from the part whose weight most exceeds its
// share so far: with normalized weights w and c[d] samples already taken from part d, sample i
// goes to the first d maximizing w[d] * max(i, 1) - c[d], and is that part's sample c[d] (its
// own seeded window order, Note [Window order] in file_dataset.h). This is Megatron's
// build_blending_indices; every prefix of n samples holds within one sample of w[d] * n from each
// part, and the order is a pure function of the weights (the seed picks each part's windows).
// Random access: the counts are kept every kBlendStride samples, computed once as far as asked.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/file_dataset.h"
#include "data/split.h"

namespace tandem::data {

// One of --data-path's forms, as Megatron's get_blend_from_list reads its words: one prefix; an
// even number of words whose every other one (the first, third, ...) is a number: weight and
// prefix pairs; or prefixes alone (their weights then their parts' sizes in tokens).
struct BlendSpec {
  std::vector<std::string> paths;
  std::vector<double> weights;  // empty: none given
  std::string text;             // the words as given, for messages
};
// Throws tandem::Error naming `flag`, the words and what is valid: no words, a weight that is not
// finite and > 0, or weights given for some prefixes and not others.
BlendSpec parse_blend(const std::string& flag, const std::vector<std::string>& words);

inline constexpr int64_t kBlendStride = 4096;

class BlendedDataset : public Dataset {
 public:
  // `weights` (each > 0) are normalized; parts and weights pair up; `names` describe the parts.
  BlendedDataset(std::vector<std::unique_ptr<Dataset>> parts, std::vector<double> weights);
  void sample(int64_t index, int32_t* out, int64_t length) const override;
  int64_t vocab_size() const override;
  std::string describe() const override;
  // The part sample `index` is drawn from and its sample index there (Note [Blending order]).
  std::pair<size_t, int64_t> locate(int64_t index) const;
  const std::vector<double>& weights() const { return weights_; }

 private:
  std::vector<std::unique_ptr<Dataset>> parts_;
  std::vector<double> weights_;  // normalized
  mutable std::mutex mutex_;
  // counts_[k]: the samples taken from each part before sample k * kBlendStride.
  mutable std::vector<std::vector<int64_t>> counts_;
};

// The greedy choice of Note [Blending order] for sample `index`, given the counts so far.
size_t blend_choice(const std::vector<double>& weights, const std::vector<int64_t>& counts,
                    int64_t index);

// The data set `spec` names for `part`: each prefix opened in `format` (check_token_ids and the
// size checks of open_file_dataset), its `part` under `split` when one is given, blended by the
// weights when there are several. One prefix without --split: the file itself.
std::unique_ptr<Dataset> open_blend(const BlendSpec& spec, DatasetFormat format, int64_t vocab_size,
                                    uint64_t seed, int64_t seq_plus_one,
                                    const std::optional<SplitWeights>& split, SplitPart part);

}  // namespace tandem::data
