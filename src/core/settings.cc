// The settings' rows (Note [Every setting declared once]): reading, writing, checking and the JSON
// form of one value, whatever its type.
#include "core/settings.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem {
namespace {

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

constexpr EnumName<SettingGroup> kGroupTitles[] = {
    {SettingGroup::kModel, "Model"},       {SettingGroup::kTraining, "Training"},
    {SettingGroup::kParallel, "Parallel"}, {SettingGroup::kData, "Data"},
    {SettingGroup::kOutput, "Output"},     {SettingGroup::kPerformance, "Performance"},
    {SettingGroup::kPlan, "Plan"}};

const char* setting_group_title(SettingGroup g) { return name_in(kGroupTitles, g).data(); }

Settings in_group(SettingGroup group, Settings rows) {
  for (Setting& s : rows) s.group = group;
  return rows;
}

const Setting* find_setting(const Settings& table, const std::string& name) {
  for (const Setting& s : table)
    if (s.name == name) return &s;
  return nullptr;
}

SettingValue setting_value(const Setting& s) {
  return std::visit(Overloaded{[](const EnumRef& e) { return SettingValue(e.get()); },
                               [](auto* p) { return SettingValue(*p); }},
                    s.ref);
}

void store_setting(const Setting& s, const SettingValue& v) {
  std::visit(Overloaded{[&](const EnumRef& e) { e.set(std::get<std::string>(v)); },
                        [&](auto* p) { *p = std::get<std::remove_pointer_t<decltype(p)>>(v); }},
             s.ref);
}

bool is_text_setting(const Setting& s) {
  return std::holds_alternative<std::string*>(s.ref) || std::holds_alternative<EnumRef>(s.ref);
}

const std::vector<std::string>& setting_choices(const Setting& s) {
  if (const auto* e = std::get_if<EnumRef>(&s.ref)) return e->names;
  return s.choices;
}

std::string value_text(const SettingValue& v) {
  return std::visit(Overloaded{[](const std::string& s) { return s; },
                               [](bool b) { return std::string(b ? "true" : "false"); },
                               [](const StringList& l) {
                                 std::string out;
                                 for (const std::string& w : l) out += (out.empty() ? "" : " ") + w;
                                 return out;
                               },
                               [](auto x) { return detail::concat(x); }},
                    v);
}

std::string valid_text(const Setting& s) {
  const bool is_int =
      std::holds_alternative<int64_t*>(s.ref) || std::holds_alternative<uint64_t*>(s.ref);
  if (is_int || std::holds_alternative<double*>(s.ref)) {
    if (!s.choices.empty()) return "one of: " + join(s.choices);
    std::string out = is_int ? "an integer" : "a finite number";
    if (s.bound == FieldBound::kPositive) out += is_int ? " >= 1" : " > 0";
    if (s.bound == FieldBound::kNonNegative) out += " >= 0";
    if (s.most < kNoMost) {
      out += detail::concat(s.bound == FieldBound::kAny ? "" : " and", " <= ");
      out += is_int ? std::to_string(static_cast<int64_t>(s.most)) : detail::concat(s.most);
    }
    return out;
  }
  if (std::holds_alternative<bool*>(s.ref)) return "true or false";
  if (std::holds_alternative<StringList*>(s.ref)) return "one or more words";
  return setting_choices(s).empty() ? "a string" : "one of: " + join(setting_choices(s));
}

namespace {

bool within_most(const Setting& s, const SettingValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i) <= s.most;
  if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u) <= s.most;
  if (const auto* d = std::get_if<double>(&v)) return *d <= s.most;
  return true;
}

}  // namespace

std::string value_problem(const Setting& s, const SettingValue& v) {
  bool ok = true;
  if (const auto* i = std::get_if<int64_t>(&v)) {
    ok = s.bound == FieldBound::kAny || *i >= (s.bound == FieldBound::kPositive ? 1 : 0);
  } else if (const auto* d = std::get_if<double>(&v)) {
    ok = std::isfinite(*d) && (s.bound != FieldBound::kPositive || *d > 0) &&
         (s.bound != FieldBound::kNonNegative || *d >= 0);
  } else if (const auto* u = std::get_if<uint64_t>(&v)) {
    ok = s.bound != FieldBound::kPositive || *u >= 1;
  }
  const std::vector<std::string>& choices = setting_choices(s);
  if (!choices.empty()) {
    ok = ok && std::find(choices.begin(), choices.end(), value_text(v)) != choices.end();
  }
  ok = ok && within_most(s, v);
  return ok ? "" : "it must be " + valid_text(s);
}

std::string setting_json_key(const std::string& name) {
  std::string key = name;
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

std::optional<SettingValue> setting_from_json(const Setting& s, const nlohmann::json& v) {
  const bool is_int = v.is_number_integer() &&
                      (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
  using Out = std::optional<SettingValue>;
  return std::visit(
      Overloaded{[&](int64_t*) { return is_int ? Out(v.get<int64_t>()) : std::nullopt; },
                 [&](uint64_t*) {
                   const bool ok = v.is_number_unsigned() || (is_int && v.get<int64_t>() >= 0);
                   return ok ? Out(v.get<uint64_t>()) : std::nullopt;
                 },
                 [&](double*) { return v.is_number() ? Out(v.get<double>()) : std::nullopt; },
                 [&](bool*) { return v.is_boolean() ? Out(v.get<bool>()) : std::nullopt; },
                 [&](StringList*) -> Out {
                   if (v.is_string()) return StringList{v.get<std::string>()};
                   if (!v.is_array()) return std::nullopt;
                   StringList out;
                   for (const nlohmann::json& w : v) {
                     if (!w.is_string()) return std::nullopt;
                     out.push_back(w.get<std::string>());
                   }
                   return out;
                 },
                 [&](auto) { return v.is_string() ? Out(v.get<std::string>()) : std::nullopt; }},
      s.ref);
}

nlohmann::json setting_to_json(const Setting& s) {
  return std::visit([](const auto& x) { return nlohmann::json(x); }, setting_value(s));
}

}  // namespace tandem
