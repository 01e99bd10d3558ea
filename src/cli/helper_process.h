// Running a helper program of tandem's (Note [Tokenizers in a helper process] in
// cli/convert_command.cc): finding it beside the program, quoting its arguments for the shell,
// and reading its exit status.
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

// The helper `env` names when set, else the first of `candidates` (paths relative to the
// program's directory) that exists, else `fallback`.
std::string beside_program(const std::string& env, const std::vector<std::string>& candidates,
                           const std::string& fallback);

// `s` quoted for a POSIX shell.
std::string shell_quoted(const std::string& s);

// "HELPER failed (exit status 2; its message is above)" for a wait status of a helper that
// failed, else "" (also for one ended by SIGPIPE: its reader stopped reading, and says why).
std::string helper_failure(int status, const std::string& helper);

// Runs `command` (a shell command line starting `helper`) and returns the first line it prints,
// without its '\n'; throws tandem::Error (exit 2) when it cannot start, fails or prints nothing.
std::string helper_first_line(const std::string& command, const std::string& helper);

}  // namespace tandem::cli
