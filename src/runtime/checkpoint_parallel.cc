// Multi-rank checkpoints: gathering the owned tensors to rank 0 by name, saving there with the
// others waiting for the outcome, restoring every rank's chunks, and agreeing on errors.
#include "runtime/checkpoint_parallel.h"

#include <chrono>
#include <exception>
#include <future>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem::runtime {
namespace {

using Json = nlohmann::json;

constexpr int kGatherTag = 7;

// An outcome as bytes for all_gather_bytes: "" for success, "E<message>" for a tandem::Error,
// "X<message>" for anything else.
std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return std::string("E") + e.what();
  } catch (const std::exception& e) {
    return std::string("X") + e.what();
  } catch (...) {
    return "Xan unknown exception";
  }
}

[[noreturn]] void throw_outcome(const std::string& outcome) {
  if (outcome[0] == 'E') throw Error(outcome.substr(1));
  throw std::runtime_error(outcome.substr(1));
}

// The weight of entry `e` and its two Adam moments, as checkpoint names and views.
struct OwnedEntry {
  Tensor weight, exp_avg, exp_avg_sq;
};

// The entries this rank owns in a checkpoint, by weight name: dense tensors on data-parallel
// rank 0, experts on expert-data-parallel rank 0 (they are equal on the other ranks of those
// groups after every step).
std::map<std::string, OwnedEntry> owned_entries(PipelineTrainer& trainer) {
  const Groups& g = trainer.groups();
  std::map<std::string, OwnedEntry> owned;
  for (const StageRuntime& s : trainer.stages()) {
    const NamedTensors weights = model_tensors(*s.params);  // in entry order, on the host
    // Note [Distributed optimizer]: a sharded optimizer's moments are made whole first (every
    // rank of the groups takes part), so the files are the plain optimizer's.
    const NamedTensors moments =
        s.shards ? moment_tensors(*s.params, s.shards->whole_state(s.optimizer->exp_avg()),
                                  s.shards->whole_state(s.optimizer->exp_avg_sq()))
                 : optimizer_tensors(*s.params, *s.optimizer);
    const std::vector<model::ParamEntry>& entries = s.params->entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      const model::ParamEntry& e = entries[i];
      const bool expert = e.shard == model::ParamShard::kExpert;
      if ((expert ? g.layout.edp_rank(g.rank) : g.layout.dp_rank(g.rank)) != 0) continue;
      owned[e.name] = {weights[i].second, moments[2 * i].second, moments[2 * i + 1].second};
    }
  }
  return owned;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

void run_agreeing(comm::Communicator& world, const std::function<void()>& fn) {
  std::string outcome;
  try {
    fn();
  } catch (...) {
    outcome = describe_exception(std::current_exception());
  }
  for (const std::string& o : world.all_gather_bytes(outcome)) {
    if (!o.empty()) throw_outcome(o);
  }
}

