// `tandem plan`: predicts each pipeline rank's timeline, bubble, exposed communication and
// memory for a schedule (built in or from a file) before a step runs (src/schedule).
#pragma once

#include "cli/cli_fwd.h"

namespace tandem::cli {

// Adds the `plan` subcommand: the shared run options plus --schedule-file, --cost-model,
// --node-times, --svg, --json, --write-schedule and the device description.
void register_plan_command(CLI::App& app);

}  // namespace tandem::cli
