// The fused LM head's test hook (lm_head.cu): its rows per block of logits, so that a test can run
// a small batch in several blocks. Private to src/ops/cuda and tests/cuda.
#pragma once

#include <cstdint>

namespace tandem::ops::cuda {

// Sets the rows per block of lm_head_ce_forward and lm_head_ce_backward in every thread (0: the
// op's own choice, at most 1.25 GiB of bf16 logits per block); returns the previous value.
int64_t set_lm_head_block_rows_for_testing(int64_t rows);

}  // namespace tandem::ops::cuda
