// Checkpoints to and from the live objects: parameters, AdamW and a rank's chunks. Every restore
// checks all it will copy (configs, names, shapes, the data position) before changing anything,
// so a rejected checkpoint leaves the run exactly as it was.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "runtime/checkpoint.h"

namespace tandem::runtime {
namespace {

using Json = nlohmann::json;
using TensorIndex = std::map<std::string, const Tensor*>;

TensorIndex index_tensors(const NamedTensors& tensors) {
  TensorIndex index;
  for (const auto& [name, t] : tensors) index[name] = &t;
  return index;
}

std::string where_of(const CheckpointState& st) {
  return st.dir.empty() ? std::string("checkpoint: ") : "checkpoint " + st.dir + ": ";
}

std::string option_of(std::string key) {
  for (char& c : key) c = c == '_' ? '-' : c;
  return "--" + key;
}

// The first key whose value differs between the checkpoint's config and the run's, as a
// message; "" when they agree. HF checkpoints store seq_length only as a limit, so it is skipped;
// the training settings config.json does not carry (io::hf_config_unwritten_fields: the expert
// bias's rate, the aux loss of a family without one) are the run's to choose.
std::string config_difference(const CheckpointState& st, const ModelConfig& run) {
  const Json ckpt = config_to_json(st.model_config), mine = config_to_json(run);
  const std::vector<std::string> free = io::hf_config_unwritten_fields(st.model_config);
  for (const auto& [key, value] : ckpt.items()) {
    if (st.kind == CheckpointKind::kHuggingFace && key == "seq_length") continue;
    if (std::find(free.begin(), free.end(), key) != free.end()) continue;
    if (mine[key] != value) {
      return detail::concat(key, " is ", value.dump(), " in the checkpoint but ", mine[key].dump(),
                            " in this run (", option_of(key), ")");
    }
  }
  return "";
}

// The model config, and every weight `params` holds with its shape.
void check_weights(const model::Parameters& params, const TensorIndex& weights,
                   const CheckpointState& st) {
  const std::string where = where_of(st);
  const std::string diff = config_difference(st, params.config());
  TANDEM_CHECK(diff.empty(), where, "the model differs: ", diff);
  for (const model::ParamEntry& e : params.entries()) {
    const auto it = weights.find(e.name);
    TANDEM_CHECK(it != weights.end(), where, "weight ", e.name,
                 " is missing (the model of config.json needs it)");
    TANDEM_CHECK(it->second->shape() == e.shape, where, "weight ", e.name, " has shape ",
                 shape_str(it->second->shape()), " but config.json implies ", shape_str(e.shape));
  }
}

// Every tensor of the checkpoint is a weight of the whole model `cfg` (the one config.json
// describes), whichever part of it this rank holds: a checkpoint with a layer or an expert more
// than its config says is refused on every layout alike, not trained as the smaller model where
// no rank holds the whole (DeepSeek-V3's multi-token prediction layers were dropped on reading,
// Note [Multi-token prediction layers] in checkpoint.cc).
void check_no_unknown_tensors(const ModelConfig& cfg, const TensorIndex& weights,
                              const CheckpointState& st) {
  std::set<std::string> names;
  for (const model::ParamEntry& e :
       model::Parameters::entries_of(cfg, model::ChunkSpec::whole(cfg))) {
    names.insert(e.name);
  }
  for (const auto& [name, t] : weights) {
    TANDEM_CHECK(names.count(name) == 1, where_of(st), "tensor ", name,
                 " is not part of the model that config.json describes");
  }
}

void check_moments(const model::Parameters& params, const TensorIndex& moments,
                   const CheckpointState& st) {
  for (const model::ParamEntry& e : params.entries()) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      const auto it = moments.find(e.name + suffix);
      TANDEM_CHECK(it != moments.end() && it->second->shape() == e.shape, where_of(st),
                   "optimizer tensor ", e.name, suffix, " is missing or has the wrong shape");
    }
  }
}

void copy_weights(model::Parameters& params, const TensorIndex& weights) {
  for (const model::ParamEntry& e : params.entries()) {
    params.param(e).copy_from(io::to_float(*weights.at(e.name), params.dtype()));
  }
  params.refresh_compute_copy();  // Note [Compute copy] in model/parameters.h
}

// A host tensor for the checkpoint writer: the view itself on the CPU, a copy from a GPU.
Tensor on_host(const Tensor& t) { return t.device() == Device::kCPU ? t : t.to(Device::kCPU); }

// Adam's flat moment buffers, viewed per weight (the optimizer exposes them as const handles to
// the buffers it owns; writing through them is the restore the handles exist for).
Tensor moment_view(const Tensor& flat, const model::ParamEntry& e) {
  return flat.narrow_rows(e.offset, shape_numel(e.shape)).reshape(e.shape);
}