// Rank 0 holds a whole-model Parameters to receive the weights into: its entries give the whole
// model's order, which makes the files those of one rank. The order is sent to the other ranks
// (with the same collective that tells rank 0 who owns what), and each owner sends its tensors
// in it: weight, exp_avg, exp_avg_sq per entry, all on one tag, so the messages from one owner
// match in the order sent.
CheckpointState gather_checkpoint(PipelineTrainer& trainer, const Json& data) {
  Groups& g = trainer.groups();
  const ModelConfig& m = trainer.model_config();
  const DType dtype = trainer.stages().front().params->dtype();
  const std::map<std::string, OwnedEntry> owned = owned_entries(trainer);
  std::unique_ptr<model::Parameters> whole;
  std::vector<std::string> mine;
  if (g.rank == 0) {
    whole = std::make_unique<model::Parameters>(m, model::ChunkSpec::whole(m), dtype);
    for (const model::ParamEntry& e : whole->entries()) mine.push_back(e.name);  // the order
  } else {
    for (const auto& [name, entry] : owned) mine.push_back(name);
  }
  const std::vector<std::string> all = g.world->all_gather_bytes(join_lines(mine));
  const std::vector<std::string> order = split_lines(all[0]);
  if (g.rank != 0) {
    for (const std::string& name : order) {
      const auto it = owned.find(name);
      if (it == owned.end()) continue;
      for (const Tensor* t : {&it->second.weight, &it->second.exp_avg, &it->second.exp_avg_sq}) {
        g.world->send(*t, 0, kGatherTag);
      }
    }
    return CheckpointState{};
  }
  std::map<std::string, int> owner;
  for (const auto& [name, entry] : owned) owner[name] = 0;
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
    for (const std::string& name : split_lines(all[r])) {
      TANDEM_ASSERT(owner.emplace(name, r).second, name, " is owned by two ranks");
    }
  }
  TANDEM_ASSERT(owner.size() == order.size(), "the ranks own ", owner.size(), " of ", order.size(),
                " tensors");
  CheckpointState st;
  st.kind = CheckpointKind::kTandem;
  st.model_config = m;
  const Tensor m_flat =
      Tensor::empty({whole->numel()}, dtype, MemCategory::kOther, "gather.exp_avg");
  const Tensor v_flat =
      Tensor::empty({whole->numel()}, dtype, MemCategory::kOther, "gather.exp_avg_sq");
  for (const model::ParamEntry& e : whole->entries()) {
    const int64_t n = shape_numel(e.shape);
    OwnedEntry into{whole->param(e), m_flat.narrow_rows(e.offset, n).reshape(e.shape),
                    v_flat.narrow_rows(e.offset, n).reshape(e.shape)};
    const int from = owner.at(e.name);
    if (from == 0) {
      const OwnedEntry& local = owned.at(e.name);
      into.weight.copy_from(local.weight);
      into.exp_avg.copy_from(local.exp_avg);
      into.exp_avg_sq.copy_from(local.exp_avg_sq);
    } else {
      for (const Tensor* t : {&into.weight, &into.exp_avg, &into.exp_avg_sq}) {
        g.world->recv(*t, from, kGatherTag);
      }
    }
    st.model.emplace_back(e.name, into.weight);
    st.optimizer.emplace_back(e.name + ".exp_avg", into.exp_avg);
    st.optimizer.emplace_back(e.name + ".exp_avg_sq", into.exp_avg_sq);
  }
  // Every stage's AdamW has taken the same steps; rank 0 always holds a stage.
  const int64_t steps = trainer.stages().front().optimizer->steps();
  st.trainer_state =
      training_position_json(trainer.iteration(), steps, m, trainer.train_config(), data);
  return st;
}

// Note [Saving on rank 0]: the other ranks must not start the next step before the save is known
// to have succeeded (a failed save stops the run on every rank, with rank 0's message), but a
// large save can take longer than --comm-timeout, which bounds every wait for another rank. So
// rank 0 writes on a helper thread (which touches files only: MPI stays on this thread) and
// meanwhile sends "saving" every heartbeat_s; the others wait from one message to the next, each
// wait bounded as usual, until the outcome arrives: "ok" + the directory, or the error.
SavedCheckpoint save_checkpoint_parallel(const std::string& root, PipelineTrainer& trainer,
                                         const Json& data, int64_t keep, double heartbeat_s,
                                         int64_t max_shard_bytes) {
  comm::Communicator& world = *trainer.groups().world;
  const CheckpointState state = gather_checkpoint(trainer, data);
  static const std::string kSaving = "saving";
  if (world.rank() != 0) {
    for (;;) {
      const std::string outcome = world.all_gather_bytes("")[0];
      if (outcome == kSaving) continue;
      if (outcome.rfind("ok", 0) == 0) return SavedCheckpoint{outcome.substr(2), {}, {}};
      throw_outcome(outcome);
    }
  }
  std::future<SavedCheckpoint> pending = std::async(std::launch::async, [&] {
    return save_checkpoint(root, trainer.iteration(), state, keep, max_shard_bytes);
  });
  const auto beat = std::chrono::duration<double>(heartbeat_s);
  while (pending.wait_for(beat) != std::future_status::ready) world.all_gather_bytes(kSaving);
  SavedCheckpoint saved;
  std::string outcome;
  try {
    saved = pending.get();
    outcome = "ok" + saved.dir;
  } catch (...) {
    outcome = describe_exception(std::current_exception());
  }
  world.all_gather_bytes(outcome);
  if (outcome.rfind("ok", 0) != 0) throw_outcome(outcome);
  return saved;
}

int64_t restore_pipeline(PipelineTrainer& trainer, const CheckpointState& state) {
  std::vector<ChunkRef> chunks;
  for (StageRuntime& s : trainer.stages()) chunks.push_back({s.params.get(), s.optimizer.get()});
  const int64_t iteration = restore_chunks(chunks, trainer.train_config(), state);
  trainer.set_iteration(iteration);
  return iteration;
}

}  // namespace tandem::runtime
