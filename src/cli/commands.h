// The subcommands of the tandem program; each registers itself with its options and callback.
#pragma once

#include "cli/cli_fwd.h"

namespace tandem::cli {

void register_train_command(CLI::App& app);
void register_generate_command(CLI::App& app);
void register_eval_command(CLI::App& app);
void register_convert_command(CLI::App& app);
void register_plan_command(CLI::App& app);

}  // namespace tandem::cli
