// Text form of actions and schedules (PyTorch pipelining notation); parse(print(x)) == x.
#include "schedule/action.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <sstream>

#include "core/error.h"
#include "core/text_file.h"

namespace tandem::schedule {
namespace {

constexpr std::array<std::string_view, kNumActionKinds> kKindNames = {
    "F", "B", "I", "W", "FB", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "FF"};

constexpr std::string_view kAcceptedForms =
    "expected <stage><F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B><micro-batch> such as 0F3, 2SEND_F1, "
    "or a pair (<stage>F<mb>;<stage>B|I|F<mb>) such as (0F4;1B2) or (0F0;0F1)";

bool parse_int(std::string_view digits, int32_t& out) {
  if (digits.empty() || digits.size() > 9) return false;
  int32_t v = 0;
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

// `<stage><KIND><mb>` without parentheses; returns false on anything else.
bool parse_single(std::string_view text, Action& out) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  int32_t stage = 0;
  if (!parse_int(text.substr(0, i), stage)) return false;
  size_t j = i;
  while (j < text.size() && !std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  const std::string_view kind = text.substr(i, j - i);
  int32_t mb = 0;
  if (!parse_int(text.substr(j), mb)) return false;
  for (int k = 0; k < kNumActionKinds; ++k) {
    const auto ak = static_cast<ActionKind>(k);
    if (is_pair(ak) || kKindNames[k] != kind) continue;
    out = Action::make(ak, stage, mb);
    return true;
  }
  return false;
}

bool parse_combined(std::string_view text, Action& out) {
  constexpr std::string_view kSuffix = "OVERLAP_F_B";
  if (text.size() > kSuffix.size() && text.substr(text.size() - kSuffix.size()) == kSuffix) {
    text.remove_suffix(kSuffix.size());
  }
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') return false;
  text = text.substr(1, text.size() - 2);
  const size_t semi = text.find(';');
  if (semi == std::string_view::npos) return false;
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
  };
  Action a, b;
  if (!parse_single(trim(text.substr(0, semi)), a) || !parse_single(trim(text.substr(semi + 1)), b))
    return false;
  if (a.kind == ActionKind::kForward && b.kind == ActionKind::kForward) {
    out = Action::paired_forwards(a.stage, a.microbatch, b.stage, b.microbatch);
    return true;
  }
  if (b.kind == ActionKind::kForward) std::swap(a, b);  // accept (1B2;0F4) as well
  if (a.kind != ActionKind::kForward || !is_backward_of_input(b.kind)) return false;
  out = Action::combined(a.stage, a.microbatch, b.kind, b.stage, b.microbatch);
  return true;
}

// Splits a rank's action text at spaces and commas, keeping `( ... )` groups whole.
std::vector<std::string_view> split_actions(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',') {
      ++i;
      continue;
    }
    size_t j = i;
    if (c == '(') {
      j = text.find(')', i);
      j = j == std::string_view::npos ? text.size() : j + 1;
    }
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j])) && text[j] != ',')
      ++j;
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

// Fills num_stages, num_microbatches and stage_rank from the compute actions.
void infer_layout(Schedule& s, std::string_view source) {
  int32_t max_stage = -1, max_mb = -1;
  for (const auto& list : s.ranks) {
    for (const Action& a : list) {
      for (const Action& h : halves(a)) {
        max_stage = std::max(max_stage, h.stage);
        max_mb = std::max(max_mb, h.microbatch);
      }
    }
  }
  TANDEM_CHECK(max_stage >= 0, source, ": the schedule has no actions");
  s.num_stages = max_stage + 1;
  s.num_microbatches = max_mb + 1;
  s.stage_rank.assign(s.num_stages, -1);
  for (int32_t r = 0; r < s.num_ranks; ++r) {
    for (const Action& a : s.ranks[r]) {
      if (!is_compute(a.kind)) continue;
      for (const Action& h : halves(a)) {
        if (s.stage_rank[h.stage] < 0) s.stage_rank[h.stage] = r;
      }
    }
  }
  for (int32_t st = 0; st < s.num_stages; ++st) {
    TANDEM_CHECK(s.stage_rank[st] >= 0, source, ": stage ", st,
                 " has no forward or backward on any rank; stages must be numbered 0..",
                 s.num_stages - 1, " without gaps and each computed by one rank");
  }
}

}  // namespace

std::string_view action_kind_name(ActionKind kind) { return kKindNames[static_cast<int>(kind)]; }

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight || is_pair(kind);
}
bool is_communication(ActionKind kind) { return !is_compute(kind); }
bool is_pair(ActionKind kind) {
  return kind == ActionKind::kForwardBackward || kind == ActionKind::kForwardForward;
}
bool is_backward_of_input(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput;
}

Action Action::make(ActionKind kind, int32_t stage, int32_t microbatch) {
  Action a;
  a.kind = kind;
  a.stage = stage;
  a.microbatch = microbatch;
  return a;
}

