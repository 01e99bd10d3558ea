// Validation data, timing and runs (validation.h).
#include "cli/validation.h"

#include <optional>
#include <utility>

#include "core/error.h"
#include "data/addition_held_out.h"
#include "data/blend.h"
#include "data/file_dataset.h"
#include "data/mock.h"
#include "data/random.h"
#include "runtime/step.h"

namespace tandem::cli {
namespace {

// The mock validation tokens' stream, apart from the training samples' (any index of those).
constexpr uint64_t kMockValidationStream = 0x7661'6c69'6400'0001ULL;  // "valid"

void check_split(const RunOptions& o, WholeDataPath whole) {
  if (o.split.empty()) return;
  // Megatron-LM's recipes pass --split beside --mock-data: every part of mock data is random
  // tokens (validation's from a stream of its own), so the weights only have to be valid.
  if (o.mock_data) {
    (void)data::parse_split(o.split);
    return;
  }
  TANDEM_CHECK(!o.data_path.empty(), "--split ", o.split,
               " divides --data-path into parts, but no --data-path is given (the built-in task "
               "validates on its held-out problems): leave --split out or give --data-path");
  const data::SplitWeights w = data::parse_split(o.split);
  TANDEM_CHECK(whole == WholeDataPath::kEvaluated || w.of(data::SplitPart::kTrain) > 0, "--split ",
               o.split,
               " gives the training part no weight: nothing is left to train on; give the "
               "first weight more than 0");
}

// `tandem train` takes the per-part paths as Megatron does, beside --train-data-path; `tandem
// eval` evaluates --valid-data-path.
void check_per_part_paths(const RunOptions& o, WholeDataPath whole) {
  if (whole == WholeDataPath::kEvaluated) {
    for (const auto& [flag, words] : {std::pair{"--train-data-path", &o.train_data_path},
                                      std::pair{"--test-data-path", &o.test_data_path}}) {
      TANDEM_CHECK(words->empty(), flag, " ", value_text(*words),
                   ": tandem eval evaluates validation data: give it as --valid-data-path");
    }
    return;
  }
  const bool held_out = !o.valid_data_path.empty() || !o.test_data_path.empty();
  TANDEM_CHECK(!held_out || !o.train_data_path.empty(),
               !o.valid_data_path.empty() ? "--valid-data-path " : "--test-data-path ",
               value_text(!o.valid_data_path.empty() ? o.valid_data_path : o.test_data_path),
               " is held-out data of a run whose training data --train-data-path names, but no "
               "--train-data-path is given: give it (or --data-path with --split)");
}

std::optional<data::SplitWeights> split_of(const RunOptions& o) {
  if (o.split.empty()) return std::nullopt;
  return data::parse_split(o.split);
}

std::unique_ptr<data::Dataset> open_words(const RunOptions& o, const char* flag,
                                          const StringList& words, data::SplitPart part) {
  return data::open_blend(data::parse_blend(flag, words), data::parse_dataset_format(o.data_format),
                          o.model.vocab_size, o.train.seed, o.model.seq_length + 1, split_of(o),
                          part);
}

}  // namespace

void check_validation_options(const RunOptions& o, WholeDataPath whole) {
  check_split(o, whole);
  check_per_part_paths(o, whole);
  if (o.eval_iters == 0 || whole == WholeDataPath::kEvaluated) return;
  const bool held_out =
      !o.valid_data_path.empty() ||
      (!o.split.empty() && data::parse_split(o.split).of(data::SplitPart::kValid) > 0);
  const bool file_data = !o.data_path.empty() || !o.train_data_path.empty();
  TANDEM_CHECK(!file_data || held_out, "--eval-iters ", o.eval_iters,
               " validates on held-out data, but none of ",
               o.data_path.empty() ? "--train-data-path " : "--data-path ",
               value_text(o.data_path.empty() ? o.train_data_path : o.data_path),
               " is held out: give ",
               o.data_path.empty() ? "--valid-data-path"
                                   : "--split with a validation weight (e.g. --split 969,30,1) "
                                     "or --train-data-path with --valid-data-path",
               ", or --eval-iters 0");
}

std::unique_ptr<data::Dataset> open_data_path(const RunOptions& o, data::SplitPart part) {
  if (o.data_path.empty()) {
    TANDEM_ASSERT(part == data::SplitPart::kTrain, "the per-part paths are opened by part");
    return open_words(o, "--train-data-path", o.train_data_path, part);
  }
  return open_words(o, "--data-path", o.data_path, part);
}

std::unique_ptr<data::Dataset> make_validation_dataset(const RunOptions& o, WholeDataPath whole) {
  if (!o.valid_data_path.empty()) {
    return open_words(o, "--valid-data-path", o.valid_data_path, data::SplitPart::kValid);
  }
  if (!o.data_path.empty()) {
    TANDEM_ASSERT(!o.split.empty() || whole == WholeDataPath::kEvaluated,
                  "check_validation_options lets no training run validate on its training data");
    return open_data_path(o, data::SplitPart::kValid);
  }
  if (o.mock_data) {
    return std::make_unique<data::MockDataset>(
        data::stream_key(o.train.seed, kMockValidationStream, 0), o.model.vocab_size);
  }
  return std::make_unique<data::AdditionHeldOutDataset>(o.train.seed,
                                                        static_cast<int>(o.addition_max_digits));
}

std::unique_ptr<data::Dataset> make_test_dataset(const RunOptions& o) {
  if (!o.test_data_path.empty()) {
    return open_words(o, "--test-data-path", o.test_data_path, data::SplitPart::kTest);
  }
  const std::optional<data::SplitWeights> split = split_of(o);
  if (o.data_path.empty() || !split || split->of(data::SplitPart::kTest) == 0) return nullptr;
  return open_data_path(o, data::SplitPart::kTest);
}

bool should_validate(const RunOptions& o, int64_t iteration) {
  return o.eval_iters > 0 && (iteration % o.eval_interval == 0 || iteration == o.train.train_iters);
}

void check_first_validation_batch(const data::Dataset& data, const RunOptions& o) {
  for (int64_t mb = 0; mb < o.train.num_microbatches(); ++mb) {
    runtime::load_micro_batch(data, o.model, o.train, 0, mb);
  }
}

runtime::EvalResult validate(runtime::PipelineTrainer& trainer, const data::Dataset& data,
                             const RunOptions& o) {
  return trainer.evaluate(data, o.eval_iters);
}

}  // namespace tandem::cli
