// The sentencepiece tokenizer (tokenizer.h), in a library of its own: Debian's libsentencepiece
// carries a copy of protobuf whose symbols clash with libprotobuf's (the TensorBoard writer's),
// so only the tandem-tokenize helper links it (Note [Tokenizers in a helper process] in
// cli/convert_command.cc).
#include <sentencepiece_processor.h>

#include "core/error.h"
#include "data/tokenizer.h"

namespace tandem::data {

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : impl_(std::make_unique<Impl>()) {
  const auto status = impl_->sp.Load(model_path);
  TANDEM_CHECK(status.ok(), "--tokenizer-model ", model_path,
               ": not a sentencepiece model (libsentencepiece: ", status.ToString(), ")");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  TANDEM_CHECK(status.ok(), "sentencepiece cannot encode a document: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int64_t SentencePieceTokenizer::eos_id() const { return impl_->sp.eos_id(); }

TokenizerVocab SentencePieceTokenizer::megatron_vocab(const std::string& type) const {
  const auto& sp = impl_->sp;
  return sentencepiece_megatron_vocab(
      type, sp.GetPieceSize(), [&sp](int64_t i) { return sp.IdToPiece(static_cast<int>(i)); },
      sp.pad_id(), sp.bos_id(), sp.eos_id());
}

}  // namespace tandem::data
