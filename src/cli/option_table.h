// The run options' tables (internal to src/cli): the data and output settings beside the core's
// model, training, parallel and performance tables (Note [Every setting declared once] in
// core/settings.h), and all of a run's together. options.cc walks them for the command line, the
// --config file, checkpoints and the ranks' agreement.
#pragma once

#include "cli/options.h"
#include "core/settings.h"

namespace tandem::cli {

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

// What a run reads and how it validates (--data-path, --split, --eval-iters, ...).
Settings data_settings(RunOptions& o);
// What a run writes, loads and prints (--save, --load, --log-json, --quiet, ...).
Settings output_settings(RunOptions& o);
// Every setting of `tandem train` (and of `plan` and `eval`, which take the same), in --help's
// order: model, training, parallel, data, output, performance. Points into `o`.
Settings run_settings(RunOptions& o);

}  // namespace tandem::cli
