// tandem-tokenize MODEL INPUT [--json-keys KEY]: the documents of a text or JSONL file
// (Note [Documents of a file] in data/tokenizer.h) as token ids under a sentencepiece model,
// written to stdout in the ids format of tools/hf_tokenize.py (data/tokenizer.h), for `tandem
// convert`. tandem-tokenize --vocab TYPE MODEL: only the header, with Megatron-LM's
// vocabulary size and end-of-document id for that --tokenizer-type, for `tandem train`
// (Note [Megatron-LM's tokenizer vocabulary] in data/tokenizer.h). Both in a process of their
// own: Note [Tokenizers in a helper process] in cli/convert_command.cc. Exit status 2 on bad
// input, 1 on an internal error.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"

namespace {

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "--vocab") {
    TANDEM_CHECK(args.size() == 3, "usage: tandem-tokenize --vocab TYPE MODEL");
    const tandem::data::TokenizerVocab v =
        tandem::data::SentencePieceTokenizer(args[2]).megatron_vocab(args[1]);
    std::printf("%s vocab_size=%lld eod_id=%lld\n", tandem::data::kIdsHeader,
                static_cast<long long>(v.size), static_cast<long long>(v.eod));
    return 0;
  }
  std::string key = "text";
  if (args.size() == 4 && args[2] == "--json-keys") {
    key = args[3];
    args.resize(2);
  }
  TANDEM_CHECK(args.size() == 2, "usage: tandem-tokenize MODEL INPUT [--json-keys KEY]");
  const tandem::data::SentencePieceTokenizer sp(args[0]);
  static char buffer[1 << 20];
  std::setvbuf(stdout, buffer, _IOFBF, sizeof buffer);
  std::printf("%s vocab_size=%lld eod_id=%lld\n", tandem::data::kIdsHeader,
              static_cast<long long>(sp.vocab_size()), static_cast<long long>(sp.eos_id()));
  std::string line;
  tandem::data::for_each_document(args[1], key, [&](const std::string& text, int64_t) {
    line.clear();
    for (const int32_t id : sp.encode(text)) {
      if (!line.empty()) line += ' ';
      line += std::to_string(id);
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
  });
  TANDEM_CHECK(std::fflush(stdout) == 0, "cannot write the ids: ", std::strerror(errno));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem-tokenize: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-tokenize: internal error: %s\n", e.what());
    return 1;
  }
}
