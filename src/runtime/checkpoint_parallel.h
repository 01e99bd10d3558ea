// Checkpoints of a multi-rank run (PipelineTrainer): the same files one rank writes, gathered to
// world rank 0 by name, or every rank's own tensors written by that rank into one directory, and
// a restore in which every rank takes its chunks from a whole-model
// state, so a checkpoint moves freely between parallel layouts (Note [Checkpoint layout]).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/communicator.h"
#include "runtime/checkpoint.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {

// The run's whole state as one checkpoint on world rank 0: weights and Adam moments in the whole
// model's order and trainer_state as training_position_json, so the files are byte for byte
// those one rank writes for the same values. Each tensor comes from the rank that owns it
// (data-parallel rank 0 for dense tensors, expert-data-parallel rank 0 for experts). The other
// ranks get a state without tensors. Every rank must call it.
CheckpointState gather_checkpoint(PipelineTrainer& trainer, const nlohmann::json& data);

// Every rank calls it after the same step: gather_checkpoint, then rank 0 writes with
// save_checkpoint (Notes [Checkpoint layout], [Checkpoint commit]) while the others wait for the
// outcome (Note [Saving on rank 0] in checkpoint_parallel.cc). When rank 0's save fails, every
// rank throws its error with the same message (tandem::Error stays tandem::Error). Rank 0 gets
// what save_checkpoint returned (and its write time in `writes`), the others the directory only.
// `heartbeat_s` must be well below the communicators' timeout (--comm-timeout): rank 0 tells the
// others it is still writing that often, so a save may take longer than the timeout.
SavedCheckpoint save_checkpoint_parallel(const std::string& root, PipelineTrainer& trainer,
                                         const nlohmann::json& data, int64_t keep,
                                         double heartbeat_s,
                                         int64_t max_shard_bytes = kDefaultMaxShardBytes);

// The same checkpoint (the same tensors, configs and trainer state) with every rank writing the
// tensors it owns into its own shards of one directory, world rank 0 the indexes and
// trainer_state.json, committed as one rank commits (Note [Fully parallel save] in
// checkpoint_parallel.cc). Every rank must call it; a failure on any rank fails every rank with
// the lowest failing rank's message and commits nothing. Rank 0 gets the directory, retention's
// results, each writing rank's files, bytes and seconds (`writes`) and the whole save's seconds;
// the others the directory only. Test hook: with TANDEM_TEST_SAVE_FAIL_RANK=R in the environment,
// world rank R fails after writing its weight shards.
SavedCheckpoint save_checkpoint_fully_parallel(const std::string& root, PipelineTrainer& trainer,
                                               const nlohmann::json& data, int64_t keep,
                                               double heartbeat_s,
                                               int64_t max_shard_bytes = kDefaultMaxShardBytes);

// Restores this rank's stages from a whole-model `state` (restore_chunks: weights, Adam moments
// and steps, or weights only from a Hugging Face state) and sets the trainer's iteration, which
// it returns. Changes nothing when the checkpoint is rejected. Communicates with no rank.
int64_t restore_pipeline(PipelineTrainer& trainer, const CheckpointState& state,
                         RestoreParts parts = RestoreParts::kAll);

// Runs `fn` (which must not communicate) on every rank of `world`; when it throws on any rank,
// every rank throws the error of the lowest such rank, with its message: a tandem::Error as a
// tandem::Error, anything else as std::runtime_error. So a bad checkpoint that only some ranks
// notice (a weight only their chunk holds) stops every rank alike instead of leaving the rest
// waiting in the next collective.
void run_agreeing(comm::Communicator& world, const std::function<void()>& fn);

}  // namespace tandem::runtime
