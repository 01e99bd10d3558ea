// Megatron's document masks (data/document_masks.h). Oracle: Megatron's own steps written out
// over a full [seq, seq] attention matrix: start lower-triangular; for each end-of-document
// position p, zero rows p+1.. over columns ..p, and shift the positions after p back by
// p + 1 - (the previous shift's start); drop the loss where the input is the eod. The first
// unmasked column of each row is the first key the op is handed.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "data/document_masks.h"
#include "data_files.h"

namespace tandem::data {
namespace {

struct Megatron {
  std::vector<int32_t> first_key, position;
  std::vector<float> loss_mask;
};

Megatron megatron_masks(const std::vector<int32_t>& x, int32_t eod, const DocumentMaskOptions& o) {
  const auto t = static_cast<int64_t>(x.size());
  std::vector<std::vector<int>> mask(t, std::vector<int>(t, 0));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j <= i; ++j) mask[i][j] = 1;
  Megatron m{{}, {}, std::vector<float>(t, 1.0f)};
  for (int64_t i = 0; i < t; ++i) m.position.push_back(static_cast<int32_t>(i));
  if (o.eod_mask_loss)
    for (int64_t i = 0; i < t; ++i)
      if (x[i] == eod) m.loss_mask[i] = 0.0f;
  int64_t prev = 0;
  for (int64_t p = 0; p < t; ++p) {
    if (x[p] != eod) continue;
    if (o.reset_attention_mask)
      for (int64_t r = p + 1; r < t; ++r)
        for (int64_t c = 0; c <= p; ++c) mask[r][c] = 0;
    if (o.document_positions) {
      for (int64_t r = p + 1; r < t; ++r) m.position[r] -= static_cast<int32_t>(p + 1 - prev);
      prev = p + 1;
    }
  }
  for (int64_t i = 0; i < t; ++i) {
    int32_t j = 0;
    while (mask[i][j] == 0) ++j;
    m.first_key.push_back(j);
  }
  return m;
}

TEST(DocumentMasks, AreMegatronsForEveryOptionSet) {
  const int32_t eod = 2;
  std::mt19937_64 rng(46);
  std::uniform_int_distribution<int32_t> token(0, 4);  // eod one token in five
  const int64_t batch = 6, seq = 17;
  std::vector<int32_t> ids(static_cast<size_t>(batch * seq));
  for (int32_t& id : ids) id = token(rng);
  ids[0] = eod;                        // an eod first
  ids[seq - 1] = eod;                  // and last
  ids[seq] = eod, ids[seq + 1] = eod;  // two in a row
  for (int bits = 0; bits < 8; ++bits) {
    const DocumentMaskOptions o{eod, (bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0};
    const DocumentMasks got = document_masks(ids.data(), batch, seq, o);
    for (int64_t b = 0; b < batch; ++b) {
      const std::vector<int32_t> x(ids.begin() + b * seq, ids.begin() + (b + 1) * seq);
      const Megatron want = megatron_masks(x, eod, o);
      for (int64_t i = 0; i < seq; ++i) {
        const auto r = static_cast<size_t>(b * seq + i);
        ASSERT_EQ(got.key_begin[r], want.first_key[i]) << bits << " " << b << " " << i;
        ASSERT_EQ(got.position[r], want.position[i]) << bits << " " << b << " " << i;
        ASSERT_EQ(got.loss_mask[r], want.loss_mask[i]) << bits << " " << b << " " << i;
      }
    }
  }
  // The masks change something in these samples, so the comparison above has teeth.
  const DocumentMasks all = document_masks(ids.data(), batch, seq, {eod, true, true, true});
  EXPECT_NE(all.key_begin, std::vector<int32_t>(ids.size(), 0));
  expect_error(
      [&] {
        document_masks(ids.data(), batch, seq, {-1, false, true, false});
      },
      {"end-of-document token id"});
}

}  // namespace
}  // namespace tandem::data
