// Validation data, timing and runs (validation.h).
#include "cli/validation.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "data/addition_held_out.h"
#include "data/file_dataset.h"
#include "data/mock.h"
#include "data/random.h"
#include "runtime/step.h"

namespace tandem::cli {
namespace {

// The mock validation tokens' stream, apart from the training samples' (any index of those).
constexpr uint64_t kMockValidationStream = 0x7661'6c69'6400'0001ULL;  // "valid"

// A data path must be readable: the file itself or a Megatron prefix's .bin and .idx.
void check_readable_data(const std::string& flag, const std::string& path,
                         const std::string& format) {
  const data::DatasetFormat f = data::parse_dataset_format(format);
  const bool megatron = f == data::DatasetFormat::kAuto || f == data::DatasetFormat::kMegatron;
  if (megatron && ::access((path + ".bin").c_str(), R_OK) == 0 &&
      ::access((path + ".idx").c_str(), R_OK) == 0) {
    return;
  }
  TANDEM_CHECK(::access(path.c_str(), R_OK) == 0, flag, " ", path, ": cannot read it (",
               std::strerror(errno), "); give a readable token or text file",
               megatron ? ", or the prefix P of a Megatron P.bin/P.idx pair" : "");
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), flag, " ", path,
               ": is a directory; give a data file or a Megatron .bin/.idx prefix");
}

void check_split(const RunOptions& o, WholeDataPath whole) {
  if (o.split.empty()) return;
  TANDEM_CHECK(!o.data_path.empty(), "--split ", o.split,
               " divides --data-path into parts, but no --data-path is given (",
               o.mock_data ? "--mock-data has no parts"
                           : "the built-in task validates on its held-out problems",
               "): leave --split out or give --data-path");
  const data::SplitWeights w = data::parse_split(o.split);
  TANDEM_CHECK(whole == WholeDataPath::kEvaluated || w.of(data::SplitPart::kTrain) > 0, "--split ",
               o.split,
               " gives the training part no weight: nothing is left to train on; give the "
               "first weight more than 0");
  TANDEM_CHECK(o.valid_data_path.empty() || w.of(data::SplitPart::kValid) == 0,
               "--valid-data-path ", o.valid_data_path, " and --split ", o.split,
               " both name validation data: give one of them (a --split with validation weight "
               "0, e.g. 99,0,1, keeps its test part apart)");
}

}  // namespace

void check_validation_options(const RunOptions& o, WholeDataPath whole) {
  check_split(o, whole);
  if (!o.valid_data_path.empty()) {
    check_readable_data("--valid-data-path", o.valid_data_path, o.data_format);
  }
  if (o.eval_iters == 0 || whole == WholeDataPath::kEvaluated) return;
  const bool held_out =
      !o.valid_data_path.empty() ||
      (!o.split.empty() && data::parse_split(o.split).of(data::SplitPart::kValid) > 0);
  TANDEM_CHECK(o.data_path.empty() || held_out, "--eval-iters ", o.eval_iters,
               " validates on held-out data, but none of --data-path ", o.data_path,
               " is held out: give --split with a validation weight (e.g. --split 969,30,1) or "
               "--valid-data-path, or --eval-iters 0");
}

std::unique_ptr<data::Dataset> open_data_path(const RunOptions& o, data::SplitPart part) {
  const int64_t sample = o.model.seq_length + 1;
  if (o.split.empty()) {
    return data::open_dataset(o.data_path, o.data_format, o.model.vocab_size, o.train.seed, sample);
  }
  std::shared_ptr<const data::FileTokenDataset> file =
      data::open_file_dataset(o.data_path, data::parse_dataset_format(o.data_format),
                              o.model.vocab_size, o.train.seed, sample);
  return data::split_dataset(std::move(file), data::parse_split(o.split), part, sample);
}

std::unique_ptr<data::Dataset> make_validation_dataset(const RunOptions& o, WholeDataPath whole) {
  if (!o.valid_data_path.empty()) {
    return data::open_dataset(o.valid_data_path, o.data_format, o.model.vocab_size, o.train.seed,
                              o.model.seq_length + 1);
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
