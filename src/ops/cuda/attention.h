// The flash attention's tile variants (attention_mma.cuh, Note [Attention variants]): their names
// and a switch, so that one benchmark run times them all and a test checks each. Private to
// src/ops/cuda, bench and tests/cuda.
#pragma once

#include <vector>

#include "core/tuning.h"

namespace tandem::ops::cuda {

// Names of the D 64 tensor-core forward / backward variants; the index is what
// --attention-forward-variant / --attention-backward-variant and select_attention_variants take.
// Index 0 is the default.
std::vector<const char*> attention_forward_variant_names();
std::vector<const char*> attention_backward_variant_names();

// Makes every later attention call in the process take forward variant `forward` and backward
// variant `backward` (-1: back to the performance setting, else the default); throws
// tandem::Error for an index out of range.
void select_attention_variants(int forward, int backward);

// The D 128 forward's tilings (q/k 192 with v 128 takes the same table), and the choice of one as
// above (--attention-forward128-variant; -1: back to the setting, else the default).
std::vector<const char*> attention_forward128_variant_names();
void select_attention_forward128_variant(int variant);

// The D 128 deterministic backward's tilings, and the choice of one as above
// (--attention-backward128-variant; -1: back to the setting, else the default).
std::vector<const char*> attention_backward128_variant_names();
void select_attention_backward128_variant(int variant);

// Throws tandem::Error naming an --attention-*-variant of `t` that is no variant of its table.
void check_attention_variants(const Tuning& t);

}  // namespace tandem::ops::cuda
