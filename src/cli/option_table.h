// The run options' one table (internal to src/cli): each option's name, where its value lives,
// its help, bound and choices. options.cc walks it for the command line, the --config file,
// checkpoints and the ranks' agreement; option_table.cc fills it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "cli/options.h"
#include "core/config.h"
#include "core/enum_names.h"

namespace tandem::cli {

using Bound = FieldBound;
// Whether a key may appear in the --config file (--config itself may not).
enum class InFile : uint8_t { kAllowed, kForbidden };

// An enumeration's option (Note [One name table per enumeration] in core/enum_names.h): its
// value travels as the name in the enum's table, and is stored straight into the enum.
struct EnumTarget {
  std::vector<std::string> names;
  std::function<std::string()> get;
  std::function<void(const std::string&)> set;  // one of `names`
};
template <class E>
EnumTarget enum_target(E* p) {
  return {enum_name_list<E>(), [p] { return std::string(enum_name(*p)); },
          [p](const std::string& name) { *p = parse_enum<E>(name).value(); }};
}

using Target = std::variant<int64_t*, uint64_t*, double*, std::string*, bool*, EnumTarget>;
using Value = std::variant<int64_t, uint64_t, double, std::string, bool>;

struct OptionSpec {
  std::string name;  // the long option without dashes; also the TOML key
  Target target;
  std::string help;  // meaning; " (default: ...)" is appended unless the value is an empty string
  Bound bound = Bound::kAny;
  std::vector<std::string> choices = {};  // non-empty: the only valid values of a string option
  std::string metavar = {};               // shown in --help instead of TEXT
  InFile in_file = InFile::kAllowed;
  std::string default_text = {};  // non-empty: shown as the default instead of the value
};

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

// The model's options, from the one table of model fields (Note [One table of model fields]).
void add_model_specs(std::vector<OptionSpec>& s, ModelConfig& m);
// The one table; it points into `o`, so it is rebuilt for each RunOptions.
std::vector<OptionSpec> option_specs(RunOptions& o);

}  // namespace tandem::cli