Action Action::combined(int32_t f_stage, int32_t f_mb, ActionKind second_kind, int32_t b_stage,
                        int32_t b_mb) {
  Action a = make(ActionKind::kForwardBackward, f_stage, f_mb);
  a.second_kind = second_kind;
  a.second_stage = b_stage;
  a.second_microbatch = b_mb;
  return a;
}

Action Action::paired_forwards(int32_t stage, int32_t mb, int32_t second_stage, int32_t second_mb) {
  Action a = combined(stage, mb, ActionKind::kForward, second_stage, second_mb);
  a.kind = ActionKind::kForwardForward;
  return a;
}

Action Action::first_half() const {
  return is_pair(kind) ? make(ActionKind::kForward, stage, microbatch) : *this;
}

Action Action::second_half() const {
  return is_pair(kind) ? make(second_kind, second_stage, second_microbatch) : *this;
}

std::vector<Action> halves(const Action& a) {
  if (!is_pair(a.kind)) return {a};
  return {a.first_half(), a.second_half()};
}

bool Action::operator==(const Action& o) const {
  if (kind != o.kind || stage != o.stage || microbatch != o.microbatch) return false;
  if (!is_pair(kind)) return true;
  return second_kind == o.second_kind && second_stage == o.second_stage &&
         second_microbatch == o.second_microbatch;
}

std::string to_string(const Action& a) {
  if (is_pair(a.kind)) {
    return "(" + to_string(a.first_half()) + ";" + to_string(a.second_half()) + ")";
  }
  std::string out = std::to_string(a.stage);
  out += action_kind_name(a.kind);
  out += std::to_string(a.microbatch);
  return out;
}

Action parse_action(std::string_view text) {
  Action a;
  const bool ok =
      !text.empty() && (text.front() == '(' ? parse_combined(text, a) : parse_single(text, a));
  TANDEM_CHECK(ok, "bad action '", text, "': ", kAcceptedForms);
  return a;
}

std::vector<int32_t> Schedule::stages_of_rank(int32_t rank) const {
  std::vector<int32_t> out;
  for (int32_t s = 0; s < num_stages; ++s) {
    if (stage_rank[s] == rank) out.push_back(s);
  }
  return out;
}

int64_t Schedule::num_actions() const {
  int64_t n = 0;
  for (const auto& list : ranks) n += static_cast<int64_t>(list.size());
  return n;
}

std::string format_schedule(const Schedule& s) {
  std::ostringstream out;
  out << "# tandem schedule '" << s.name << "': " << s.num_ranks << " ranks, " << s.num_stages
      << " stages, " << s.num_microbatches << " micro-batches\n";
  for (int32_t r = 0; r < s.num_ranks; ++r) {
    out << "rank " << r << ":";
    for (const Action& a : s.ranks[r]) out << ' ' << to_string(a);
    out << '\n';
  }
  return out.str();
}

Schedule parse_schedule(std::string_view text, std::string_view source) {
  Schedule s;
  s.name = std::string(source);
  std::vector<int> line_of_rank;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos)
      line = line.substr(0, hash);
    const auto words = split_actions(line);
    if (words.empty()) continue;
    int32_t rank = -1;
    const bool header = words.size() >= 2 && words[0] == "rank" && words[1].size() >= 2 &&
                        words[1].back() == ':' &&
                        parse_int(words[1].substr(0, words[1].size() - 1), rank);
    TANDEM_CHECK(header, source, ":", line_no, ": expected 'rank <R>: <actions>', got '", line,
                 "'");
    TANDEM_CHECK(rank < 100000, source, ":", line_no, ": rank ", rank, " is out of range");
    if (rank >= static_cast<int32_t>(s.ranks.size())) {
      s.ranks.resize(rank + 1);
      line_of_rank.resize(rank + 1, 0);
    }
    TANDEM_CHECK(line_of_rank[rank] == 0, source, ":", line_no, ": rank ", rank,
                 " was already listed on line ", line_of_rank[rank], "; give each rank one line");
    line_of_rank[rank] = line_no;
    for (size_t w = 2; w < words.size(); ++w) {
      try {
        s.ranks[rank].push_back(parse_action(words[w]));
      } catch (const Error& e) {
        throw Error(detail::concat(source, ":", line_no, ": rank ", rank, ": ", e.what()));
      }
    }
  }
  s.num_ranks = static_cast<int32_t>(s.ranks.size());
  TANDEM_CHECK(s.num_ranks > 0, source, ": no 'rank <R>: ...' lines found");
  for (int32_t r = 0; r < s.num_ranks; ++r) {
    TANDEM_CHECK(line_of_rank[r] != 0, source, ": rank ", r, " is missing; ranks must be 0..",
                 s.num_ranks - 1, ", one line each");
  }
  infer_layout(s, source);
  return s;
}

Schedule load_schedule_file(const std::string& path) {
  return parse_schedule(read_text_input(path, "schedule file '" + path + "'", kMaxTextInputBytes),
                        path);
}

}  // namespace tandem::schedule
