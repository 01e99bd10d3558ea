// Note [Learning-rate schedule]: the learning rate of each update, with Megatron-LM's options and
// meaning (its OptimizerParamScheduler). The schedule runs on a count of samples: the k-th
// update of the weights reads the rate at (k - 1) x --global-batch-size samples, so the first
// update uses --lr-warmup-init (0 by default) when there is a warm-up. As Megatron's scheduler,
// it advances only with an applied update: a step skipped by --nan-policy skip does not move it,
// and a run that starts its optimizer afresh (--no-load-optim, --finetune) starts it afresh too. An
// iteration-based run (--train-iters) measures warm-up, decay and WSD's annealing in iterations
// times the global batch; a sample-based one (--train-samples) in samples; --lr-warmup-fraction
// takes that share of the decay length instead. With W warm-up, D decay and A annealing samples and
// n consumed:
//   n <= W (W > 0):         init + (lr - init) n / W
//   constant:               lr
//   n > D:                  min-lr
//   inverse-square-root:    max(min-lr, lr sqrt(max(W, 1) / max(n, 1)))
//   else, r = (n - W) / (D - W) and lr(c) = min-lr + c (lr - min-lr):
//     linear  c = 1 - r;  cosine  c = (1 + cos(pi r)) / 2
//     WSD     c = 1 up to D - A, then over s = (n - D + A) / A:
//             linear 1 - s; cosine (1 + cos(pi s)) / 2; exponential 2 * 0.5^s - 1;
//             minus_sqrt 1 - sqrt(s)
//
// Note [Decoupled learning rate]: with --decoupled-lr (Megatron-LM's), the input embedding and the
// output layer (model.embed_tokens.weight and lm_head.weight, the weights Megatron marks
// is_embedding_or_output_parameter) follow the same schedule with --decoupled-lr in the place of
// --lr and --decoupled-min-lr in the place of --min-lr (--min-lr when not given); warm-up start,
// lengths and decay style are the run's. Every other weight keeps --lr, and weight decay is the
// same for both. The MTP modules read the model's own embedding and output layer (no copy of
// them), which take the decoupled rate once; the modules' own weights keep --lr, as do learned
// position embeddings in Megatron-LM (tandem has none).
// --decoupled-min-lr without --decoupled-lr changes nothing, as in Megatron-LM.
#pragma once

#include <cstdint>
#include <span>

#include "core/enum_names.h"

namespace tandem {

struct TrainConfig;

// --lr-decay-style.
enum class LrDecayStyle : uint8_t { kConstant, kLinear, kCosine, kInverseSquareRoot, kWsd };
inline constexpr EnumName<LrDecayStyle> kLrDecayStyleNames[] = {
    {LrDecayStyle::kConstant, "constant"},
    {LrDecayStyle::kLinear, "linear"},
    {LrDecayStyle::kCosine, "cosine"},
    {LrDecayStyle::kInverseSquareRoot, "inverse-square-root"},
    {LrDecayStyle::kWsd, "WSD"}};
constexpr std::span<const EnumName<LrDecayStyle>> enum_names(LrDecayStyle) {
  return kLrDecayStyleNames;
}

// --lr-wsd-decay-style: the shape of WSD's annealing phase.
enum class LrWsdDecayStyle : uint8_t { kExponential, kLinear, kCosine, kMinusSqrt };
inline constexpr EnumName<LrWsdDecayStyle> kLrWsdDecayStyleNames[] = {
    {LrWsdDecayStyle::kExponential, "exponential"},
    {LrWsdDecayStyle::kLinear, "linear"},
    {LrWsdDecayStyle::kCosine, "cosine"},
    {LrWsdDecayStyle::kMinusSqrt, "minus_sqrt"}};
constexpr std::span<const EnumName<LrWsdDecayStyle>> enum_names(LrWsdDecayStyle) {
  return kLrWsdDecayStyleNames;
}

// The schedule's lengths, in samples.
struct LrLengths {
  double warmup = 0;  // W
  double decay = 0;   // D
  double anneal = 0;  // A (WSD)
};
LrLengths lr_lengths(const TrainConfig& t);

// The learning rate of the `update`-th (1-based) update of the weights.
double lr_at(const TrainConfig& t, int64_t update);
// The same schedule with peak `max_lr` and final `min_lr` in the place of --lr and --min-lr.
double lr_at(const TrainConfig& t, int64_t update, double max_lr, double min_lr);
// Note [Decoupled learning rate]: the embedding's and output layer's rate of that update;
// lr_at's without --decoupled-lr.
double decoupled_lr_at(const TrainConfig& t, int64_t update);

// The schedule options' rules (Megatron's): iteration- and sample-based options not mixed, one
// warm-up length, WSD's annealing length given, the warm-up shorter than the decay,
// --lr-warmup-init and --min-lr within [0, --lr], --decoupled-lr at least 0 and
// --decoupled-min-lr within [0, --decoupled-lr]. Throws tandem::Error naming the options.
void validate_lr_schedule(const TrainConfig& t);

}  // namespace tandem
