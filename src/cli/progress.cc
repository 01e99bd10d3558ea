// Progress bar, log lines and the --log-json writer. The bar owns the terminal line it draws on:
// it is erased before a log line is printed and redrawn after, so the two never interleave.
#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem::cli {
std::string format_fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

namespace {

constexpr int kBarWidth = 24;
constexpr auto kMinRedraw = std::chrono::milliseconds(50);

std::string format_sci(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

// 12345 -> "12.3k", for tokens per second.
std::string format_rate(double v) {
  if (!std::isfinite(v)) return "--";
  if (v >= 1e6) return format_fixed(v / 1e6, 1) + "M";
  if (v >= 1e3) return format_fixed(v / 1e3, 1) + "k";
  return format_fixed(v, 0);
}

int64_t max_of(const std::vector<int64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// One rank: a number; several: a list; none: null.
nlohmann::json per_rank(const std::vector<int64_t>& v) {
  if (v.empty()) return nullptr;
  if (v.size() == 1) return v[0];
  return v;
}

nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nullptr; }

}  // namespace

std::string format_bytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) v /= 1024, ++unit;
  return format_fixed(v, 1) + " " + kUnits[unit];
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s / 60) % 60));
  }
  return buf;
}

namespace {

// Rank p's exposed all-to-all seconds (0 when the record has none for it).
double exposed_at(const IterationRecord& r, size_t p) {
  return p < r.exposed_comm_seconds_by_rank.size() ? r.exposed_comm_seconds_by_rank[p] : 0.0;
}

// `exposed` as a percentage of `busy` all-to-all seconds (0 without any).
double percent_of(double exposed, double busy) { return busy > 0 ? 100 * exposed / busy : 0.0; }

// "9.3% (5.0/53.8 ms, 1.5 waiting)": rank p's exposed all-to-all as a fraction of its
// all-to-all time, the two in ms, and the waiting part when measured.
std::string exposed_of_rank(const IterationRecord& r, size_t p) {
  const double busy = r.comm_seconds_by_rank[p], exposed = exposed_at(r, p);
  std::string s = format_fixed(percent_of(exposed, busy), 1) + "% (" +
                  format_fixed(1e3 * exposed, 1) + "/" + format_fixed(1e3 * busy, 1) + " ms";
  if (p < r.exposed_waiting_seconds_by_rank.size()) {
    s += ", " + format_fixed(1e3 * r.exposed_waiting_seconds_by_rank[p], 1) + " waiting";
  }
  return s + ")";
}

// " | a2a exposed ..." for runs with an all-to-all: every rank's figure up to 4 ranks, else the
// rank with the largest fraction.
std::string exposed_alltoall(const IterationRecord& r) {
  const std::vector<double>& busy = r.comm_seconds_by_rank;
  if (std::none_of(busy.begin(), busy.end(), [](double s) { return s > 0; })) return "";
  std::string s = " | a2a exposed ";
  if (busy.size() <= 4) {
    for (size_t p = 0; p < busy.size(); ++p) s += (p ? ", " : "") + exposed_of_rank(r, p);
    return s;
  }
  size_t worst = 0;
  double worst_fraction = -1;
  for (size_t p = 0; p < busy.size(); ++p) {
    const double fraction = percent_of(exposed_at(r, p), busy[p]);
    if (fraction > worst_fraction) worst = p, worst_fraction = fraction;
  }
  return s + "max " + exposed_of_rank(r, worst) + " on rank " + std::to_string(worst);
}

}  // namespace

