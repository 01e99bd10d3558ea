// `tandem convert INPUT OUTPUT`: text into training data. Without a tokenizer every byte is a
// token, written as an llm.c token file. With --tokenizer-model, each document of INPUT
// (Note [Documents of a file]) is tokenized by the model's own tokenizer and written as a
// Megatron pair OUTPUT.bin/OUTPUT.idx, options named as Megatron's preprocess_data.py
// names them. An ids file (the tokenizer helpers' output) is also an INPUT it takes.
//
// Note [Tokenizers in a helper process]: the tokenizer runs in a process of its own that prints
// the ids of each document (data/tokenizer.h's ids format), and this command writes them: a
// sentencepiece model through tandem-tokenize (libsentencepiece, built beside tandem), a Hugging
// Face tokenizer.json through tools/hf_tokenize.py (Python's tokenizers: no C++ library of it is
// packaged). Debian's libsentencepiece carries its own copy of protobuf, whose symbols clash with
// libprotobuf's in this program (the TensorBoard writer's) and crash it at load time, so this
// program cannot link it. Where a helper cannot run, the message gives its command, to run where
// it can, and the `tandem convert` of its output.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/helper_process.h"
#include "cli/options.h"
#include "cli/path_checks.h"
#include "core/error.h"
#include "data/file_dataset.h"
#include "data/megatron_writer.h"
#include "data/tokenizer.h"

