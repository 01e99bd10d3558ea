// Multi-rank checkpoints: gathering the owned tensors to rank 0 by name and saving there, or every
// rank writing its own tensors into one directory; restoring every rank's chunks; agreeing on
// errors.
#include "runtime/checkpoint_parallel.h"

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/test_faults.h"
#include "io/atomic_dir.h"

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

// The entries this rank owns in a checkpoint, by weight name in its stages' order: dense tensors
// on data-parallel rank 0, experts on expert-data-parallel rank 0 (they are equal on the other
// ranks of those groups after every step), and not a last stage's copy of a tied table.
std::vector<std::pair<std::string, OwnedEntry>> owned_entries(PipelineTrainer& trainer) {
  const Groups& g = trainer.groups();
  std::vector<std::pair<std::string, OwnedEntry>> owned;
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
      // Note [Tied embeddings]: the table is kept once, the first stage's; the copy loads from it.
      if (&e == s.params->tied_copy()) continue;
      const bool expert = e.shard == model::ParamShard::kExpert;
      if ((expert ? g.layout.edp_rank(g.rank) : g.layout.dp_rank(g.rank)) != 0) continue;
      owned.push_back(
          {e.name, {weights[i].second, moments[2 * i].second, moments[2 * i + 1].second}});
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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Note [Saving on rank 0]: the other ranks must not start the next step before the save is known
// to have succeeded (a failed save stops the run on every rank, with the failing rank's message),
// but a large save can take longer than --comm-timeout, which bounds every wait for another rank.
// So each rank runs its part of a save on a helper thread (which touches files only: MPI stays on
// this thread) and meanwhile the ranks exchange "still working" every heartbeat_s, each wait
// bounded as usual, until every rank has its outcome. Returns every rank's result; when any
// rank's `fn` threw, every rank throws the lowest such rank's error.
std::vector<std::string> agree_with_heartbeat(comm::Communicator& world, double heartbeat_s,
                                              const std::function<std::string()>& fn) {
  std::future<std::string> pending = std::async(std::launch::async, fn);
  const auto beat = std::chrono::duration<double>(heartbeat_s);
  std::string mine;  // "D" + result, or "F" + describe_exception; empty while working
  for (;;) {
    if (mine.empty() && pending.wait_for(beat) == std::future_status::ready) {
      try {
        mine = "D" + pending.get();
      } catch (...) {
        mine = "F" + describe_exception(std::current_exception());
      }
    }
    const std::vector<std::string> all = world.all_gather_bytes(mine.empty() ? "W" : mine);
    bool working = false;
    for (const std::string& o : all) working = working || o == "W";
    if (working) continue;
    std::vector<std::string> results;
    for (const std::string& o : all) {
      if (o[0] == 'F') throw_outcome(o.substr(1));
      results.push_back(o.substr(1));
    }
    return results;
  }
}

// The files in `dir` and their bytes (what a save wrote), as `w`'s.
void count_directory(const std::string& dir, RankWrite& w) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    w.files += 1;
    w.bytes += static_cast<int64_t>(e.file_size(ec));
  }
}

Json files_to_json(const std::vector<WrittenFile>& files) {
  Json out = Json::array();
  for (const WrittenFile& f : files) {
    out.push_back({{"file", f.file},
                   {"bytes", f.bytes},
                   {"crc32c", f.crc32c},
                   {"tensor_bytes", f.tensor_bytes},
                   {"tensors", f.tensors}});
  }
  return out;
}

std::vector<WrittenFile> files_from_json(const Json& j) {
  std::vector<WrittenFile> out;
  for (const Json& f : j) {
    out.push_back({f["file"].get<std::string>(), f["bytes"].get<int64_t>(),
                   f["crc32c"].get<std::string>(), f["tensor_bytes"].get<int64_t>(),
                   f["tensors"].get<std::vector<std::string>>()});
  }
  return out;
}