std::string format_log_line(const IterationRecord& r, int64_t total_iters) {
  const int width = static_cast<int>(std::to_string(total_iters).size());
  char iter[64];
  std::snprintf(iter, sizeof iter, "iter %*lld/%lld", width, static_cast<long long>(r.iter),
                static_cast<long long>(total_iters));
  std::string line = std::string(iter) + " | loss " + format_fixed(r.loss, 4) + " | lm loss " +
                     format_fixed(r.lm_loss, 4) + " | aux loss " + format_fixed(r.aux_loss, 4) +
                     (r.mtp_loss >= 0 ? " | mtp loss " + format_fixed(r.mtp_loss, 4) : "") +
                     " | lr " + format_sci(r.lr) +
                     (r.decoupled_lr >= 0 ? " | decoupled lr " + format_sci(r.decoupled_lr) : "") +
                     " | grad norm " + format_fixed(r.grad_norm, 3) + " | " +
                     format_rate(r.tokens_per_s) + " tok/s";
  if (r.params_norm >= 0) line += " | params norm " + format_fixed(r.params_norm, 3);
  if (r.num_zeros_in_grad >= 0) {
    line += " | zeros in grad " + std::to_string(r.num_zeros_in_grad);
  }
  if (!r.mem_in_use_bytes.empty() || !r.mem_peak_bytes.empty()) {
    line += " | mem " + format_bytes(max_of(r.mem_in_use_bytes)) + ", peak " +
            format_bytes(max_of(r.mem_peak_bytes));
    const size_t ranks = std::max(r.mem_in_use_bytes.size(), r.mem_peak_bytes.size());
    if (ranks > 1) line += " (max of " + std::to_string(ranks) + " ranks)";
  }
  line += exposed_alltoall(r);
  if (r.expert_load_max_over_mean >= 0) {
    line += " | expert load max/mean " + format_fixed(r.expert_load_max_over_mean, 2);
  }
  if (r.valid_loss) {
    line += " | valid loss " + format_fixed(*r.valid_loss, 4) + " | valid ppl " +
            format_fixed(std::exp(*r.valid_loss), 3);
  }
  if (r.status == UpdateStatus::kSkipped) line += " | skipped: loss or gradients not finite";
  return line;
}

std::string format_summary(const std::vector<IterationRecord>& steps) {
  if (steps.empty()) return "";
  double seconds = 0;
  int64_t peak = 0;
  for (const IterationRecord& r : steps) {
    seconds += r.step_seconds;
    peak = std::max(peak, max_of(r.mem_peak_bytes));
  }
  // The steps after the first, unless there is only one.
  const size_t from = steps.size() > 1 ? 1 : 0;
  std::vector<double> rates;
  for (size_t i = from; i < steps.size(); ++i) rates.push_back(steps[i].tokens_per_s);
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  const double median = n % 2 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
  const std::string range = from == 0 ? "step " + std::to_string(steps[0].iter)
                                      : "steps " + std::to_string(steps[from].iter) + "-" +
                                            std::to_string(steps.back().iter);
  std::string line = "done: " + std::to_string(steps.size()) + " step" +
                     (steps.size() == 1 ? "" : "s") + " in " +
                     (seconds < 1    ? format_fixed(1e3 * seconds, 0) + " ms"
                      : seconds < 60 ? format_fixed(seconds, 1) + "s"
                                     : format_duration(seconds)) +
                     " | " + format_rate(median) + " tok/s (median of " + range + ")";
  if (peak > 0) line += " | peak " + format_bytes(peak);
  if (peak > 0 && !steps.back().planned_peak_bytes.empty()) {
    // The plan is of a steady step; the first may hold more (a GPU's one-time tuning buffers).
    int64_t later = 0;
    for (size_t i = from; i < steps.size(); ++i) {
      later = std::max(later, max_of(steps[i].mem_peak_bytes));
    }
    line += " (";
    if (later != peak) line += range + ": " + format_bytes(later) + ", ";
    line += "planned " + format_bytes(max_of(steps.back().planned_peak_bytes));
    // Each rank's last step against its own plan (docs/memory.md, "Planned and measured").
    if (steps.back().mem_peak_bytes == steps.back().planned_peak_bytes) {
      line += ", the same to the byte";
    }
    line += ")";
  }
  const size_t ranks = steps.back().comm_seconds_by_rank.size();
  std::vector<double> busy(ranks, 0.0), exposed(ranks, 0.0);
  for (size_t i = from; i < steps.size(); ++i) {
    const IterationRecord& r = steps[i];
    for (size_t p = 0; p < ranks && p < r.comm_seconds_by_rank.size(); ++p) {
      busy[p] += r.comm_seconds_by_rank[p];
      exposed[p] += exposed_at(r, p);
    }
  }
  if (std::any_of(busy.begin(), busy.end(), [](double b) { return b > 0; })) {
    line += " | a2a exposed ";
    for (size_t p = 0; p < ranks; ++p) {
      line += (p ? ", " : "") + format_fixed(percent_of(exposed[p], busy[p]), 1) + "%";
    }
    line += " (" + range + ")";
  }
  return line;
}

