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
namespace {

std::string hex_byte(char c) {
  char out[3];
  std::snprintf(out, sizeof out, "%02x", static_cast<unsigned char>(c));
  return out;
}

}  // namespace

bool is_jsonl_path(const std::string& path) {
  const auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return path.size() >= n && path.compare(path.size() - n, n, suffix) == 0;
  };
  return ends_with(".jsonl") || ends_with(".json");
}

int64_t invalid_utf8_at(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto n = static_cast<int64_t>(text.size());
  for (int64_t i = 0; i < n;) {
    const unsigned char c = p[i];
    // The sequence's length and its second byte's range (Unicode's table 3-7: no overlong forms,
    // no surrogates, nothing past U+10FFFF); continuation bytes are 0x80..0xBF.
    int64_t len = 1;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      lo = c == 0xE0 ? 0xA0 : 0x80;
      hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      lo = c == 0xF0 ? 0x90 : 0x80;
      hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
      return i;
    }
    if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int64_t k = 2; k < len; ++k) {
      if (i + k >= n || p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return -1;
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
    const int64_t bad = invalid_utf8_at(text);
    TANDEM_CHECK(bad < 0, path, " line ", line, ", byte offset ", begin + bad, " (0x",
                 hex_byte(text[static_cast<size_t>(bad)]),
                 "): not UTF-8 text, which a tokenizer reads (convert the file to UTF-8, e.g. "
                 "with iconv)");
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
