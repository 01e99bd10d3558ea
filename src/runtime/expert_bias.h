// The sigmoid router's expert bias as training state (--moe-router-enable-expert-bias).
//
// Note [Expert bias]: DeepSeek-V3 balances its experts without an aux loss. Each MoE layer has a
// bias b [E] (transformers' e_score_correction_bias) added to the sigmoid scores where the top-k
// is chosen, and nowhere else: the routing weights are the unbiased scores. After each step the
// bias moves towards even load, as Megatron-LM's --moe-router-bias-update-rate does:
//   load_e = rows routed to expert e in the step (every micro-batch, every data-parallel rank)
//   b_e   += rate * sign(mean_e' load_e' - load_e)
// An overloaded expert's bias falls, an idle one's rises, by the same step whatever the size of
// the imbalance. The attention nodes' backward adds each micro-batch's counts to the layer's
// tally (Parameters::expert_load, f32, exact for integers); the tallies are summed over the
// data-parallel group (which holds the expert-parallel ranks), so every rank holding a layer
// updates its bias from the same load, and a layout gives the bias of one rank, bit for bit. A
// skipped step (Note [Non-finite steps]) leaves the bias as it was. The bias is a parameter
// entry of kind kBuffer: no gradient, no AdamW update, saved and restored with the weights.
#pragma once

#include "comm/communicator.h"
#include "model/parameters.h"

namespace tandem::runtime {

// After a step: sums the step's tallies over `dp` (null: one rank holds all the data), updates
// every MoE layer's bias of `params` by `rate` when `apply`, and zeroes the tallies. Returns the
// step's balance: the most loaded expert's rows over the mean, the largest over the layers of
// `params` (-1 without tallies: nothing is done without --moe-router-enable-expert-bias).
double update_expert_bias(model::Parameters& params, double rate, comm::Communicator* dp,
                          bool apply);

}  // namespace tandem::runtime
