// Documents of a file and the ids format of the tokenizer helpers (tokenizer.h).
#include "data/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/text_file.h"
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

namespace {

// The bound of a tokenizer.json: far above the largest published ones (about 20 MB).
constexpr int64_t kMaxTokenizerJsonBytes = int64_t{512} << 20;

nlohmann::json read_json_file(const std::filesystem::path& path, const std::string& what) {
  const std::string text = read_text_input(path.string(), what, kMaxTokenizerJsonBytes);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK(!j.is_discarded(), what, ": not JSON");
  return j;
}

// A special token as transformers writes it in tokenizer_config.json and special_tokens_map.json:
// the token's text, or an object with its text under "content". "" when absent or null.
std::string special_token(const nlohmann::json& config, const char* key, const std::string& what) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  const auto content = it->is_object() ? it->find("content") : it->end();
  TANDEM_CHECK(it->is_object() && content != it->end() && content->is_string(), what, ": \"", key,
               "\" is neither a string nor an object with a string \"content\"");
  return content->get<std::string>();
}

}  // namespace

TokenizerVocab hf_tokenizer_vocab(const std::string& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool dir = fs::is_directory(model, ec);
  const fs::path file = dir ? fs::path(model) / "tokenizer.json" : fs::path(model);
  const fs::path folder = dir ? fs::path(model) : file.parent_path();
  TANDEM_CHECK(fs::is_regular_file(file, ec), "--tokenizer-model ", model, ": ",
               dir ? "the directory holds no tokenizer.json"
                   : "is neither a directory holding a tokenizer.json nor a tokenizer.json file",
               " (tandem reads a Hugging Face tokenizer from disk, not from the Hub: download it "
               "first, e.g. `huggingface-cli download NAME tokenizer.json tokenizer_config.json "
               "--local-dir DIR`, and pass DIR)");
  const std::string what = "--tokenizer-model " + file.string();
  const nlohmann::json j = read_json_file(file, what);
  const auto model_it = j.is_object() ? j.find("model") : j.end();
  TANDEM_CHECK(model_it != j.end() && model_it->is_object() && model_it->contains("vocab"), what,
               ": no \"model\" with a \"vocab\" (not a tokenizer.json of Hugging Face's "
               "tokenizers)");
  // Token text -> id: the model's vocabulary (an object for BPE, WordPiece and WordLevel, a list
  // of [piece, score] for Unigram), then the added tokens.
  std::map<std::string, int64_t> vocab;
  const nlohmann::json& v = (*model_it)["vocab"];
  if (v.is_object()) {
    for (const auto& [token, id] : v.items()) {
      TANDEM_CHECK(id.is_number_integer(), what, ": the vocabulary's \"", token,
                   "\" has no integer id");
      vocab.emplace(token, id.get<int64_t>());
    }
  } else {
    TANDEM_CHECK(v.is_array(), what, ": the model's \"vocab\" is neither an object nor a list");
    for (size_t i = 0; i < v.size(); ++i) {
      TANDEM_CHECK(v[i].is_array() && !v[i].empty() && v[i][0].is_string(), what,
                   ": the model's vocabulary entry ", i, " is not [piece, score]");
      vocab.emplace(v[i][0].get<std::string>(), static_cast<int64_t>(i));
    }
  }
  if (const auto added = j.find("added_tokens"); added != j.end() && added->is_array()) {
    for (const nlohmann::json& t : *added) {
      TANDEM_CHECK(t.is_object() && t.contains("content") && t["content"].is_string() &&
                       t.contains("id") && t["id"].is_number_integer(),
                   what, ": an entry of \"added_tokens\" has no string content and integer id");
      vocab[t["content"].get<std::string>()] = t["id"].get<int64_t>();
    }
  }
  TANDEM_CHECK(!vocab.empty(), what, ": the vocabulary is empty");
  TokenizerVocab out;
  out.size = static_cast<int64_t>(vocab.size());
  std::string eos;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path config = folder / name;
    if (!eos.empty() || !fs::is_regular_file(config, ec)) continue;
    const std::string config_what = "--tokenizer-model " + config.string();
    eos = special_token(read_json_file(config, config_what), "eos_token", config_what);
  }
  if (!eos.empty()) {
    const auto it = vocab.find(eos);
    TANDEM_CHECK(it != vocab.end(), "--tokenizer-model ", folder.string(), ": the eos_token \"",
                 eos, "\" is not a token of ", file.string());
    out.eod = it->second;
  }
  return out;
}

TokenizerVocab sentencepiece_megatron_vocab(const std::string& type, int64_t pieces,
                                            const std::function<std::string(int64_t)>& piece,
                                            int64_t pad_id, int64_t bos_id, int64_t eos_id) {
  TokenizerVocab out;
  if (type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer") {
    out.size = pieces;
    out.eod = eos_id;
    return out;
  }
  TANDEM_CHECK(type == "SentencePieceTokenizer", "--tokenizer-type ", type,
               " is not a sentencepiece tokenizer");
  std::map<std::string, int64_t> vocab;
  for (int64_t i = 0; i < pieces; ++i) vocab.emplace(piece(i), i);
  // Each special token not yet a piece takes the next id, as Megatron-LM's dictionary does.
  const auto add = [&](const std::string& t) {
    return vocab.emplace(t, static_cast<int64_t>(vocab.size())).first->second;
  };
  const auto named = [&](int64_t id, const char* fallback) {
    return id >= 0 && id < pieces ? piece(id) : std::string(fallback);
  };
  add("<CLS>");
  add("<SEP>");
  out.eod = add("<EOD>");
  add("<MASK>");
  add(named(pad_id, "<PAD>"));
  add(named(bos_id, "<BOS>"));
  add(named(eos_id, "<EOS>"));
  out.size = static_cast<int64_t>(vocab.size());
  return out;
}

}  // namespace tandem::data