std::string format_bar(const IterationRecord& r, int64_t total_iters, double eta_seconds) {
  const double fraction =
      total_iters > 0 ? std::clamp(static_cast<double>(r.iter) / total_iters, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string bar = "[" + std::string(filled, '#') + std::string(kBarWidth - filled, '.') + "] ";
  char count[96];
  std::snprintf(count, sizeof count, "%lld/%lld %3d%%", static_cast<long long>(r.iter),
                static_cast<long long>(total_iters), static_cast<int>(fraction * 100));
  return bar + count + " loss " + format_fixed(r.loss, 4) + " | " + format_rate(r.tokens_per_s) +
         " tok/s | ETA " + format_duration(eta_seconds);
}

std::string to_json_line(const IterationRecord& r) {
  nlohmann::json j = {
      {"iter", r.iter},
      {"skipped", r.status == UpdateStatus::kSkipped},
      {"loss", number(r.loss)},
      {"lm_loss", number(r.lm_loss)},
      {"aux_loss", number(r.aux_loss)},
      {"lr", number(r.lr)},
      {"grad_norm", number(r.grad_norm)},
      {"step_seconds", number(r.step_seconds)},
      {"tokens_per_s", number(r.tokens_per_s)},
      {"mem_in_use_bytes", per_rank(r.mem_in_use_bytes)},
      {"mem_peak_bytes", per_rank(r.mem_peak_bytes)},
      {"activation_peak_bytes", per_rank(r.activation_peak_bytes)},
  };
  if (!r.planned_peak_bytes.empty()) {
    j["planned_peak_bytes"] = per_rank(r.planned_peak_bytes);
    j["planned_activation_peak_bytes"] = per_rank(r.planned_activation_peak_bytes);
  }
  if (!r.offload_host_peak_bytes.empty()) {
    j["offload_host_peak_bytes"] = per_rank(r.offload_host_peak_bytes);
  }
  if (!r.planned_offload_host_peak_bytes.empty()) {
    j["planned_offload_host_peak_bytes"] = per_rank(r.planned_offload_host_peak_bytes);
  }
  if (!r.note.empty()) j["note"] = r.note;
  if (r.params_norm >= 0) j["params_norm"] = number(r.params_norm);
  if (r.num_zeros_in_grad >= 0) j["num_zeros_in_grad"] = r.num_zeros_in_grad;
  if (r.valid_loss) {
    j["valid_loss"] = number(*r.valid_loss);
    j["valid_ppl"] = number(std::exp(*r.valid_loss));
  }
  if (r.expert_load_max_over_mean >= 0) {
    j["expert_load_max_over_mean"] = number(r.expert_load_max_over_mean);
  }
  if (r.expert_rows_step >= 0) {
    j["expert_rows_max_over_mean"] = {
        {"step", number(r.expert_rows_step)},
        {"microbatch_median", number(r.expert_rows_microbatch_median)},
        {"microbatch_max", number(r.expert_rows_microbatch_max)}};
  }
  if (r.comm_seconds < 0) return j.dump();
  j["alltoall_s"] = number(r.comm_seconds);
  j["exposed_alltoall_s"] = number(r.exposed_comm_seconds);
  if (!r.comm_seconds_by_rank.empty()) {
    nlohmann::json busy = nlohmann::json::array(), exposed = nlohmann::json::array();
    for (double v : r.comm_seconds_by_rank) busy.push_back(number(v));
    for (double v : r.exposed_comm_seconds_by_rank) exposed.push_back(number(v));
    j["alltoall_s_by_rank"] = std::move(busy);
    j["exposed_alltoall_s_by_rank"] = std::move(exposed);
  }
  if (!r.exposed_waiting_seconds_by_rank.empty()) {
    nlohmann::json waiting = nlohmann::json::array();
    for (double v : r.exposed_waiting_seconds_by_rank) waiting.push_back(number(v));
    j["exposed_alltoall_waiting_s_by_rank"] = std::move(waiting);
  }
  if (r.forward_backward_seconds >= 0) {
    j["forward_backward_s"] = number(r.forward_backward_seconds);
  }
  if (r.mtp_loss >= 0) j["mtp_loss"] = number(r.mtp_loss);
  if (r.decoupled_lr >= 0) j["decoupled_lr"] = number(r.decoupled_lr);
  return j.dump();
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const IterationRecord& r) {
  std::vector<std::pair<std::string, double>> out = {
      {"train/loss", r.loss},           {"train/lm_loss", r.lm_loss},
      {"train/aux_loss", r.aux_loss},   {"train/lr", r.lr},
      {"train/grad_norm", r.grad_norm}, {"train/tokens_per_s", r.tokens_per_s}};
  if (r.mtp_loss >= 0) out.emplace_back("train/mtp_loss", r.mtp_loss);
  if (r.decoupled_lr >= 0) out.emplace_back("train/decoupled_lr", r.decoupled_lr);
  if (!r.mem_in_use_bytes.empty()) {
    out.emplace_back("memory/in_use_bytes", static_cast<double>(max_of(r.mem_in_use_bytes)));
  }
  if (!r.mem_peak_bytes.empty()) {
    out.emplace_back("memory/peak_bytes", static_cast<double>(max_of(r.mem_peak_bytes)));
  }
  const std::vector<double>& busy = r.comm_seconds_by_rank;
  if (std::any_of(busy.begin(), busy.end(), [](double b) { return b > 0; })) {
    out.emplace_back("alltoall/busy_s", *std::max_element(busy.begin(), busy.end()));
    double exposed = 0;
    for (size_t p = 0; p < busy.size(); ++p) exposed = std::max(exposed, exposed_at(r, p));
    out.emplace_back("alltoall/exposed_s", exposed);
  }
  if (r.expert_load_max_over_mean >= 0) {
    out.emplace_back("moe/expert_load_max_over_mean", r.expert_load_max_over_mean);
  }
  if (r.params_norm >= 0) out.emplace_back("train/params_norm", r.params_norm);
  if (r.num_zeros_in_grad >= 0) {
    out.emplace_back("train/num_zeros_in_grad", static_cast<double>(r.num_zeros_in_grad));
  }
  if (r.valid_loss) {
    out.emplace_back("valid/loss", *r.valid_loss);
    out.emplace_back("valid/ppl", std::exp(*r.valid_loss));
  }
  return out;
}

ProgressReporter::ProgressReporter(ReporterConfig config, std::ostream& log_out,
                                   std::ostream& bar_out)
    : config_(std::move(config)),
      log_out_(log_out),
      bar_out_(bar_out),
      json_(nullptr, &std::fclose) {
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  bar_enabled_ = config_.verbosity == Verbosity::kNormal &&
                 (config_.bar == BarMode::kAlways || (config_.bar == BarMode::kAuto && terminal));
}

ProgressReporter::ProgressReporter(ReporterConfig config)
    : ProgressReporter(std::move(config), std::cout, std::cerr) {}

ProgressReporter::~ProgressReporter() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; a failed final newline is harmless
  }
}

