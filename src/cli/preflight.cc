// The pre-flight memory check of `tandem train` (preflight.h).
//
// Note [Pre-flight memory check]: the planner knows each rank's peak before a step runs (equal to
// the measured one: docs/memory.md), so `tandem train` compares it with what the rank's device
// has before it allocates anything of the run (weights, optimizer state, data), and a run that
// cannot fit stops at once with exit 2 instead of allocating until the allocator fails:
//   - available: --memory-available when given; on the GPU its free memory (cudaMemGetInfo)
//     and what tandem's allocator already holds live; on the CPU the least of the machine's
//     available memory (MemAvailable) and its cgroup's limit left, each divided among the ranks
//     on the machine, and the process's limits (ulimit -v, -d) less what it holds already.
//     Offloaded activations (GPU) are checked against the host's figure too.
//   - the message: planned against available, what the peak is made of (weights, gradients,
//     optimizer state, activations, in flight, op workspace, at the time of the peak), and the
//     layouts of the run's ranks that fit, best planned tokens/s first: schedule::search_layouts
//     over the run's world size with the available memory as limit (`tandem plan --search`'s
//     search), run only when the run does not fit; when none fits, the same for twice, four
//     and eight times the ranks, while the searches are expected to end within kSearchBudgetS.
// Every rank checks its own pipeline rank's plan; the caller runs it under run_agreeing, so a
// rank that does not fit stops every rank before any allocates.
#include "cli/preflight.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cli/progress.h"
#include "cli/sizes.h"
#include "comm/mpi_communicator.h"
#include "core/device.h"
#include "core/error.h"
#include "planner/search.h"
#if TANDEM_WITH_CUDA
#include "core/cuda/context.h"
#endif

