// The multi-token prediction settings' rules (docs/model.md "Multi-token prediction").
#include <cmath>

#include "core/config.h"
#include "core/error.h"

namespace tandem {

// A module per depth, each a named set of weights and a transformer layer; a count past any
// published model's by orders of magnitude is refused at once.
constexpr int64_t kMaxMtpLayers = 64;

void ModelConfig::validate_mtp_options() const {
  TANDEM_CHECK(mtp_num_layers >= 0 && mtp_num_layers <= kMaxMtpLayers, "--mtp-num-layers ",
               mtp_num_layers, " is invalid: use 0 (none) up to ", kMaxMtpLayers);
  TANDEM_CHECK(std::isfinite(mtp_loss_scaling_factor) && mtp_loss_scaling_factor >= 0,
               "--mtp-loss-scaling-factor ", mtp_loss_scaling_factor,
               " is invalid: it must be a finite number >= 0");
  // Module k predicts token i + k + 1 from position i: the positions T - k .. T - 1 of a
  // sequence have no target, so each module needs T > k.
  TANDEM_CHECK(mtp_num_layers < seq_length, "--mtp-num-layers ", mtp_num_layers,
               " is invalid with --seq-length ", seq_length,
               ": module k predicts k + 1 tokens ahead, so it must be below the sequence length");
}

void check_mtp_overlap(const ModelConfig& m, int64_t expert_parallel_size, bool paired_actions) {
  // The modules' MoE layers exchange their rows inside the loss node; a schedule that overlaps
  // two micro-batches (combined-1f1b's pairs) runs another micro-batch's exchanges beside it, and
  // the ranks' collectives would then not come in one order.
  TANDEM_CHECK(
      !m.has_mtp() || !m.is_moe_layer(m.num_layers) || expert_parallel_size == 1 || !paired_actions,
      "--mtp-num-layers ", m.mtp_num_layers, " with --expert-model-parallel-size ",
      expert_parallel_size,
      " and --schedule combined-1f1b: the MTP modules' expert exchanges run inside the "
      "loss node, which that schedule overlaps with another micro-batch's; use another "
      "--schedule, --expert-model-parallel-size 1 or --mtp-num-layers 0");
}

void check_mtp_layout(const ModelConfig& m, int64_t pipeline_stages) {
  // The modules read the embedding table, which the first stage holds: one stage only.
  TANDEM_CHECK(!m.has_mtp() || pipeline_stages == 1, "--mtp-num-layers ", m.mtp_num_layers,
               " with --pipeline-model-parallel-size x --virtual-pipeline-model-parallel-size ",
               pipeline_stages,
               ": multi-token prediction runs with one pipeline stage (it reads the embedding "
               "table the first stage holds); use --pipeline-model-parallel-size 1 or "
               "--mtp-num-layers 0");
}

}  // namespace tandem
