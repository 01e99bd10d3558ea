// Runs of rows for ops::copy_row_blocks and the grouped linear ops, and the argument checks both
// backends share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace tandem::ops {

// Rows [from, from + rows) of the input go to rows [to, to + rows) of the output.
struct RowBlock {
  int64_t from = 0, to = 0, rows = 0;
};

// copy_row_blocks' checks: out and in of rank >= 1, one dtype, the same row size; every block
// inside both; no two destinations overlapping. Returns the bytes of one row.
inline int64_t check_row_blocks(const char* op, const Tensor& out, const Tensor& in,
                                const std::vector<RowBlock>& blocks) {
  TANDEM_CHECK(out.dim() >= 1 && in.dim() >= 1, op, ": out and in need at least one dimension");
  TANDEM_CHECK(out.dtype() == in.dtype(), op, ": out is ", dtype_name(out.dtype()), ", in is ",
               dtype_name(in.dtype()), "; they must match");
  const int64_t out_rows = out.size(0), in_rows = in.size(0);
  const int64_t row = out_rows > 0 ? out.numel() / out_rows : 0;
  const int64_t in_row = in_rows > 0 ? in.numel() / in_rows : row;
  TANDEM_CHECK(out_rows == 0 || in_row == row, op, ": out's rows have ", row, " elements, in's ",
               in_row);
  std::vector<std::pair<int64_t, int64_t>> dst;
  for (const RowBlock& b : blocks) {
    TANDEM_CHECK(b.rows >= 0 && b.from >= 0 && b.to >= 0 && b.from + b.rows <= in_rows &&
                     b.to + b.rows <= out_rows,
                 op, ": block of ", b.rows, " rows from ", b.from, " to ", b.to,
                 " is outside in's ", in_rows, " or out's ", out_rows, " rows");
    if (b.rows > 0) dst.emplace_back(b.to, b.to + b.rows);
  }
  std::sort(dst.begin(), dst.end());
  for (size_t i = 1; i < dst.size(); ++i) {
    TANDEM_CHECK(dst[i].first >= dst[i - 1].second, op, ": destination rows [", dst[i].first, ", ",
                 dst[i].second, ") overlap [", dst[i - 1].first, ", ", dst[i - 1].second, ")");
  }
  return row * static_cast<int64_t>(dtype_size(out.dtype()));
}

// The grouped linear ops' checks (Note [Grouped expert products] in ops.h): one weight per row
// block, no block below zero rows, the blocks covering the operands' `total` rows one after
// another. Returns each block's first row.
inline std::vector<int64_t> grouped_block_starts(const char* op, const std::vector<int32_t>& rows,
                                                 size_t weights, int64_t total) {
  TANDEM_CHECK(weights == rows.size(), op, ": ", weights, " weights for ", rows.size(),
               " row blocks");
  std::vector<int64_t> starts(rows.size());
  int64_t begin = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    TANDEM_CHECK(rows[e] >= 0, op, ": row block ", e, " has ", rows[e], " rows");
    starts[e] = begin;
    begin += rows[e];
  }
  TANDEM_CHECK(begin == total, op, ": the blocks' rows sum to ", begin, ", not the ", total,
               " rows of the operands");
  return starts;
}

}  // namespace tandem::ops
