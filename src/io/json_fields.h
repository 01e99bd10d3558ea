// Typed reading of a JSON object's keys, for every JSON file tandem reads (a checkpoint's
// trainer_state.json and its indexes, a Hugging Face config.json): every error names where the
// object is and the key (with its parent's prefix, e.g. rope_parameters.factor), and what was
// expected; a key may be required or have a fallback for when it is absent (or null); every key
// read is remembered, so a reader can refuse the keys it did not read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"

namespace tandem::io {

class JsonFields {
 public:
  using Json = nlohmann::json;

  // `where` begins every message ("checkpoint file 'x': "); `prefix` goes before each key named.
  JsonFields(const Json& j, std::string where, std::string prefix = {})
      : j_(j), where_(std::move(where)), prefix_(std::move(prefix)) {
    TANDEM_CHECK(j_.is_object(), where_, "is ", j_.is_null() ? "missing" : j_.dump(),
                 ", expected a JSON object");
  }

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error(detail::concat(where_, "key '", prefix_, key, "' ", why));
  }
  // Whether the key is there and not null; marks it read.
  bool has(const std::string& key) const {
    used_.insert(key);
    return j_.contains(key) && !j_[key].is_null();
  }
  // Marks a key as read without reading it (one that has no effect once another is known).
  void mark(const std::string& key) const { used_.insert(key); }
  bool was_read(const std::string& key) const { return used_.count(key) > 0; }
  const Json& json() const { return j_; }
  const std::string& where() const { return where_; }

  const Json& get(const std::string& key) const {
    mark(key);
    if (!j_.contains(key)) fail(key, "is missing");
    return j_[key];
  }
  int64_t integer(const std::string& key, std::optional<int64_t> fallback = {}) const {
    if (!present(key, fallback.has_value())) return *fallback;
    const Json& v = j_[key];
    const bool fits = v.is_number_integer() &&
                      (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
    if (!fits) fail(key, "is " + v.dump() + ", expected an integer");
    return v.get<int64_t>();
  }
  uint64_t unsigned_integer(const std::string& key) const {
    present(key, false);
    const Json& v = j_[key];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      fail(key, "is " + v.dump() + ", expected an integer >= 0");
    }
    return v.get<uint64_t>();
  }
  double number(const std::string& key, std::optional<double> fallback = {}) const {
    if (!present(key, fallback.has_value())) return *fallback;
    const Json& v = j_[key];
    if (!v.is_number()) fail(key, "is " + v.dump() + ", expected a number");
    return v.get<double>();
  }
  bool boolean(const std::string& key, std::optional<bool> fallback = {}) const {
    if (!present(key, fallback.has_value())) return *fallback;
    const Json& v = j_[key];
    if (!v.is_boolean()) fail(key, "is " + v.dump() + ", expected true or false");
    return v.get<bool>();
  }
  std::string string(const std::string& key, std::optional<std::string> fallback = {}) const {
    if (!present(key, fallback.has_value())) return *fallback;
    const Json& v = j_[key];
    if (!v.is_string()) fail(key, "is " + v.dump() + ", expected a string");
    return v.get<std::string>();
  }

 private:
  // Whether to read the key's value: true when it is there; false when it is absent (or null)
  // and there is a fallback; fails naming the key when it is absent and required.
  bool present(const std::string& key, bool has_fallback) const {
    if (has(key)) return true;
    if (!has_fallback) fail(key, "is missing");
    return false;
  }

  const Json& j_;
  std::string where_, prefix_;
  mutable std::set<std::string> used_;
};

}  // namespace tandem::io
