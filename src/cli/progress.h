// Progress output of a training run: a bar on stderr (only on a terminal), a log line every
// --log-interval steps on stdout, a JSON-lines file for --log-json and TensorBoard event files
// for --tensorboard-dir, both of which only open() creates.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/tensorboard.h"

namespace tandem::cli {

// Whether a step updated the weights (kSkipped: its loss or gradients were not finite and
// --nan-policy is skip).
enum class UpdateStatus : uint8_t { kApplied, kSkipped };

// What the trainer reports after each optimizer step. The memory fields hold one entry per
// pipeline/expert rank; with one entry the JSON value is a plain number, with several a list.
struct IterationRecord {
  int64_t iter = 0;  // 1-based number of the step just finished
  UpdateStatus status = UpdateStatus::kApplied;
  double loss = 0;      // lm_loss + aux_loss (+ mtp_loss), the step's mean over micro-batches
  double lm_loss = 0;   // cross-entropy part
  double aux_loss = 0;  // sum over layers of the load-balancing loss
  // The MTP term (--mtp-num-layers: the scaling factor x the modules' mean loss), in loss too;
  // -1: none (left out of the log line, JSON and TensorBoard).
  double mtp_loss = -1;
  double lr = 0;  // learning rate used by this step
  // --decoupled-lr: the embedding's and output layer's rate of this step; -1: not given (left out
  // of the log line, JSON and TensorBoard).
  double decoupled_lr = -1;
  double grad_norm = 0;                        // global gradient norm before clipping
  double step_seconds = 0;                     // wall time of this step
  double tokens_per_s = 0;                     // tokens of this step / step_seconds
  std::vector<int64_t> mem_in_use_bytes;       // allocator bytes in use after the step
  std::vector<int64_t> mem_peak_bytes;         // allocator peak during the step
  std::vector<int64_t> activation_peak_bytes;  // peak of activations and saved tensors
  // The same two peaks as `tandem plan` predicted them before the first step, per rank (empty:
  // not planned; plan_training_run in plan_command.h).
  std::vector<int64_t> planned_peak_bytes, planned_activation_peak_bytes;
  // --offload-activations: the host bytes holding offloaded activations at their peak, measured
  // and planned, per rank (empty: no offload).
  std::vector<int64_t> offload_host_peak_bytes, planned_offload_host_peak_bytes;
  // Multi-rank only (negative: not measured): seconds rank 0's all-to-all tasks ran during the
  // step, and of those the seconds its compute stream stood waiting for them (exposed).
  double comm_seconds = -1;
  double exposed_comm_seconds = -1;
  // The same two figures of every rank, in rank order (rank 0's first).
  std::vector<double> comm_seconds_by_rank, exposed_comm_seconds_by_rank;
  // GPU runs with EP > 1 (empty: not measured): of each rank's exposed seconds, those spent
  // waiting for a later rank of its expert group (Note [Waiting for the slowest expert rank]
  // in runtime/alltoall_wait.h); the rest is transfer that overlap did not hide.
  std::vector<double> exposed_waiting_seconds_by_rank;
  // GPU runs under mpirun (negative: not measured): rank 0's forward-backward time by CUDA
  // events, from the step's start to the end of its last action (no gradient reduction or
  // optimizer), the figure `tandem plan` predicts as its step time.
  double forward_backward_seconds = -1;
  // MoE with EP > 1 (negative: not measured): rank 0's expert-parallel group, its most loaded
  // rank's routed rows over the group's mean, over the step and per micro-batch and layer
  // (median and largest; schedule::expert_rows_spread).
  double expert_rows_step = -1, expert_rows_microbatch_median = -1, expert_rows_microbatch_max = -1;
  // With --moe-router-enable-expert-bias (negative: none): the step's most loaded expert's rows
  // over the mean, the largest over rank 0's MoE layers (runtime::StepResult's).
  double expert_load_max_over_mean = -1;
  // After a validation at this step (Note [Validation data] in cli/validation.h): the mean LM
  // loss of its batches; its perplexity is exp of it. Empty: no validation at this step.
  std::optional<double> valid_loss;
  // --log-params-norm and --log-num-zeros-in-grad (Megatron-LM's; runtime/step_figures.h):
  // the weights' L2 norm after the update and the step's gradient elements that are zero
  // (negative: not asked for).
  double params_norm = -1;
  int64_t num_zeros_in_grad = -1;
  // Something the step did besides training, printed on a line of its own and kept in the JSON
  // line as "note" (e.g. experts re-placed, Note [Rebalancing experts]); empty: nothing.
  std::string note;
};

enum class Verbosity : uint8_t { kNormal, kQuiet };       // kQuiet: no bar, no log lines
enum class BarMode : uint8_t { kAuto, kAlways, kNever };  // kAuto: when stderr is a terminal

struct ReporterConfig {
  int64_t total_iters = 1;           // --train-iters (the last iteration the run reaches)
  int64_t log_interval = 10;         // --log-interval
  std::string log_json_path = {};    // --log-json; empty: no JSON lines
  std::string tensorboard_dir = {};  // --tensorboard-dir; empty: no event files
  // --log-timers-to-tensorboard: the step's seconds (and forward-backward's, where measured)
  bool timers_to_tensorboard = false;
  Verbosity verbosity = Verbosity::kNormal;
  BarMode bar = BarMode::kAuto;
};

class ProgressReporter {
 public:
  // Log lines go to `log_out`, the bar to `bar_out`; both must outlive the reporter.
  ProgressReporter(ReporterConfig config, std::ostream& log_out, std::ostream& bar_out);
  // Log lines to std::cout, the bar to std::cerr.
  explicit ProgressReporter(ReporterConfig config);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Creates (truncates) the --log-json file and creates the --tensorboard-dir event file; a
  // no-op without them. The trainer calls it once training starts, after every check, so bad
  // input never creates either. Throws tandem::Error naming the path and the OS reason.
  void open();
  // One step: redraws the bar, prints a log line on the interval, at a validation and at the
  // last step, appends a JSON line and flushes it (so a crash keeps every finished step), and
  // adds the step's scalars to the event file (tensorboard_scalars), flushed with each log line.
  void report(const IterationRecord& record);
  // After the last step: the test data's mean LM loss (Note [Validation data] in
  // cli/validation.h) as a log line, a JSON line {"iter", "test_loss", "test_ppl"} and the
  // scalars test/loss and test/ppl.
  void report_test(int64_t iteration, double loss);
  // Ends the bar's line so that later output starts on a fresh line. Idempotent.
  void finish();
  // After the last step of a run that completed: ends the bar and prints format_summary of the
  // steps reported (nothing when quiet or when no step was reported).
  void print_summary();

