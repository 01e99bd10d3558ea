// A run's options parsed in-process the way main() parses them, for the tests of test_cli.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/options.h"
#include "core/error.h"

namespace tandem::cli::parsing {

// Parses `args` (without the program name) the way main() does, returning the options.
inline RunOptions parse(const std::vector<std::string>& args) {
  CLI::App app{"tandem test"};
  RunOptions opts;
  add_run_options(app, opts);
  std::vector<const char*> argv = {"tandem"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  finalize_run_options(app, opts);
  return opts;
}

// The message of the error `args` produce, or "" when they are accepted.
inline std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const CLI::ParseError& e) {
    return std::string("CLI11: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tandem::cli::parsing