// Each entry's moments into the optimizer's buffers where it keeps them: the ranges it owns
// (the whole buffers, or with the distributed optimizer this rank's parts:
// Note [Distributed optimizer] in distributed_optimizer.cc).
void copy_moments(const model::Parameters& params, AdamW& optimizer, const TensorIndex& moments) {
  for (const model::ParamEntry& e : params.entries()) {
    const int64_t n = shape_numel(e.shape);
    const Tensor m = io::to_float(*moments.at(e.name + ".exp_avg"), params.dtype()).reshape({n});
    const Tensor v = io::to_float(*moments.at(e.name + ".exp_avg_sq"), params.dtype()).reshape({n});
    for (const OwnedRange& r : optimizer.owned()) {
      const int64_t b = std::max(r.begin, e.offset),
                    end = std::min(r.begin + r.count, e.offset + n);
      if (b >= end) continue;
      const int64_t at = r.state_at + (b - r.begin);
      optimizer.exp_avg().narrow_rows(at, end - b).copy_from(m.narrow_rows(b - e.offset, end - b));
      optimizer.exp_avg_sq()
          .narrow_rows(at, end - b)
          .copy_from(v.narrow_rows(b - e.offset, end - b));
    }
  }
}

// The seed and the global batch size fix which samples each later iteration reads.
void check_data_position(const TrainingPosition& pos, const TrainConfig& run,
                         const CheckpointState& st) {
  TANDEM_CHECK(pos.train.seed == run.seed, where_of(st), "seed is ", pos.train.seed,
               " in the checkpoint but ", run.seed,
               " in this run (--seed): the data order after resuming would differ");
  TANDEM_CHECK(pos.train.global_batch_size == run.global_batch_size, where_of(st),
               "global_batch_size is ", pos.train.global_batch_size, " in the checkpoint but ",
               run.global_batch_size,
               " in this run (--global-batch-size): the data position would not match");
}

}  // namespace

NamedTensors model_tensors(const model::Parameters& params) {
  NamedTensors out;
  for (const model::ParamEntry& e : params.entries()) {
    out.emplace_back(e.name, on_host(params.param(e)));
  }
  return out;
}

NamedTensors moment_tensors(const model::Parameters& params, const Tensor& exp_avg,
                            const Tensor& exp_avg_sq) {
  NamedTensors out;
  for (const model::ParamEntry& e : params.entries()) {
    out.emplace_back(e.name + ".exp_avg", on_host(moment_view(exp_avg, e)));
    out.emplace_back(e.name + ".exp_avg_sq", on_host(moment_view(exp_avg_sq, e)));
  }
  return out;
}

NamedTensors optimizer_tensors(const model::Parameters& params, const AdamW& optimizer) {
  TANDEM_ASSERT(!optimizer.sharded(), "a sharded optimizer's moments are made whole first");
  return moment_tensors(params, optimizer.exp_avg(), optimizer.exp_avg_sq());
}

void restore_model(model::Parameters& params, const CheckpointState& state) {
  const TensorIndex weights = index_tensors(state.model);
  check_weights(params, weights, state);
  check_no_unknown_tensors(params.config(), weights, state);
  copy_weights(params, weights);
}

Json training_position_json(int64_t iteration, int64_t optimizer_steps, const ModelConfig& m,
                            const TrainConfig& t, const Json& data) {
  return {{"iteration", iteration},
          {"optimizer_steps", optimizer_steps},
          {"samples_consumed", iteration * t.global_batch_size},
          {"seed", t.seed},
          {"model", config_to_json(m)},
          {"train", config_to_json(t)},
          {"data", data}};
}

int64_t restore_chunks(const std::vector<ChunkRef>& chunks, const TrainConfig& run,
                       const CheckpointState& state, RestoreParts parts) {
  const TensorIndex weights = index_tensors(state.model);
  const TensorIndex moments = index_tensors(state.optimizer);
  const bool tandem = state.kind == CheckpointKind::kTandem;
  const bool position = tandem && parts != RestoreParts::kWeightsOnly;
  const bool optimizer = tandem && parts == RestoreParts::kAll;
  TrainingPosition pos;  // iteration 0, 0 steps: weights only
  if (position) {
    pos = read_training_position(state.trainer_state, where_of(state));
    check_data_position(pos, run, state);
  }
  for (const ChunkRef& c : chunks) {
    check_weights(*c.params, weights, state);
    if (optimizer) check_moments(*c.params, moments, state);
  }
  if (!chunks.empty()) check_no_unknown_tensors(chunks.front().params->config(), weights, state);
  for (const ChunkRef& c : chunks) {
    copy_weights(*c.params, weights);
    if (optimizer) {
      copy_moments(*c.params, *c.optimizer, moments);
    } else {
      c.optimizer->exp_avg().zero_();
      c.optimizer->exp_avg_sq().zero_();
    }
    c.optimizer->set_steps(optimizer ? pos.optimizer_steps : 0);
  }
  return pos.iteration;
}

}  // namespace tandem::runtime