  bool bar_enabled() const { return bar_enabled_; }

 private:
  void draw_bar(const IterationRecord& record, bool force);
  void clear_bar();
  double eta_seconds(const IterationRecord& record) const;

  using Clock = std::chrono::steady_clock;
  ReporterConfig config_;
  std::ostream& log_out_;
  std::ostream& bar_out_;
  bool bar_enabled_ = false;
  bool bar_visible_ = false;
  std::unique_ptr<FILE, int (*)(FILE*)> json_;
  std::unique_ptr<io::TensorBoardWriter> tensorboard_;
  Clock::time_point first_time_{};
  int64_t first_iter_ = -1;  // iteration of the first report, the base of the ETA
  Clock::time_point last_draw_{};
  std::vector<IterationRecord> steps_;  // for the summary (vectors of a few numbers each)
};

// Human units with one decimal, binary prefixes: "512 B", "12.3 MiB".
std::string format_bytes(int64_t bytes);
// v with `decimals` digits after the point ("1.018").
std::string format_fixed(double v, int decimals);
// "42s", "3m05s", "2h03m"; "--" for an unknown (negative or non-finite) duration.
std::string format_duration(double seconds);
// The --log-interval line (no newline). Memory is the maximum over ranks.
std::string format_log_line(const IterationRecord& record, int64_t total_iters);
// The run's last line: steps, wall time, the median tokens/s of the steps after the first (it
// carries the warm-up: first allocations, product tuning), the peak memory over steps and
// ranks, and with an all-to-all each rank's exposed share of it over those steps.
// "done: 7 steps in 1.2s | 480.2k tok/s (median of steps 2-7) | peak 8.4 GiB | a2a exposed
// 9.3%, 10.7% (steps 2-7)". Empty for no steps.
// With planned peaks in the records: "| peak 8.4 GiB (planned 8.3 GiB)".
std::string format_summary(const std::vector<IterationRecord>& steps);
// The bar (no \r): "[#####.....]  45/300  15% loss 2.345 | 12.3k tok/s | ETA 1m05s".
std::string format_bar(const IterationRecord& record, int64_t total_iters, double eta_seconds);
// One JSON object (no newline) with the keys iter, skipped (true or false), loss, lm_loss,
// aux_loss, lr, grad_norm, step_seconds, tokens_per_s, mem_in_use_bytes, mem_peak_bytes,
// activation_peak_bytes, expert_load_max_over_mean with an expert bias, mtp_loss with MTP
// modules, and valid_loss and valid_ppl after a validation. Non-finite numbers become null.
std::string to_json_line(const IterationRecord& record);
// The step's scalars for TensorBoard, by tag: train/loss, train/lm_loss, train/aux_loss,
// train/lr, train/grad_norm, train/tokens_per_s; memory/in_use_bytes and memory/peak_bytes (the
// largest over ranks); with an all-to-all, alltoall/busy_s and alltoall/exposed_s (the largest
// over ranks); with an expert bias, moe/expert_load_max_over_mean; with MTP modules,
// train/mtp_loss; after a validation,
// valid/loss and valid/ppl.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const IterationRecord& record);

}  // namespace tandem::cli
