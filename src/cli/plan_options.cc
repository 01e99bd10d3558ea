// `tandem plan`'s settings, one row each (Note [Every setting declared once] in core/settings.h).
#include "cli/plan_options.h"

#include <string>
#include <vector>

namespace tandem::cli {

Settings plan_settings(PlanOptions& p) {
  std::vector<std::string> cost_models;
  for (const EnumName<schedule::CostModelKind>& n : schedule::kCostModelOptionNames)
    cost_models.emplace_back(n.name);
  const Scope process = Scope::kProcess;
  return in_group(
      SettingGroup::kPlan,
      {
          {.name = "schedule-file",
           .ref = &p.schedule_file,
           .help = "plan your own schedule: one line per rank, `rank 0: 0F0 0F1 0SEND_F0 ...` "
                   "(docs/schedules.md); replaces --schedule (default: none)",
           .metavar = "FILE"},
          {.name = "num-microbatches",
           .ref = &p.num_microbatches,
           .help = "micro-batches per step; 0 derives them from the batch sizes",
           .bound = FieldBound::kNonNegative},
          {.name = "data-parallel-size",
           .ref = &p.data_parallel_size,
           .help = "ranks per pipeline stage, as `mpirun -np` / PP gives `tandem train` (expert "
                   "ranks included): divides --global-batch-size into micro-batches as training "
                   "does, and plans the gradient all-reduce over them (with --overlap-grad-reduce "
                   "beside the backward)",
           .bound = FieldBound::kPositive,
           .most = static_cast<double>(int64_t{1} << 30),
           .metavar = "N",
           .default_text = "--expert-model-parallel-size"},
          {.name = "cost-model",
           .ref = EnumRef{cost_models,
                          [&p] { return std::string(schedule::cost_model_name(p.cost_model)); },
                          [&p](const std::string& name) {
                            p.cost_model = parse_enum<schedule::CostModelKind>(name).value();
                          }},
           .help =
               "roofline (FLOPs and bytes against the device below) or uniform (F 1, B 2, I and "
               "W 1 each, communication 0: for checking against theory)"},
          {.name = "node-times",
           .ref = &p.node_times,
           .help = "per-node times in seconds from a JSON file (docs/schedules.md) instead of the "
                   "roofline; a file of `tandem train --node-times-out` says the shape it was "
                   "measured at, and a plan of another micro-batch size, sequence length, layer "
                   "count or expert-parallel size scales each node by its work (docs/planning.md) "
                   "(default: none)",
           .metavar = "FILE"},
          {.name = "routing",
           .ref = &p.routing,
           .help = "the rows each experts node received in a measured step, from `tandem train "
                   "--routing-out` (docs/parallel.md): plans that step's expert-parallel memory "
                   "instead of balanced routing's (default: none)",
           .metavar = "FILE"},
          {.name = "routing-rank",
           .ref = &p.routing_rank,
           .help = "with --routing: the world rank whose pipeline is planned",
           .bound = FieldBound::kNonNegative,
           .metavar = "RANK"},
          {.name = "measured-trace",
           .ref = &p.measured_trace,
           .help = "a measured step (`tandem train --trace FILE`) to set beside the plan: each "
                   "rank's forward-backward planned and measured, and with --trace one chart with "
                   "each measured rank under its planned one (default: none)",
           .metavar = "FILE"},
          {.name = "activation-bytes",
           .ref = &p.activation_bytes,
           .help = "bytes per activation element (2 bf16, 4 f32, 8 f64); --device cuda plans 2 "
                   "unless this is given, with f32 statistics, the fused LM head and the weights' "
                   "bf16 copy",
           .choices = {"2", "4", "8"}},
          {.name = "matrix-flops",
           .ref = &p.device.matrix_flops_per_s,
           .help = "the device's matrix rate, flop/s (about one H200 in bf16)",
           .bound = FieldBound::kPositive,
           .metavar = "FLOP/S"},
          {.name = "memory-bandwidth",
           .ref = &p.device.memory_bytes_per_s,
           .help = "the device's memory bandwidth, bytes/s",
           .bound = FieldBound::kPositive,
           .metavar = "BYTES/S"},
          {.name = "link-bandwidth",
           .ref = &p.device.link_bytes_per_s,
           .help = "per-GPU link bandwidth of all-to-all, pipeline messages and (unless the node "
                   "times measured it) the gradient all-reduce's bus, bytes/s (NVLink)",
           .bound = FieldBound::kPositive,
           .metavar = "BYTES/S"},
          {.name = "link-latency",
           .ref = &p.device.link_latency_s,
           .help = "latency of one message, seconds",
           .bound = FieldBound::kNonNegative,
           .metavar = "SECONDS"},
          {.name = "memory-limit",
           .ref = &p.memory_limit_text,
           .help =
               "the memory a rank may hold (e.g. 80GiB, 141e9): says which ranks' planned peaks "
               "go over it, and with --compare-schedules which schedules fit (default: none)",
           .metavar = "SIZE"},
          {.name = "compare-schedules",
           .ref = &p.compare_schedules,
           .help =
               "plan every built-in schedule on this layout and model, one line each (step, "
               "whole step, tokens/s, bubble, exposed all-to-all, highest peak), instead of one "
               "schedule's table"},
          {.name = "search",
           .ref = &p.search.search,
           .help =
               "plan every layout of the model on --world-size ranks (pipeline, data and expert "
               "parallel sizes, micro-batch size, schedule, stages per rank, recomputation; the "
               "options you give stay fixed) and list those whose every rank fits "
               "--memory-limit, highest planned tokens/s first, then why the rest do not "
               "(docs/planning.md)"},
          {.name = "world-size",
           .ref = &p.search.world_size,
           .help = "with --search: the ranks (GPUs) to lay out, as `mpirun -np` would start them",
           .bound = FieldBound::kPositive,
           .metavar = "N",
           .default_text = "none"},
          {.name = "search-top",
           .ref = &p.search.top,
           .help = "with --search: the fitting layouts the table prints; 0: all",
           .bound = FieldBound::kNonNegative,
           .metavar = "N"},
          {.name = "json",
           .ref = &p.json,
           .help = "print a JSON summary instead of the table",
           .scope = process},
          {.name = "svg",
           .ref = &p.svg,
           .help = "write a Gantt chart with each rank's memory curve, a time axis and a "
                   "memory scale to FILE (an SVG; .svg is added to a name without an extension; "
                   "default: none)",
           .metavar = "FILE",
           .scope = process},
          {.name = "write-schedule",
           .ref = &p.write_schedule,
           .help = "write the (validated) schedule in the text format to FILE, to edit and plan "
                   "again with --schedule-file (default: none)",
           .metavar = "FILE",
           .scope = process},
      });
}

}  // namespace tandem::cli