// Test hook (Note [Test faults]): TANDEM_TEST_SAVE_FAIL_RANK=R, world rank R fails after
// writing its weights.
void test_fail_rank(int rank) {
  if (test_faults().save_fail_rank == rank) {
    throw Error(detail::concat("tandem-test: rank ", rank, " failed to write its shards"));
  }
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
  std::map<std::string, OwnedEntry> owned;
  for (auto& [name, entry] : owned_entries(trainer)) owned.emplace(name, entry);
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

SavedCheckpoint save_checkpoint_parallel(const std::string& root, PipelineTrainer& trainer,
                                         const Json& data, int64_t keep, double heartbeat_s,
                                         int64_t max_shard_bytes) {
  const auto start = std::chrono::steady_clock::now();
  comm::Communicator& world = *trainer.groups().world;
  const CheckpointState state = gather_checkpoint(trainer, data);
  SavedCheckpoint saved;
  RankWrite write;
  // See Note [Saving on rank 0].
  saved.dir = agree_with_heartbeat(world, heartbeat_s, [&] {
    if (world.rank() != 0) return std::string();
    const auto t0 = std::chrono::steady_clock::now();
    saved = save_checkpoint(root, trainer.iteration(), state, keep, max_shard_bytes);
    write.seconds = seconds_since(t0);
    count_directory(saved.dir, write);
    return saved.dir;
  })[0];
  if (world.rank() == 0) {
    saved.writes = {write};
    saved.seconds = seconds_since(start);
  }
  return saved;
}

// Note [Fully parallel save]: every rank writes the tensors it owns (owned_entries) into one
// staging directory, which world rank 0 opens (open_checkpoint) and names to the others; it must
// be on a file system every rank sees. The ranks first exchange how many weight and optimizer
// files each will write, so the files get transformers' global names: rank r's weights are
// model-0000k-of-0000n.safetensors for k after the lower ranks' (a layout with one owner writes
// model.safetensors). Then each rank writes and reports its files (size, CRC-32C, tensor names)
// and rank 0 writes the indexes, config.json and trainer_state.json and commits the directory as
// one rank does (Note [Checkpoint commit]). Every phase ends with every rank's outcome
// (agree_with_heartbeat), so a failure on any rank stops every rank with its message before
// anything is committed, and rank 0's writer then removes the staging directory and whatever the
// ranks wrote there. No rank holds more than its own tensors.
SavedCheckpoint save_checkpoint_fully_parallel(const std::string& root, PipelineTrainer& trainer,
                                               const Json& data, int64_t keep, double heartbeat_s,
                                               int64_t max_shard_bytes) {
  TANDEM_CHECK(keep >= 0, "--keep-checkpoints ", keep,
               " is invalid: it must be >= 0 (0 keeps every checkpoint)");
  const auto start = std::chrono::steady_clock::now();
  comm::Communicator& world = *trainer.groups().world;
  const int rank = world.rank();
  NamedTensors model, optimizer;
  for (const auto& [name, e] : owned_entries(trainer)) {
    model.emplace_back(name, e.weight);
    optimizer.emplace_back(name + ".exp_avg", e.exp_avg);
    optimizer.emplace_back(name + ".exp_avg_sq", e.exp_avg_sq);
  }
  const int64_t iteration = trainer.iteration();
  std::unique_ptr<io::AtomicDirWriter> writer;  // rank 0's; removes the staging dir on failure
  const std::string staging = agree_with_heartbeat(world, heartbeat_s, [&] {
    if (rank != 0) return std::string();
    writer = open_checkpoint(root, iteration);
    return writer->tmp_dir();
  })[0];
  // Global shard numbers: this rank's come after the lower ranks'.
  const int64_t my_model = count_shards(model, max_shard_bytes);
  const int64_t my_optimizer = count_shards(optimizer, max_shard_bytes);
  const std::vector<std::string> counts =
      world.all_gather_bytes(std::to_string(my_model) + " " + std::to_string(my_optimizer));
  int64_t first_model = 0, first_optimizer = 0, total_model = 0, total_optimizer = 0;
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    std::istringstream in(counts[r]);
    int64_t m = 0, o = 0;
    in >> m >> o;
    if (r < rank) first_model += m, first_optimizer += o;
    total_model += m;
    total_optimizer += o;
  }
  const std::vector<std::string> reports = agree_with_heartbeat(world, heartbeat_s, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<WrittenFile> m =
        write_shards(staging, "model", model, first_model, total_model, max_shard_bytes);
    test_fail_rank(rank);
    const std::vector<WrittenFile> o = write_shards(
        staging, "optimizer", optimizer, first_optimizer, total_optimizer, max_shard_bytes);
    return Json{{"model", files_to_json(m)},
                {"optimizer", files_to_json(o)},
                {"seconds", seconds_since(t0)}}
        .dump();
  });
  SavedCheckpoint saved;
  saved.dir = agree_with_heartbeat(world, heartbeat_s, [&] {
    if (rank != 0) return std::string();
    std::vector<WrittenFile> model_files, optimizer_files;
    for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
      const Json report = Json::parse(reports[r]);
      RankWrite w{r, 0, 0, report["seconds"].get<double>()};
      for (const char* kind : {"model", "optimizer"}) {
        for (WrittenFile& f : files_from_json(report[kind])) {
          w.files += 1;
          w.bytes += f.bytes;
          (std::string(kind) == "model" ? model_files : optimizer_files).push_back(std::move(f));
        }
      }
      if (w.files > 0) saved.writes.push_back(w);
    }
    const ModelConfig& m = trainer.model_config();
    // Every stage's AdamW has taken the same steps; rank 0 always holds a stage.
    const int64_t steps = trainer.stages().front().optimizer->steps();
    const Json position = training_position_json(iteration, steps, m, trainer.train_config(), data);
    const SavedCheckpoint done = commit_checkpoint(*writer, root, iteration, m, position,
                                                   model_files, optimizer_files, keep);
    saved.removed = done.removed;
    saved.warnings = done.warnings;
    return done.dir;
  })[0];
  if (rank == 0) saved.seconds = seconds_since(start);
  return saved;
}

int64_t restore_pipeline(PipelineTrainer& trainer, const CheckpointState& state,
                         RestoreParts parts) {
  std::vector<ChunkRef> chunks;
  for (StageRuntime& s : trainer.stages()) chunks.push_back({s.params.get(), s.optimizer.get()});
  const int64_t iteration = restore_chunks(chunks, trainer.train_config(), state, parts);
  trainer.set_iteration(iteration);
  return iteration;
}

}  // namespace tandem::runtime