void ProgressReporter::open() {
  if (!config_.tensorboard_dir.empty() && !tensorboard_) {
    tensorboard_ = std::make_unique<io::TensorBoardWriter>(config_.tensorboard_dir);
  }
  if (config_.log_json_path.empty() || json_) return;
  json_.reset(std::fopen(config_.log_json_path.c_str(), "w"));
  TANDEM_CHECK(json_ != nullptr, "--log-json ", config_.log_json_path, ": cannot create it (",
               std::strerror(errno), ")");
}

void ProgressReporter::report(const IterationRecord& record) {
  TANDEM_ASSERT(config_.log_json_path.empty() || json_ != nullptr,
                "ProgressReporter::open() must run before the first report()");
  if (first_iter_ < 0) {
    first_iter_ = record.iter;
    first_time_ = Clock::now();
  }
  if (json_) {
    const std::string line = to_json_line(record) + "\n";
    const bool written =
        std::fputs(line.c_str(), json_.get()) >= 0 && std::fflush(json_.get()) == 0;
    TANDEM_CHECK(written, "--log-json ", config_.log_json_path, ": cannot write it (",
                 std::strerror(errno), ")");
  }
  steps_.push_back(record);
  const bool last = record.iter >= config_.total_iters;
  const bool log = last || record.valid_loss.has_value() ||
                   (config_.log_interval > 0 && record.iter % config_.log_interval == 0);
  if (tensorboard_) {
    for (const auto& [tag, value] : tensorboard_scalars(record)) {
      tensorboard_->add_scalar(tag, value, record.iter);
    }
    if (config_.timers_to_tensorboard) {
      tensorboard_->add_scalar("timers/step_s", record.step_seconds, record.iter);
      if (record.forward_backward_seconds >= 0) {
        tensorboard_->add_scalar("timers/forward_backward_s", record.forward_backward_seconds,
                                 record.iter);
      }
    }
    if (log) tensorboard_->flush();
  }
  if (config_.verbosity == Verbosity::kQuiet) return;
  if (!record.note.empty()) {
    clear_bar();
    log_out_ << "iter " << record.iter << ": " << record.note << std::endl;
  }
  if (log) {
    clear_bar();
    log_out_ << format_log_line(record, config_.total_iters) << std::endl;
  }
  draw_bar(record, log || last);
}

