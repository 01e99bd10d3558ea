// The run options' table (option_table.h): Megatron-LM's names, with help texts, bounds and
// choices, pointing into one RunOptions.
#include "cli/option_table.h"

#include "data/file_dataset.h"
#include "schedule/generators.h"

namespace tandem::cli {
namespace {

// The schedules' names, as the generators spell them.
// (Note [String options of an enumeration] in options.h.)
const std::vector<std::string> kSchedules = enum_name_list<schedule::ScheduleKind>();
const std::vector<std::string> kDataFormats = enum_name_list<data::DatasetFormat>();

void add_train_specs(std::vector<OptionSpec>& s, TrainConfig& t) {
  s.push_back(
      {"micro-batch-size", &t.micro_batch_size, "samples per micro-batch", Bound::kPositive});
  s.push_back({"global-batch-size", &t.global_batch_size,
               "samples per optimizer step; a multiple of micro-batch-size", Bound::kPositive});
  s.push_back({"train-iters", &t.train_iters, "optimizer steps to run", Bound::kPositive});
  s.push_back({"lr", &t.lr, "peak learning rate, reached after the warm-up", Bound::kPositive});
  s.push_back(
      {"min-lr", &t.min_lr, "learning rate at the end of the cosine decay", Bound::kNonNegative});
  s.push_back({"lr-warmup-iters", &t.lr_warmup_iters, "steps of linear learning-rate warm-up",
               Bound::kNonNegative});
  s.push_back({"lr-decay-iters", &t.lr_decay_iters,
               "steps of cosine decay; 0 decays over train-iters", Bound::kNonNegative});
  s.push_back(
      {"weight-decay", &t.weight_decay, "AdamW weight decay on matrices", Bound::kNonNegative});
  s.push_back({"adam-beta1", &t.adam_beta1, "AdamW beta1, in [0, 1)", Bound::kNonNegative});
  s.push_back({"adam-beta2", &t.adam_beta2, "AdamW beta2, in [0, 1)", Bound::kNonNegative});
  s.push_back({"adam-eps", &t.adam_eps, "AdamW epsilon", Bound::kPositive});
  s.push_back({"clip-grad", &t.clip_grad, "clip the global gradient norm to this; 0 turns it off",
               Bound::kNonNegative});
  s.push_back({"seed", &t.seed, "seed of initialisation and data order", Bound::kNonNegative});
  s.push_back({"log-interval", &t.log_interval, "steps between log lines", Bound::kPositive});
}

void add_run_specs(std::vector<OptionSpec>& s, RunOptions& o) {
  ParallelConfig& p = o.parallel;
  s.push_back({"pipeline-model-parallel-size", &p.pipeline_model_parallel_size,
               "PP, pipeline stages", Bound::kPositive});
  s.push_back({"expert-model-parallel-size", &p.expert_model_parallel_size,
               "EP, ranks the experts are spread over; divides num-experts", Bound::kPositive});
  s.push_back({"virtual-pipeline-model-parallel-size", &p.virtual_pipeline_model_parallel_size,
               "model chunks per pipeline rank (>= 2 for interleaved-1f1b)", Bound::kPositive});
  s.push_back({"decoder-first-pipeline-num-layers",
               &o.train.first_stage_layers,
               "layers of the first pipeline stage (the first model chunk with virtual stages); "
               "the stages between the first and the last share the rest evenly, for a layer "
               "count that does not split evenly (docs/parallel.md)",
               Bound::kNonNegative,
               {},
               "N",
               InFile::kAllowed,
               "an even share"});
  s.push_back({"decoder-last-pipeline-num-layers",
               &o.train.last_stage_layers,
               "layers of the last pipeline stage (the last model chunk with virtual stages)",
               Bound::kNonNegative,
               {},
               "N",
               InFile::kAllowed,
               "an even share"});
  s.push_back({"schedule", &p.schedule, "pipeline schedule", Bound::kAny, kSchedules});
  s.push_back({"pair-first-forwards", &p.pair_first_forwards,
               "combined-1f1b with one pipeline stage (expert parallelism): run the first two "
               "forwards as one pair, (0F0;0F1), so the first forward's all-to-all overlaps the "
               "second's compute; holds one more micro-batch's activations"});
  s.push_back({"num-microbatches", &o.num_microbatches,
               "micro-batches per step for `plan`; 0 derives it from the batch sizes",
               Bound::kNonNegative});
  s.push_back({"config",
               &o.config_file,
               "TOML file with these options as keys (`num-layers = 4`); the command line wins "
               "(default: none)",
               Bound::kAny,
               {},
               "FILE",
               InFile::kForbidden});
  s.push_back({"data-path",
               &o.data_path,
               "training data: a token or text file, or a Megatron .bin/.idx prefix (default: "
               "none, the built-in addition task)",
               Bound::kAny,
               {},
               "PATH"});
  s.push_back({"data-format", &o.data_format, "format of --data-path", Bound::kAny, kDataFormats});
  s.push_back({"mock-data", &o.mock_data,
               "train on uniformly random tokens in [0, --vocab-size) instead of a data set, as "
               "Megatron's --mock-data and torch_peer.py do (for benchmarks: random tokens spread "
               "over all experts, the addition task's few bytes do not)"});
  s.push_back({"save",
               &o.save_dir,
               "directory to save checkpoints to (default: none, no saving)",
               Bound::kAny,
               {},
               "DIR"});
  s.push_back({"save-interval", &o.save_interval,
               "steps between checkpoints; 0 saves only at the end when --save is set",
               Bound::kNonNegative});
  s.push_back({"load",
               &o.load_dir,
               "checkpoint to start from: a --save directory (its latest), one iter_NNNNNNN "
               "directory, or a Hugging Face checkpoint directory (weights only); model options "
               "not given are taken from it (default: none)",
               Bound::kAny,
               {},
               "DIR"});
  s.push_back({"max-shard-size",
               &o.max_shard_size,
               "the largest weights file a checkpoint writes: bigger models are saved as "
               "model-0000k-of-0000n.safetensors shards and model.safetensors.index.json, as "
               "transformers saves them (SIZE: 5GB, 500MB, 2GiB)",
               Bound::kAny,
               {},
               "SIZE"});
  s.push_back({"ckpt-fully-parallel-save", &o.ckpt_fully_parallel_save,
               "under mpirun, every rank writes the tensors it owns into its own shards of the "
               "checkpoint (weights and optimizer state, with indexes) instead of sending them to "
               "rank 0 to write; --save must be on a file system every rank sees"});
  s.push_back({"keep-checkpoints", &o.keep_checkpoints,
               "newest iteration directories kept under --save; older ones are deleted after a "
               "new one is complete",
               Bound::kPositive});
  s.push_back({"nan-policy", enum_target(&o.train.non_finite_policy),
               "when the loss or gradients are NaN or Inf: stop with an error naming the "
               "iteration, or skip that step's update",
               Bound::kAny});
  s.push_back({"log-json",
               &o.log_json,
               "write one JSON object per iteration to FILE (default: none)",
               Bound::kAny,
               {},
               "FILE"});
  s.push_back({"trace",
               &o.trace_path,
               "write the measured timeline as Chrome trace JSON to FILE (default: none)",
               Bound::kAny,
               {},
               "FILE"});
  s.push_back({"node-times-out",
               &o.node_times_out,
               "write each node kind's measured time (GPU runs, CUDA events; its median over the "
               "steps after the first, every rank's mean) as the JSON that `tandem plan "
               "--node-times` reads (default: none)",
               Bound::kAny,
               {},
               "FILE"});
  s.push_back({"routing-out",
               &o.routing_out,
               "MoE: write the rows each experts node received in the last step, "
               "for every rank's pipeline, as the JSON that `tandem plan --routing` reads "
               "(default: none)",
               Bound::kAny,
               {},
               "FILE"});
  s.push_back({"comm-overlap", enum_target(&o.comm_overlap),
               "combined-1f1b and dualpipev with expert parallelism: run the expert all-to-all "
               "on a communication stream of its own, overlapped with the other micro-batch's "
               "compute (on), or in order on the compute stream (off); split (GPUs): each "
               "micro-batch of a pair on a compute and a communication stream of its own",
               Bound::kAny});
  s.push_back({"device", enum_target(&o.train.device),
               "where to train: cpu (OpenBLAS, f32) or cuda (one GPU per process, bf16 "
               "activations, f32 master weights; needs a binary built with CUDA)",
               Bound::kAny});
  s.push_back({"quiet", &o.quiet, "no progress bar and no log lines"});
  s.push_back({"recompute-experts", &o.train.recompute_experts,
               "MoE: the experts keep only their input rows for the backward and form gate, up "
               "and the SwiGLU again there (less activation memory, one more pass of the gate "
               "and up products)"});
  s.push_back({"moe-wgrad-merge", &o.train.moe_wgrad_merge,
               "MoE: sum the experts' weight gradients of this many micro-batches in one product "
               "per expert (their rows gathered expert-major; the f32 gradients read and written "
               "once per N micro-batches instead of every one; the tensors of the waiting "
               "micro-batches stay until then: docs/memory.md); 1: each micro-batch's own",
               Bound::kPositive});
  s.push_back({"offload-activations",
               &o.train.offload_activations,
               "keep the tensors these nodes save for their backward in the host's memory from "
               "the end of a layer's forward until one layer before its backward, copied on "
               "streams of their own beside the compute (less device memory, the same results): "
               "a comma-separated list of attention, experts, shared-expert, combine, mlp "
               "(docs/memory.md)",
               Bound::kAny,
               {},
               "KINDS",
               InFile::kAllowed,
               "none"});
  s.push_back({"moe-router-force-load-balancing", &o.train.moe_router_force_balance,
               "MoE, for benchmarks only: route each token to k experts round-robin so every "
               "expert (and expert rank) gets the same rows; the router still weights them"});
  s.push_back({"defer-optimizer",
               &o.train.defer_optimizer,
               "run each step's AdamW update layer by layer inside the next "
               "step's first forward, just before it reads each layer's weights; on GPUs with "
               "expert parallelism and --comm-overlap, that forward's all-to-all then runs "
               "beside the update (the results do not change); --defer-optimizer=false: never",
               Bound::kAny,
               {},
               {},
               InFile::kAllowed,
               "on with --device cuda, --expert-model-parallel-size > 1 and --schedule "
               "combined-1f1b with --comm-overlap on or split, else off"});
  s.push_back({"overlap-grad-reduce", &o.train.overlap_grad_reduce,
               "with data parallelism: all-reduce each layer's gradients as soon "
               "as the step's backward has finished with that layer, beside the backward of the "
               "layers below it, instead of all of them after the backward; "
               "--overlap-grad-reduce=false: at the step's end"});
  s.push_back({"use-distributed-optimizer", &o.train.use_distributed_optimizer,
               "with data parallelism: split each weight's Adam moments over the "
               "ranks that replicate it (the data-parallel ranks; an expert's, its "
               "expert-data-parallel ranks); gradients are reduce-scattered, each rank updates "
               "its part and the weights are all-gathered; the results do not change"});
  s.push_back({"overlap-param-gather", &o.train.overlap_param_gather,
               "with --use-distributed-optimizer: all-gather each layer's updated weights just "
               "before the next step's forward reads them, instead of right after the update"});
  s.push_back({"rebalance-experts",
               &o.train.rebalance_experts,
               "MoE with expert parallelism: every N steps, lay each layer's experts out anew "
               "over the expert-parallel ranks so that each rank's experts take about the same "
               "rows (measured over those N steps), moving their weights and Adam moments; the "
               "results do not change; 0: never",
               Bound::kNonNegative,
               {},
               "N"});
  s.push_back({"addition-max-digits", &o.addition_max_digits,
               "operand digits of the built-in addition task (used without --data-path)",
               Bound::kPositive});
  s.push_back({"split",
               &o.split,
               "weights of --data-path's training, validation and test parts, as Megatron's "
               "--split: 969,30,1 trains on the first 96.9% of the documents (a Megatron "
               "index's; else of the tokens), validates on the next 3% (default: none, all "
               "trains)",
               Bound::kAny,
               {},
               "T,V,S"});
  s.push_back({"valid-data-path",
               &o.valid_data_path,
               "validation data of its own, in --data-format (default: none; then --split's "
               "part, or the built-in task's held-out problems)",
               Bound::kAny,
               {},
               "PATH"});
  s.push_back({"eval-iters",
               &o.eval_iters,
               "batches of --global-batch-size samples each validation runs forward, reporting "
               "their mean LM loss and its exp (valid loss, valid ppl); 0: no validation",
               Bound::kNonNegative,
               {},
               "N"});
  s.push_back({"eval-interval",
               &o.eval_interval,
               "steps between validations (with --eval-iters > 0); the last step's too",
               Bound::kPositive,
               {},
               "N"});
  s.push_back({"tensorboard-dir",
               &o.tensorboard_dir,
               "write TensorBoard event files of every step's figures and validations into DIR "
               "(made if missing; rank 0 writes) (default: none)",
               Bound::kAny,
               {},
               "DIR"});
  s.push_back({"comm-timeout", &o.comm_timeout_s,
               "seconds any rank waits for another before it stops with an error naming the "
               "operation and the peer",
               Bound::kPositive});
  s.push_back({"memory-available",
               &o.memory_available,
               "the memory each rank may hold (e.g. 80GiB, 141e9): `tandem train` refuses, "
               "before it allocates, a run whose planned peak is above it (`tandem plan` "
               "compares with --memory-limit) (default: what the device has: the GPU's free "
               "memory; on the CPU the machine's available memory shared by its ranks, within "
               "the process's limits)",
               Bound::kAny,
               {},
               "SIZE"});
}

}  // namespace

void add_model_specs(std::vector<OptionSpec>& s, ModelConfig& m) {
  for (const ModelField& f : model_fields()) {
    std::visit(
        [&](auto member) {
          s.push_back({f.name, &(m.*member), f.help, f.bound});
        },
        f.member);
  }
}

std::vector<OptionSpec> option_specs(RunOptions& o) {
  std::vector<OptionSpec> specs;
  add_model_specs(specs, o.model);
  add_train_specs(specs, o.train);
  add_run_specs(specs, o);
  return specs;
}

}  // namespace tandem::cli
