// Megatron's document masks of a batch of samples (its get_ltor_masks_and_position_ids).
//
// Note [Document masking]: a sample of packed documents holds end-of-document tokens (the
// tokenizer's eod, which `tandem convert --append-eod` appends to each document). For input
// token ids x[0..seq) of one sample, with e the end-of-document id:
//   --reset-attention-mask  the query at position i attends to keys j <= i of its own document:
//                           j > p for every p < i with x[p] == e (the eod closes its document
//                           and belongs to it); so key_begin[i] = 1 + the last such p, else 0;
//   --document-positions    the position of token i counts from its document's first token:
//                           i - (1 + the last p < i with x[p] == e), else i;
//   --eod-mask-loss         the loss of position i is dropped when x[i] == e: the input is the
//                           end-of-document token, so its target is the next document's first
//                           token, which nothing before it predicts. The eod itself, as a target,
//                           keeps its loss (Megatron masks by the input ids, not the labels).
// Without the option each keeps its plain form (0, i, 1).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::data {

struct DocumentMasks {
  std::vector<int32_t> key_begin;  // [batch * seq]: the first key each query attends to
  std::vector<int32_t> position;   // [batch * seq]: each token's position
  std::vector<float> loss_mask;    // [batch * seq]: 1 kept, 0 dropped
};

struct DocumentMaskOptions {
  int64_t eod = -1;  // the end-of-document token id
  bool document_positions = false, reset_attention_mask = false, eod_mask_loss = false;
};

// The masks of `batch` samples of `seq` input ids each, row-major (Note [Document masking]).
DocumentMasks document_masks(const int32_t* ids, int64_t batch, int64_t seq,
                             const DocumentMaskOptions& o);

}  // namespace tandem::data
