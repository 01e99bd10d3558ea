// CLI11's App, declared only. The headers of src/cli name it in declarations; the files that
// build commands or parse with it include <CLI/CLI.hpp> themselves (about ten seconds of compile
// time in every file that reads it, three times that under the sanitizers).
#pragma once

namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI
