// Note [Megatron-LM's other options]: a Megatron-LM launch script passes options that have no
// setting of tandem's own (core/settings.h): switches of fusions, kernels and workers that cannot
// change what trains, sizes of parallelism tandem has only at 1, values tandem's model has only
// one of (--normalization RMSNorm), and features tandem does not have. Each such option is one
// row here, of one of four kinds:
//   neutral  accepted; it cannot change a result (docs/megatron.md says why)
//   only     accepted at the values tandem's model has; any other value exits 2 naming them
//   alias    sets a tandem setting with Megatron-LM's meaning (applied by apply_megatron_options)
//   refused  exits 2 naming the option and what to use instead
// so that a script runs as written, or stops before anything is written, never trains a model
// other than the one it describes without saying so.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cli/cli_fwd.h"

namespace tandem::cli {

struct RunOptions;
struct Origin;
using Origins = std::map<std::string, Origin>;

enum class MegatronKind : uint8_t { kNeutral, kOnly, kAlias, kRefused };

struct MegatronOption {
  const char* name;  // without dashes
  bool takes_value;
  MegatronKind kind;
  // kOnly: the values accepted (numbers compare as numbers); else empty.
  std::vector<std::string> only;
  // Why it is neutral, what it does (alias), or what to use instead (refused).
  const char* note;
  // Takes one or more values (Megatron-LM's nargs='+'); `given` holds them space-separated.
  bool list = false;
};

// Every row, in docs/megatron.md's order.
const std::vector<MegatronOption>& megatron_options();

// The options Megatron-LM's scripts pass that tandem's model needs (it is always RMSNorm, SwiGLU,
// RoPE, no linear biases, no dropout), and what Megatron-LM does without each: a script that uses
// Megatron-LM's options without one of them describes another model. (Whether the output layer
// is tied is a model setting of its own, --untie-embeddings-and-output-weights.)
struct ModelMarker {
  const char* name;
  const char* megatron_default;
};
const std::vector<ModelMarker>& megatron_model_markers();

// Adds each row to `app` (in --help's "Megatron-LM" section); the values given are recorded in
// `given` by name ("" for a switch).
void add_megatron_options(CLI::App& app, std::map<std::string, std::string>& given);

// The refused and the values an `only` row does not take: tandem::Error (exit 2) naming them.
// Then the aliases: their tandem settings, unless a setting they set was given (then both must
// agree). `origins` says which settings were given.
void apply_megatron_options(RunOptions& o, const Origins& origins);

// The --recompute-modules of a selective recomputation (--recompute-granularity selective or
// --recompute-activations; Megatron-LM's default core_attn when none is named); empty otherwise.
std::vector<std::string> recompute_modules(const std::map<std::string, std::string>& given);

// A line naming what Megatron-LM would recompute and tandem keeps (whole layers, MoE layers,
// modules other than core_attn and moe_act); empty when nothing.
std::string megatron_recompute_note(const std::map<std::string, std::string>& given);

// A line for stderr when Megatron-LM's options are in use but some of megatron_model_markers()
// are not: what Megatron-LM would build without them and what tandem builds. Empty otherwise.
std::string megatron_model_note(const std::map<std::string, std::string>& given);

}  // namespace tandem::cli