namespace tandem::cli {
namespace {

constexpr int64_t kUnknown = std::numeric_limits<int64_t>::max();
// Seconds of layout search the refusal may spend finding layouts that fit (a search over more
// ranks starts only when it is expected to end within them).
constexpr double kSearchBudgetS = 3.0;
// Layouts the refusal names.
constexpr size_t kLayoutsNamed = 3;

// The figure after `key` in a line "key value [kB]" of a /proc file, in bytes.
std::optional<int64_t> proc_bytes(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    long long v = 0;
    char unit[8] = "";
    const int n = std::sscanf(line.c_str() + key.size(), "%lld %7s", &v, unit);
    if (n < 1) return std::nullopt;
    return static_cast<int64_t>(v) * (n == 2 && std::string(unit) == "kB" ? 1024 : 1);
  }
  return std::nullopt;
}

// A process limit (getrlimit's soft one) less what the process holds of it (a /proc/self/status
// figure); nothing when unlimited.
std::optional<int64_t> limit_left(int resource, const char* status_key) {
  rlimit lim{};
  if (::getrlimit(resource, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const int64_t used = proc_bytes("/proc/self/status", status_key).value_or(0);
  const auto cap = static_cast<int64_t>(std::min<rlim_t>(lim.rlim_cur, kUnknown));
  return cap - used;
}

// The first line of a file, or "".
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// cgroup v2: memory.max less memory.current of this process's cgroup, when it has a limit.
std::optional<int64_t> cgroup_left() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, group;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) group = line.substr(3);
  }
  if (group.empty()) return std::nullopt;
  const std::string dir = "/sys/fs/cgroup" + (group == "/" ? std::string() : group);
  const std::string max = first_line(dir + "/memory.max");
  const std::string current = first_line(dir + "/memory.current");
  if (max.empty() || max == "max" || current.empty()) return std::nullopt;
  try {
    return std::stoll(max) - std::stoll(current);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "weights 12.0 GiB and their bf16 copy 6.0 GiB, gradients ...": the peak's parts.
std::string peak_parts(const schedule::RankResult& r) {
  const schedule::RankMemory& m = r.static_memory;
  std::string out = "weights " + format_bytes(m.param_bytes);
  if (m.compute_copy_bytes > 0) out += " and their bf16 copy " + format_bytes(m.compute_copy_bytes);
  out += ", gradients " + format_bytes(m.grad_bytes) + ", optimizer state " +
         format_bytes(m.optimizer_bytes) + ", activations " +
         format_bytes(r.activation_at_peak_bytes) + ", in flight " +
         format_bytes(r.in_flight_at_peak_bytes);
  if (r.workspace_at_peak_bytes > 0) {
    out += ", op workspace " + format_bytes(r.workspace_at_peak_bytes);
  }
  return out;
}

// The options of `tandem train` that set dimension `d` to `v`.
std::string option_text(const schedule::SearchDimension& d, int64_t v) {
  const std::string label = d.label(v);
  if (label == "on") return "--" + d.option;
  if (label == "off") {
    return d.option == "offload-activations" ? "no --offload-activations"
                                             : "--" + d.option + "=false";
  }
  return "--" + d.option + " " + (label == "-" ? "0" : label);
}

// What a fitting layout changes of the run: its options that differ from `base`'s, and its peak.
// The data-parallel size and the micro-batches follow from the ranks and the batch sizes.
std::string layout_text(const schedule::SearchRow& row, const schedule::PlanRequest& base) {
  const std::vector<schedule::SearchDimension>& dims = schedule::search_dimensions();
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) {
    const schedule::SearchDimension& d = dims[i];
    if (d.option == "data-parallel-size" || d.option == "num-microbatches") continue;
    if (row.choice[i] == d.read(base)) continue;
    out += (out.empty() ? "" : " ") + option_text(d, row.choice[i]);
  }
  return detail::concat(out.empty() ? "the run's own options" : out, " (peak ",
                        format_bytes(row.peak_bytes), ")");
}

// The search's fitting layouts of `world` ranks (nothing when the search finds no candidate).
// On the CPU offloading moves activations within the same memory: the run's choice stays.
std::vector<schedule::SearchRow> fitting(const schedule::PlanRequest& base, int64_t world,
                                         int64_t global_batch, int64_t limit) {
  schedule::SearchSpace space;
  space.world_size = world;
  space.global_batch_size = global_batch;
  space.memory_limit = limit;
  if (!base.inputs.gpu) space.fixed["offload-activations"] = base.inputs.offload_kinds;
  try {
    return schedule::search_layouts(base, space).fits;
  } catch (const Error&) {
    return {};
  }
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// "1 rank", "4 ranks".
std::string ranks_text(int64_t n) { return detail::concat(n, n == 1 ? " rank" : " ranks"); }

// The layouts that fit, from the run's ranks upward (Note [Pre-flight memory check]).
std::string fitting_layouts(const RunOptions& o, const schedule::PlanRequest& base, int64_t world,
                            int64_t limit) {
  const auto start = std::chrono::steady_clock::now();
  std::string none;  // "No layout of 1, 2 or 4 ranks fits; "
  std::vector<int64_t> tried;
  double last_s = 0;  // the last search's time; the next, over twice the ranks, takes longer
  for (int64_t ranks = world; ranks <= 8 * world; ranks *= 2) {
    const auto search_start = std::chrono::steady_clock::now();
    const std::vector<schedule::SearchRow> fits =
        fitting(base, ranks, o.train.global_batch_size, limit);
    last_s = seconds_since(search_start);
    if (!fits.empty()) {
      std::string out =
          detail::concat(none, none.empty() ? "Layouts" : "layouts", " of ", ranks_text(ranks),
                         ranks == world ? "" : detail::concat(" (mpirun -np ", ranks, ")"),
                         " that fit, best planned tokens/s first: ");
      for (size_t i = 0; i < fits.size() && i < kLayoutsNamed; ++i) {
        out += (i ? "; " : "") + layout_text(fits[i], base);
      }
      return detail::concat(out, " (`tandem plan` with these options and --search --world-size ",
                            ranks, " --memory-limit ", limit, " lists them all).");
    }
    tried.push_back(ranks);
    std::string sizes;
    for (size_t i = 0; i < tried.size(); ++i) {
      sizes += detail::concat(i == 0 ? "" : i + 1 == tried.size() ? " or " : ", ", tried[i]);
    }
    none = detail::concat("No layout of ", sizes, ranks == 1 ? " rank" : " ranks", " fits; ");
    if (seconds_since(start) + 2 * last_s > kSearchBudgetS) break;
  }
  return none + "more ranks, or a smaller model or batch (`tandem plan --search`).";
}

// The refusal of pipeline rank `r`, whose planned `what` (`planned` bytes) is above `available`;
// `details` says what the peak holds and what would make it fit.
[[noreturn]] void refuse(const schedule::RankResult& r, int64_t planned,
                         const MemoryAvailable& available, const std::string& what,
                         const std::string& details) {
  throw Error(detail::concat("the run does not fit: pipeline rank ", r.rank, "'s planned ", what,
                             " is ", format_bytes(planned), " (", planned,
                             " bytes), more than the ", format_bytes(available.bytes), " (",
                             available.bytes, " bytes) of ", available.source, ". ", details,
                             " --memory-available SIZE sets what a rank may hold."));
}

}  // namespace

MemoryAvailable host_memory_available() {
  MemoryAvailable best{kUnknown, ""};
  const auto consider = [&](std::optional<int64_t> bytes, const std::string& source) {
    if (bytes && *bytes < best.bytes) best = {std::max<int64_t>(*bytes, 0), source};
  };
  const int ranks = comm::local_size();
  const std::string shared =
      ranks > 1 ? detail::concat(", shared by the ", ranks, " ranks on it") : std::string();
  const std::optional<int64_t> mem = proc_bytes("/proc/meminfo", "MemAvailable:");
  consider(mem ? std::optional<int64_t>(*mem / ranks) : std::nullopt,
           "the machine's available memory (MemAvailable in /proc/meminfo" + shared + ")");
  const std::optional<int64_t> group = cgroup_left();
  consider(group ? std::optional<int64_t>(*group / ranks) : std::nullopt,
           "the memory its cgroup has left (memory.max less memory.current" + shared + ")");
  consider(limit_left(RLIMIT_AS, "VmSize:"),
           "the process's address-space limit (ulimit -v) less what it maps already");
  consider(limit_left(RLIMIT_DATA, "VmData:"),
           "the process's data limit (ulimit -d) less what it holds already");
  return best;
}

std::optional<int64_t> memory_available_option(const RunOptions& o, const std::string& command) {
  if (o.memory_available.empty()) return std::nullopt;
  TANDEM_CHECK(command == "train", "--memory-available ", o.memory_available,
               " is the limit of tandem train's pre-flight memory check; tandem ", command,
               command == "plan" ? " compares each rank's peak with --memory-limit SIZE instead"
                                 : " checks none",
               ": leave it out");
  const std::optional<double> bytes = parse_size(o.memory_available);
  TANDEM_CHECK(bytes && *bytes < 9e18, "--memory-available ", o.memory_available,
               " is not a size below 9e18 bytes: use ", kSizeForms);
  return static_cast<int64_t>(*bytes);
}

MemoryAvailable device_memory_available(const RunOptions& o) {
  if (const std::optional<int64_t> bytes = memory_available_option(o)) {
    return {*bytes, "--memory-available " + o.memory_available};
  }
  if (o.train.device == Device::kCPU) return host_memory_available();
#if TANDEM_WITH_CUDA
  return {cuda::free_device_bytes() + allocator_for(o.train.device).stats().total_in_use,
          "the GPU's free memory (cudaMemGetInfo)"};
#else
  return {kUnknown, ""};
#endif
}

void check_planned_memory_fits(const RunOptions& o, const schedule::PlanRequest& base,
                               const schedule::Plan& plan, int32_t pipeline_rank,
                               int64_t world_size) {
  const schedule::RankResult& r = plan.sim.ranks.at(static_cast<size_t>(pipeline_rank));
  const MemoryAvailable device = device_memory_available(o);
  // On the CPU the host memory offloaded activations wait in is the same memory.
  const bool cpu = o.train.device == Device::kCPU;
  const int64_t planned = r.peak_bytes + (cpu ? r.offload_host_peak_bytes : 0);
  if (device.known() && planned > device.bytes) {
    const std::string offloaded =
        cpu && r.offload_host_peak_bytes > 0
            ? ", and offloaded activations " + format_bytes(r.offload_host_peak_bytes)
            : std::string();
    refuse(r, planned, device, "peak",
           "At the peak: " + peak_parts(r) + offloaded + ". " +
               fitting_layouts(o, base, world_size, device.bytes));
  }
  if (r.offload_host_peak_bytes > 0 && !cpu) {
    const MemoryAvailable host = host_memory_available();
    if (host.known() && r.offload_host_peak_bytes > host.bytes) {
      refuse(r, r.offload_host_peak_bytes, host, "host memory for offloaded activations",
             "Offload fewer node kinds (--offload-activations), or more ranks.");
    }
  }
}

}  // namespace tandem::cli
