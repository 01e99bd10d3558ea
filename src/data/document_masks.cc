// Megatron's document masks (document_masks.h).
#include "data/document_masks.h"

#include "core/error.h"

namespace tandem::data {

DocumentMasks document_masks(const int32_t* ids, int64_t batch, int64_t seq,
                             const DocumentMaskOptions& o) {
  TANDEM_ASSERT(batch >= 0 && seq >= 0, "document masks of ", batch, " x ", seq);
  const bool bounds = o.reset_attention_mask || o.document_positions || o.eod_mask_loss;
  TANDEM_CHECK(!bounds || o.eod >= 0,
               "document masks need the end-of-document token id, and none is known");
  const auto n = static_cast<size_t>(batch * seq);
  DocumentMasks m{std::vector<int32_t>(n), std::vector<int32_t>(n), std::vector<float>(n, 1.0f)};
  for (int64_t b = 0; b < batch; ++b) {
    int32_t start = 0;  // the current document's first position in this sample
    for (int64_t i = 0; i < seq; ++i) {
      const auto r = static_cast<size_t>(b * seq + i);
      const auto pos = static_cast<int32_t>(i);
      m.key_begin[r] = o.reset_attention_mask ? start : 0;
      m.position[r] = o.document_positions ? pos - start : pos;
      const bool eod = ids[r] == o.eod;
      if (o.eod_mask_loss && eod) m.loss_mask[r] = 0.0f;
      if (eod) start = pos + 1;  // the next token opens a document
    }
  }
  return m;
}

}  // namespace tandem::data