void ProgressReporter::report_test(int64_t iteration, double loss) {
  finish();
  if (json_) {
    const nlohmann::json j = {
        {"iter", iteration}, {"test_loss", number(loss)}, {"test_ppl", number(std::exp(loss))}};
    const std::string line = j.dump() + "\n";
    const bool written =
        std::fputs(line.c_str(), json_.get()) >= 0 && std::fflush(json_.get()) == 0;
    TANDEM_CHECK(written, "--log-json ", config_.log_json_path, ": cannot write it (",
                 std::strerror(errno), ")");
  }
  if (tensorboard_) {
    tensorboard_->add_scalar("test/loss", loss, iteration);
    tensorboard_->add_scalar("test/ppl", std::exp(loss), iteration);
    tensorboard_->flush();
  }
  if (config_.verbosity == Verbosity::kQuiet) return;
  log_out_ << "iter " << iteration << " | test loss " << format_fixed(loss, 4) << " | test ppl "
           << format_fixed(std::exp(loss), 3) << std::endl;
}

void ProgressReporter::finish() {
  if (bar_visible_) {
    bar_out_ << '\n' << std::flush;
    bar_visible_ = false;
  }
}

void ProgressReporter::print_summary() {
  finish();
  if (config_.verbosity == Verbosity::kQuiet || steps_.empty()) return;
  log_out_ << "tandem train: " << format_summary(steps_) << std::endl;
}

double ProgressReporter::eta_seconds(const IterationRecord& record) const {
  const int64_t left = config_.total_iters - record.iter;
  if (left <= 0) return 0;
  const int64_t done = record.iter - first_iter_;
  if (done > 0) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - first_time_).count();
    return elapsed / static_cast<double>(done) * static_cast<double>(left);
  }
  return record.step_seconds > 0 ? record.step_seconds * static_cast<double>(left) : -1;
}

void ProgressReporter::draw_bar(const IterationRecord& record, bool force) {
  if (!bar_enabled_) return;
  const Clock::time_point now = Clock::now();
  if (!force && bar_visible_ && now - last_draw_ < kMinRedraw) return;
  last_draw_ = now;
  // \x1b[2K erases the old bar, which may have been longer than the new one.
  bar_out_ << "\r\x1b[2K" << format_bar(record, config_.total_iters, eta_seconds(record))
           << std::flush;
  bar_visible_ = true;
}

void ProgressReporter::clear_bar() {
  if (!bar_visible_) return;
  bar_out_ << "\r\x1b[2K" << std::flush;
  bar_visible_ = false;
}

}  // namespace tandem::cli
