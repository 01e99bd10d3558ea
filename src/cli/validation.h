// Validation for `tandem train` and `tandem eval`: which data a run validates on, when, and its
// mean loss over --eval-iters global batches (runtime::PipelineTrainer::evaluate).
//
// Note [Validation data]: the first of these that applies:
//   --valid-data-path P   every sample of P (in --data-format; a blend, data/blend.h), Megatron's
//                         --valid-data-path, beside --train-data-path (--data-path and the
//                         per-part paths exclude each other, as in Megatron: data_options.h);
//   --split T,V,S         the validation part of --data-path (data/split.h; of each file of a
//                         blend, blended by its weights), Megatron's --split;
//   --data-path P alone   `tandem eval` only: all of P (the file it was asked to evaluate);
//                         `tandem train` refuses it (it would validate on its training data);
//   --mock-data           uniformly random tokens of a stream of their own;
//   neither               the built-in addition task's held-out problems
//                         (data/addition_held_out.h), the pairs training never sees.
// The test data, evaluated once after the last step for --eval-iters batches as Megatron does
// (printed, and written to --log-json and --tensorboard-dir as test_loss / test/loss): the
// --test-data-path, else the test part of --data-path under a --split whose test weight is
// above 0; else there is no test.
// The batches are the first --eval-iters global batches of that data, the same at every
// validation, so validations are comparable step to step, and `tandem eval --load` of a saved
// step gives the loss the run reported at that step.
#pragma once

#include <cstdint>
#include <memory>

#include "cli/options.h"
#include "data/dataset.h"
#include "data/split.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::cli {

// Whether --data-path alone may be validated on (Note [Validation data]).
enum class WholeDataPath : uint8_t { kRefused, kEvaluated };

// Checks --split, --valid-data-path and --eval-iters against each other and the data options;
// creates and writes nothing. Throws tandem::Error naming the option, the value and what is
// valid.
void check_validation_options(const RunOptions& o, WholeDataPath whole);

// --data-path (or --train-data-path, for the training part), or its `part` under --split when
// --split is given.
std::unique_ptr<data::Dataset> open_data_path(const RunOptions& o, data::SplitPart part);

// The data a validation reads (Note [Validation data]).
std::unique_ptr<data::Dataset> make_validation_dataset(const RunOptions& o, WholeDataPath whole);

// The test data (Note [Validation data]), or nullptr when the run has none.
std::unique_ptr<data::Dataset> make_test_dataset(const RunOptions& o);

// Whether the step that ends at `iteration` is followed by a validation: every --eval-interval
// steps and after the last, when --eval-iters > 0.
bool should_validate(const RunOptions& o, int64_t iteration);

// Reads every micro-batch of the first validation batch, so that bad data stops the run before
// any output file is created (later batches are checked as they are read).
void check_first_validation_batch(const data::Dataset& data, const RunOptions& o);

// Runs --eval-iters global batches of `data` forward on every rank (collective).
runtime::EvalResult validate(runtime::PipelineTrainer& trainer, const data::Dataset& data,
                             const RunOptions& o);

}  // namespace tandem::cli
