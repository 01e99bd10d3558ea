// Documents of a file and the ids format of the tokenizer helpers (tokenizer.h).
#include "data/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/mapped_file.h"

namespace tandem::data {

bool is_jsonl_path(const std::string& path) {
  const auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return path.size() >= n && path.compare(path.size() - n, n, suffix) == 0;
  };
  return ends_with(".jsonl") || ends_with(".json");
}

// Note [Documents of a file].
void for_each_document(const std::string& path, const std::string& json_key,
                       const std::function<void(const std::string& text, int64_t line)>& fn) {
  const MappedFile file(path);
  const char* p = reinterpret_cast<const char*>(file.data());
  const int64_t size = file.size();
  const bool jsonl = is_jsonl_path(path);
  int64_t line = 0;
  for (int64_t begin = 0; begin < size;) {
    const void* nl = std::memchr(p + begin, '\n', static_cast<size_t>(size - begin));
    const int64_t end = nl ? static_cast<const char*>(nl) - p : size;
    ++line;
    const std::string text(p + begin, static_cast<size_t>(end - begin));
    begin = end + 1;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!jsonl) {
      fn(text, line);
      continue;
    }
    const nlohmann::json record = nlohmann::json::parse(text, nullptr, false);
    TANDEM_CHECK(!record.is_discarded() && record.is_object(), path, " line ", line,
                 ": not a JSON object (a .json/.jsonl input holds one object per line, e.g. "
                 "{\"",
                 json_key, "\": \"...\"})");
    const auto it = record.find(json_key);
    TANDEM_CHECK(it != record.end() && it->is_string(), path, " line ", line,
                 ": the object has no string under the key '", json_key,
                 "' (--json-keys names the key that holds the document's text)");
    fn(it->get<std::string>(), line);
  }
}

IdsHeader parse_ids_header(const std::string& line, const std::string& source) {
  std::istringstream in(line);
  std::string word;
  IdsHeader h;
  bool has_vocab = false;
  in >> word;
  TANDEM_CHECK(word == kIdsHeader, source, ": does not start with '", kIdsHeader,
               " vocab_size=N eod_id=E' (the output of tools/hf_tokenize.py)");
  while (in >> word) {
    long long v = 0;
    if (std::sscanf(word.c_str(), "vocab_size=%lld", &v) == 1) {
      h.vocab_size = v;
      has_vocab = true;
    } else if (std::sscanf(word.c_str(), "eod_id=%lld", &v) == 1) {
      h.eod_id = v;
    }
  }
  TANDEM_CHECK(
      has_vocab && h.vocab_size >= 1 && h.vocab_size <= std::numeric_limits<int32_t>::max(), source,
      ": the header '", line, "' names no vocab_size of 1 to 2^31 - 1");
  TANDEM_CHECK(h.eod_id >= -1 && h.eod_id < h.vocab_size, source, ": the header's eod_id ",
               h.eod_id, " is outside the vocabulary [0, ", h.vocab_size, ") (-1: none)");
  return h;
}

std::vector<int32_t> parse_ids_line(const std::string& line, int64_t vocab_size,
                                    const std::string& source, int64_t line_number) {
  std::vector<int32_t> ids;
  const char* p = line.c_str();
  const char* end = p + line.size();
  while (p < end) {
    if (*p == ' ' || *p == '\t' || *p == '\r') {
      ++p;
      continue;
    }
    char* next = nullptr;
    errno = 0;
    const long long id = std::strtoll(p, &next, 10);
    TANDEM_CHECK(next != p && errno == 0 && id >= 0 && id < vocab_size, source, " line ",
                 line_number, ": '", std::string(p, std::strcspn(p, " \t\r")),
                 "' is not a token id of the vocabulary [0, ", vocab_size, ")");
    ids.push_back(static_cast<int32_t>(id));
    p = next;
  }
  return ids;
}

}  // namespace tandem::data