namespace tandem::cli {
namespace {

enum class TokenizerType : uint8_t { kBytes, kSentencePiece, kHuggingFace, kIdsFile };

struct ConvertOptions {
  std::string input;
  std::string output;
  std::string tokenizer_model;  // --tokenizer-model FILE
  std::string tokenizer_type;   // --tokenizer-type; empty: from the model's file name
  std::vector<std::string> json_keys = {"text"};
  bool append_eod = false;
  int64_t eod_id = -1;  // --eod-id; -1: the tokenizer's end-of-sequence id
};

bool starts_with_ids_header(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char head[16] = {};
  const size_t n = std::fread(head, 1, sizeof head - 1, f);
  std::fclose(f);
  const std::string word = std::string(data::kIdsHeader) + " ";
  return n >= word.size() && std::string(head, word.size()) == word;
}

TokenizerType tokenizer_type(const CLI::App& app, const ConvertOptions& o) {
  if (o.tokenizer_model.empty()) {
    TANDEM_CHECK(app.count("--tokenizer-type") == 0, "--tokenizer-type ", o.tokenizer_type,
                 " needs --tokenizer-model FILE, the tokenizer to use");
    return starts_with_ids_header(o.input) ? TokenizerType::kIdsFile : TokenizerType::kBytes;
  }
  if (o.tokenizer_type == "SentencePieceTokenizer") return TokenizerType::kSentencePiece;
  if (o.tokenizer_type == "HuggingFaceTokenizer") return TokenizerType::kHuggingFace;
  return data::is_jsonl_path(o.tokenizer_model) ? TokenizerType::kHuggingFace
                                                : TokenizerType::kSentencePiece;
}

// The Megatron prefix OUTPUT names (OUTPUT.bin or OUTPUT.idx name the same pair).
std::string megatron_prefix(const std::string& output) {
  for (const char* suffix : {".bin", ".idx"}) {
    if (output.size() > 4 && output.compare(output.size() - 4, 4, suffix) == 0) {
      return output.substr(0, output.size() - 4);
    }
  }
  return output;
}

// Bad combinations, every output path (Note [Outputs that are inputs]): before anything is read
// or written.
void check_convert_options(const CLI::App& app, const ConvertOptions& o, TokenizerType type) {
  const bool tokenized = type != TokenizerType::kBytes;
  TANDEM_CHECK(
      tokenized || (!o.append_eod && app.count("--json-keys") == 0 && app.count("--eod-id") == 0),
      "--append-eod, --eod-id and --json-keys apply to tokenized documents: give "
      "--tokenizer-model FILE (without one, every byte of ",
      o.input, " is a token)");
  TANDEM_CHECK(o.json_keys.size() == 1, "--json-keys takes one key here (", o.json_keys.size(),
               " given): convert each key's documents with a command of its own");
  TANDEM_CHECK(app.count("--json-keys") == 0 || data::is_jsonl_path(o.input) ||
                   type == TokenizerType::kIdsFile,
               "--json-keys ", o.json_keys[0], " reads JSON records, but ", o.input,
               " is not a .json or .jsonl file (a text file holds one document per line)");
  TANDEM_CHECK(app.count("--eod-id") == 0 || o.append_eod, "--eod-id ", o.eod_id,
               " sets the id that --append-eod appends: add --append-eod");
  std::vector<NamedPath> reads = {{"input", o.input}, {"--tokenizer-model", o.tokenizer_model}};
  for (const auto& [flag, path] : reads) {
    std::error_code ec;
    // A device or pipe would be read without end (a tokenizer's loader reads it whole).
    TANDEM_CHECK(path.empty() || std::filesystem::is_regular_file(path, ec), flag, " ", path,
                 ": not a regular file; give the file itself");
  }
  if (!tokenized) {
    check_outputs(reads, {{"output", o.output}});
    return;
  }
  const std::string prefix = megatron_prefix(o.output);
  check_outputs(reads, {{"output", prefix + ".bin"}, {"output", prefix + ".idx"}});
}

// The id --append-eod appends: --eod-id, else the tokenizer's; -1 without --append-eod.
int64_t end_of_document_id(const ConvertOptions& o, int64_t tokenizer_eos, int64_t vocab_size) {
  if (!o.append_eod) return -1;
  const int64_t eod = o.eod_id >= 0 ? o.eod_id : tokenizer_eos;
  TANDEM_CHECK(eod >= 0, "--append-eod: the tokenizer ",
               o.tokenizer_model.empty() ? o.input : o.tokenizer_model,
               " defines no end-of-sequence token; give its id with --eod-id N");
  TANDEM_CHECK(eod < vocab_size, "--eod-id ", eod, " is outside the tokenizer's vocabulary [0, ",
               vocab_size, ")");
  return eod;
}

void print_summary(const ConvertOptions& o, const data::MegatronWriter& w, int64_t vocab,
                   int64_t eod) {
  const std::string prefix = megatron_prefix(o.output);
  std::cout << "tandem convert: " << w.num_documents() << " documents, " << w.num_tokens()
            << " tokens (vocab " << vocab << ", "
            << (eod >= 0 ? "each document ending in id " + std::to_string(eod)
                         : std::string("no end-of-document id"))
            << ") -> " << prefix << ".bin, " << prefix << ".idx" << std::endl;
}

// Lines of a FILE*, '\n' removed (getline's buffer freed at the end).
class LineReader {
 public:
  explicit LineReader(std::FILE* in) : in_(in) {}
  ~LineReader() { std::free(buffer_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  bool next(std::string& line) {
    const ssize_t n = ::getline(&buffer_, &capacity_, in_);
    if (n < 0) return false;
    line.assign(buffer_, static_cast<size_t>(n));
    if (!line.empty() && line.back() == '\n') line.pop_back();
    return true;
  }

 private:
  std::FILE* in_;
  char* buffer_ = nullptr;
  size_t capacity_ = 0;
};

// Reads an ids stream (a tokenizer helper's output) into a Megatron pair; `before_finish` runs
// after the last line, before the pair is written (a helper's exit status is known only then).
void convert_ids(
    const ConvertOptions& o, std::FILE* in, const std::string& source,
    const std::function<void()>& before_finish = [] {}) {
  LineReader lines(in);
  std::string line;
  TANDEM_CHECK(lines.next(line), source, ": no output (expected the line '", data::kIdsHeader,
               " vocab_size=N eod_id=E')");
  const data::IdsHeader h = data::parse_ids_header(line, source);
  const int64_t eod = end_of_document_id(o, h.eod_id, h.vocab_size);
  data::MegatronWriter writer(megatron_prefix(o.output), h.vocab_size);
  for (int64_t number = 2; lines.next(line); ++number) {
    std::vector<int32_t> ids = data::parse_ids_line(line, h.vocab_size, source, number);
    if (!ids.empty() && eod >= 0) ids.push_back(static_cast<int32_t>(eod));
    writer.add_document(ids);
  }
  before_finish();
  writer.finish();
  print_summary(o, writer, h.vocab_size, eod);
}

// Note [Tokenizers in a helper process]: runs `command` and writes what it prints.
void convert_through(const ConvertOptions& o, const std::string& command,
                     const std::string& helper) {
  const std::string by_hand =
      detail::concat("run `", command, " > IDS` where it can run, then `tandem convert IDS ",
                     o.output, o.append_eod ? " --append-eod" : "",
                     o.eod_id >= 0 ? " --eod-id " + std::to_string(o.eod_id) : "", "`");
  std::FILE* pipe = ::popen(command.c_str(), "r");
  TANDEM_CHECK(pipe != nullptr, "cannot start `", command, "`; ", by_hand);
  // The helper's exit status decides before anything is written: a helper that fails on its
  // input's last document has printed every document before it.
  const auto check_helper = [&] {
    const std::string failure = helper_failure(::pclose(pipe), helper);
    pipe = nullptr;
    TANDEM_CHECK(failure.empty(), failure, "; ", by_hand);
  };
  try {
    convert_ids(o, pipe, helper, check_helper);
  } catch (const Error& e) {
    if (pipe == nullptr) throw;
    const std::string failure = helper_failure(::pclose(pipe), helper);
    throw Error(detail::concat(failure.empty() ? e.what() : failure, "; ", by_hand));
  }
}

void convert_with_tokenizer(const ConvertOptions& o, TokenizerType type) {
  const bool sp = type == TokenizerType::kSentencePiece;
  const std::string helper =
      sp ? beside_program("TANDEM_TOKENIZE", {"tandem-tokenize"}, "tandem-tokenize")
         : beside_program("TANDEM_HF_TOKENIZE", {"../tools/hf_tokenize.py"},
                          "tools/hf_tokenize.py");
  const std::string command = (sp ? "" : "python3 ") + shell_quoted(helper) + " " +
                              shell_quoted(o.tokenizer_model) + " " + shell_quoted(o.input) +
                              " --json-keys " + shell_quoted(o.json_keys[0]);
  convert_through(o, command, helper);
}

void run_convert(const CLI::App& app, const ConvertOptions& o) {
  const TokenizerType type = tokenizer_type(app, o);
  check_convert_options(app, o, type);
  switch (type) {
    case TokenizerType::kBytes:
      data::convert_text_to_tokens(o.input, o.output);
      return;
    case TokenizerType::kSentencePiece:
    case TokenizerType::kHuggingFace:
      convert_with_tokenizer(o, type);
      return;
    case TokenizerType::kIdsFile: {
      std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(o.input.c_str(), "rb"),
                                                        &std::fclose);
      TANDEM_CHECK(f != nullptr, "input ", o.input, ": cannot open it");
      convert_ids(o, f.get(), o.input);
      return;
    }
  }
}

}  // namespace

void register_convert_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "convert",
      "Turn text into training data: bytes as tokens (an llm.c token file), or with "
      "--tokenizer-model the model's own token ids (a Megatron OUTPUT.bin/OUTPUT.idx pair)");
  sub->footer(
      "Environment: TANDEM_TOKENIZE names the tandem-tokenize program a sentencepiece model runs "
      "through (default: the one beside tandem, else on PATH); TANDEM_HF_TOKENIZE names "
      "tools/hf_tokenize.py, which a tokenizer.json runs through (default: ../tools/hf_tokenize.py "
      "beside tandem).");
  auto o = std::make_shared<ConvertOptions>();
  sub->add_option("input", o->input,
                  "Text file (one document per line), .json/.jsonl file (one JSON object per "
                  "line), or the ids tools/hf_tokenize.py wrote")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("output", o->output,
                  "Token file to write (bytes), or the prefix of the Megatron pair "
                  "OUTPUT.bin/OUTPUT.idx (tokenized); replaced atomically")
      ->required();
  sub->add_option("--tokenizer-model", o->tokenizer_model,
                  "The model's tokenizer: a sentencepiece tokenizer.model, or a Hugging Face "
                  "tokenizer.json (through tools/hf_tokenize.py, which needs Python's tokenizers) "
                  "(default: none, bytes as tokens)")
      ->check(CLI::ExistingFile)
      ->option_text("FILE");
  sub->add_option("--tokenizer-type", o->tokenizer_type,
                  "SentencePieceTokenizer or HuggingFaceTokenizer (default: HuggingFaceTokenizer "
                  "for a .json file, else SentencePieceTokenizer)")
      ->check(CLI::IsMember({"SentencePieceTokenizer", "HuggingFaceTokenizer"}));
  sub->add_option("--json-keys", o->json_keys,
                  "the key of a .json/.jsonl record that holds the document's text (default: "
                  "text)")
      ->option_text("KEY");
  sub->add_flag("--append-eod", o->append_eod,
                "end every document with the tokenizer's end-of-sequence id (or --eod-id)");
  sub->add_option("--eod-id", o->eod_id,
                  "the id --append-eod appends (default: the tokenizer's end-of-sequence token)")
      ->check(decimal_number(FieldBound::kNonNegative, false))
      ->option_text("ID");
  sub->callback([sub, o] { run_convert(*sub, *o); });
}

}  // namespace tandem::cli
