// Megatron-LM's options without a tandem setting of their own, and how each is taken
// (Note [Megatron-LM's other options] in cli/megatron_options.h).
#include "cli/megatron_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "cli/config_file.h"
#include "cli/helper_process.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/footprint.h"
#include "data/tokenizer.h"

namespace tandem::cli {
namespace {

constexpr MegatronKind kNeutral = MegatronKind::kNeutral;
constexpr MegatronKind kOnly = MegatronKind::kOnly;
constexpr MegatronKind kAlias = MegatronKind::kAlias;
constexpr MegatronKind kRefused = MegatronKind::kRefused;

const char* const kFusion = "a fused or unfused kernel computes the same values";
const char* const kFp8 =
    "FP8 training is not in tandem yet; train in bf16 (--device cuda) and leave the FP8 options "
    "out";
const char* const kRecompute =
    "what a step keeps for its backward, not its values: moe_act is tandem's --recompute-experts, "
    "mlp and shared_experts its --recompute, core_attn what tandem's attention keeps anyway; "
    "tandem keeps the other activations, and its planned memory counts them";

// --recompute-modules' names (Megatron-LM's TransformerConfig.recompute_modules).
const std::vector<std::string> kRecomputeModules = {
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"};

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

}  // namespace

const std::vector<MegatronOption>& megatron_options() {
  static const std::vector<MegatronOption> rows = {
      // Which implementation, fusion or kernel runs: the same values either way.
      {"use-mcore-models", false, kNeutral, {}, "tandem has one implementation of the model"},
      {"transformer-impl", true, kNeutral, {}, "tandem has one implementation of the model"},
      {"use-flash-attn", false, kNeutral, {}, "tandem's attention is exact on either kernel"},
      {"attention-backend", true, kNeutral, {}, "tandem's attention is exact on either kernel"},
      {"no-masked-softmax-fusion", false, kNeutral, {}, kFusion},
      {"no-bias-gelu-fusion", false, kNeutral, {}, kFusion},
      {"no-bias-swiglu-fusion", false, kNeutral, {}, kFusion},
      {"no-bias-dropout-fusion", false, kNeutral, {}, kFusion},
      {"no-rope-fusion", false, kNeutral, {}, kFusion},
      {"no-gradient-accumulation-fusion", false, kNeutral, {}, kFusion},
      {"no-persist-layer-norm", false, kNeutral, {}, kFusion},
      {"cross-entropy-loss-fusion", false, kNeutral, {}, kFusion},
      {"moe-grouped-gemm",
       false,
       kNeutral,
       {},
       "tandem picks grouped or per-expert products "
       "(--expert-grouped); the values are the same"},
      {"moe-use-legacy-grouped-gemm", false, kNeutral, {}, kFusion},
      {"moe-permute-fusion", false, kNeutral, {}, kFusion},
      {"no-async-tensor-model-parallel-allreduce",
       false,
       kNeutral,
       {},
       "a communication's timing, not its values"},
      {"moe-token-dispatcher-type",
       true,
       kNeutral,
       {},
       "how the tokens reach their experts (tandem: an all-to-all), not where they go"},
      {"moe-shared-expert-overlap",
       false,
       kNeutral,
       {},
       "tandem overlaps the all-to-all with other work by its schedule (combined-1f1b)"},
      {"delay-wgrad-compute",
       false,
       kNeutral,
       {},
       "when the weight gradients are formed, not their values; tandem's combined-1f1b orders "
       "them itself"},
      {"ddp-bucket-size", true, kNeutral, {}, "how gradients are grouped for their reduction"},
      {"empty-unused-memory-level",
       true,
       kNeutral,
       {},
       "tandem plans its memory and frees nothing mid-step"},
      {"manual-gc", false, kNeutral, {}, "Python's garbage collector; tandem has none"},
      // Data loading: how, not what.
      {"num-workers", true, kNeutral, {}, "tandem reads its samples on the training thread"},
      {"no-mmap-bin-files", false, kNeutral, {}, "tandem maps the files; the bytes are the same"},
      {"data-cache-path", true, kNeutral, {}, "tandem builds its sample index in memory"},
      {"no-create-attention-mask-in-dataloader",
       false,
       kNeutral,
       {},
       "tandem's attention is causal without a mask tensor"},
      {"reset-position-ids",
       false,
       kNeutral,
       {},
       "Megatron-LM's RoPE and YaRN rotate by the row's place in the sequence and never read "
       "the position ids it restarts (docs/megatron.md \"Document masking\"); tandem's "
       "--document-positions restarts them"},
      {"dataloader-type",
       true,
       kOnly,
       {"cyclic", "single"},
       "tandem's order of samples is fixed by --seed (docs/data.md), on every layout"},
      // Logging elsewhere.
      {"tensorboard-queue-size", true, kNeutral, {}, "tandem writes each event as it comes"},
      {"wandb-project",
       true,
       kNeutral,
       {},
       "tandem does not write to Weights & Biases (no network): its log line, --log-json and "
       "--tensorboard-dir carry the figures"},
      {"wandb-exp-name", true, kNeutral, {}, "as --wandb-project"},
      {"wandb-save-dir", true, kNeutral, {}, "as --wandb-project"},
      // Checkpoint formats: tandem writes its own (docs/checkpoints.md).
      {"ckpt-format",
       true,
       kOnly,
       {"torch", "torch_dist"},
       "tandem writes its own format (safetensors shards and a JSON record) whichever is named; "
       "a Megatron-LM checkpoint is refused by --load, which takes tandem's and transformers' "
       "(docs/checkpoints.md)"},
      {"auto-detect-ckpt-format",
       false,
       kNeutral,
       {},
       "--load tells tandem's checkpoints from transformers' itself"},
      {"dist-ckpt-strictness",
       true,
       kNeutral,
       {},
       "tandem loads strictly: a missing or extra tensor is refused"},
      // The one model tandem builds.
      {"swiglu", false, kNeutral, {}, "tandem's feed-forward layers are SwiGLU"},
      {"disable-bias-linear",
       false,
       kNeutral,
       {},
       "tandem's linear layers have no biases "
       "(Qwen2's q, k, v biases: --add-qkv-bias)"},
      {"group-query-attention",
       false,
       kNeutral,
       {},
       "tandem takes --num-query-groups as given (docs/megatron.md)"},
      {"use-rotary-position-embeddings", false, kNeutral, {}, "tandem's positions are RoPE"},
      {"no-position-embedding", false, kNeutral, {}, "tandem has no learned position table"},
      {"max-position-embeddings",
       true,
       kNeutral,
       {},
       "the size of a learned position table, which RoPE models have not"},
      {"bf16",
       false,
       kNeutral,
       {},
       "tandem's GPU training is bf16 mixed precision (f32 master weights and gradients); its "
       "CPU backend is the f32 reference"},
      {"grad-reduce-in-bf16",
       false,
       kNeutral,
       {},
       "tandem reduces gradients in f32, exact where bf16 would round"},
      {"normalization", true, kOnly, {"RMSNorm"}, "tandem's norms are RMSNorm"},
      {"position-embedding-type", true, kOnly, {"rope"}, "tandem's positions are RoPE"},
      {"rotary-percent", true, kOnly, {"1"}, "RoPE rotates each head's whole width"},
      {"attention-dropout", true, kOnly, {"0"}, "tandem has no dropout"},
      {"hidden-dropout", true, kOnly, {"0"}, "tandem has no dropout"},
      {"extra-vocab-size", true, kOnly, {"0"}, "the vocabulary is --vocab-size"},
      {"make-vocab-size-divisible-by",
       true,
       kAlias,
       {},
       "with --tokenizer-type NullTokenizer the vocabulary is padded to a multiple of this "
       "(128 when not given), as Megatron-LM pads it; otherwise --vocab-size must be a multiple"},
      {"tokenizer-type",
       true,
       kAlias,
       {},
       "the vocabulary's size (padded to --make-vocab-size-divisible-by) and end-of-document id "
       "from the tokenizer, as Megatron-LM takes them (Note [Megatron-LM's tokenizer vocabulary] "
       "in data/tokenizer.h): NullTokenizer (--vocab-size), HuggingFaceTokenizer, "
       "GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer"},
      {"tiktoken-pattern", true, kNeutral, {}, "a tiktoken tokenizer's; tandem reads none"},
      {"tokenizer-model",
       true,
       kAlias,
       {},
       "the tokenizer --tokenizer-type reads: a directory holding tokenizer.json (or the file) "
       "for HuggingFaceTokenizer, a sentencepiece model for the others"},
      // Parallelism tandem has at size 1 (docs/parallel.md).
      {"tp-comm-overlap",
       false,
       kRefused,
       {},
       "it overlaps tensor-parallel communication, which tandem does not have; leave it out"},
      {"context-parallel-size",
       true,
       kOnly,
       {"1"},
       "context parallelism is not in tandem yet: lay the model out with pipeline, expert and "
       "data parallelism (tandem plan --search)"},
      {"cp-comm-type", true, kNeutral, {}, "context parallelism's communication, at size 1 none"},
      {"expert-tensor-parallel-size",
       true,
       kOnly,
       {"1"},
       "tandem's experts are whole on their rank; spread them with --expert-model-parallel-size"},
      // Megatron-LM's names for tandem's schedules.
      {"overlap-moe-expert-parallel-comm",
       false,
       kAlias,
       {},
       "--schedule combined-1f1b: each micro-batch's expert all-to-all overlapped with another's "
       "compute"},
      {"num-layers-per-virtual-pipeline-stage",
       true,
       kAlias,
       {},
       "--virtual-pipeline-model-parallel-size num-layers / (pipeline size x N)"},
      {"pipeline-model-parallel-layout",
       true,
       kRefused,
       {},
       "give the first and last stages' layers with --decoder-first-pipeline-num-layers and "
       "--decoder-last-pipeline-num-layers; the stages between share the rest evenly"},
      {"account-for-embedding-in-pipeline-split",
       false,
       kRefused,
       {},
       "give the first stage's layers with --decoder-first-pipeline-num-layers"},
      {"account-for-loss-in-pipeline-split",
       false,
       kRefused,
       {},
       "give the last stage's layers with --decoder-last-pipeline-num-layers"},
      // What tandem does not have.
      {"fp16",
       false,
       kRefused,
       {},
       "tandem trains in bf16 mixed precision on GPUs (--device cuda; Megatron-LM's --bf16)"},
      {"fp8-format", true, kRefused, {}, kFp8},
      {"fp8-recipe", true, kRefused, {}, kFp8},
      {"fp8-amax-history-len", true, kRefused, {}, kFp8},
      {"fp8-amax-compute-algo", true, kRefused, {}, kFp8},
      {"fp8-margin", true, kRefused, {}, kFp8},
      {"fp8-param-gather", false, kRefused, {}, kFp8},
      {"first-last-layers-bf16", false, kRefused, {}, kFp8},
      {"num-layers-at-start-in-bf16", true, kRefused, {}, kFp8},
      {"num-layers-at-end-in-bf16", true, kRefused, {}, kFp8},
      // Recomputation changes what a step keeps, never its values (docs/megatron.md
      // "Recomputation"); apply_megatron_options takes moe_act as --recompute-experts, mlp and
      // shared_experts as --recompute, and megatron_recompute_note names what tandem keeps
      // instead.
      {"recompute-granularity", true, kOnly, {"selective", "full"}, kRecompute},
      {"recompute-method", true, kOnly, {"uniform", "block"}, kRecompute},
      {"recompute-num-layers", true, kNeutral, {}, kRecompute},
      {"recompute-modules", true, kAlias, {}, kRecompute, true},
      {"recompute-activations", false, kAlias, {}, kRecompute},
      {"moe-layer-recompute", false, kNeutral, {}, kRecompute},
      {"apply-layernorm-1p",
       false,
       kRefused,
       {},
       "tandem's norms keep their gains as they are (transformers' form); leave it out"},
  };
  return rows;
}

const std::vector<ModelMarker>& megatron_model_markers() {
  static const std::vector<ModelMarker> markers = {
      {"swiglu", "a GeLU feed-forward"},
      {"disable-bias-linear", "biases on every linear layer"},
      {"normalization", "LayerNorm"},
      {"position-embedding-type", "learned absolute positions"},
      {"attention-dropout", "dropout 0.1 on the attention"},
      {"hidden-dropout", "dropout 0.1 on the hidden states"},
  };
  return markers;
}

void add_megatron_options(CLI::App& app, std::map<std::string, std::string>& given) {
  for (const MegatronOption& m : megatron_options()) {
    const std::string flag = std::string("--") + m.name;
    std::string help = m.kind == kRefused ? std::string("refused: ") + m.note : m.note;
    if (m.kind == kOnly) {
      std::string values;
      for (const std::string& v : m.only) values += (values.empty() ? "" : ", ") + v;
      help += " (accepted: " + values + ")";
    }
    CLI::Option* o = nullptr;
    if (m.list) {
      o = app.add_option_function<std::vector<std::string>>(
          flag,
          [&given, name = std::string(m.name)](const std::vector<std::string>& v) {
            std::string joined;
            for (const std::string& x : v) joined += (joined.empty() ? "" : " ") + x;
            given[name] = joined;
          },
          help);
      o->expected(1, -1);
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // Note [Repeated options]
      o->type_name("NAME ...");
    } else if (m.takes_value) {
      o = app.add_option_function<std::string>(
          flag, [&given, name = std::string(m.name)](const std::string& v) { given[name] = v; },
          help);
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // Note [Repeated options]
      o->type_name(m.kind == kOnly ? "VALUE" : "ANY");
    } else {
      o = app.add_flag_callback(
          flag, [&given, name = std::string(m.name)] { given[name] = ""; }, help);
    }
    o->group("Megatron-LM's other options (docs/megatron.md)");
  }
}

namespace {

// Megatron-LM's vocabulary of a --tokenizer-type other than NullTokenizer and its
// --tokenizer-model (Note [Megatron-LM's tokenizer vocabulary] in data/tokenizer.h).
data::TokenizerVocab megatron_tokenizer_vocab(const std::string& type,
                                              const std::map<std::string, std::string>& given) {
  static const std::vector<std::string> kSentencePiece = {
      "GPTSentencePieceTokenizer", "Llama2Tokenizer", "SentencePieceTokenizer"};
  const bool sp =
      std::find(kSentencePiece.begin(), kSentencePiece.end(), type) != kSentencePiece.end();
  TANDEM_CHECK(sp || type == "HuggingFaceTokenizer", "--tokenizer-type ", type,
               " is not taken; tandem reads NullTokenizer, HuggingFaceTokenizer, ",
               join(kSentencePiece),
               " (or tokenize with `tandem convert` and train with --tokenizer-type NullTokenizer, "
               "docs/megatron.md)");
  const auto model = given.find("tokenizer-model");
  TANDEM_CHECK(model != given.end(), "--tokenizer-type ", type,
               " needs --tokenizer-model (the tokenizer to read the vocabulary from)");
  if (!sp) return data::hf_tokenizer_vocab(model->second);
  // Note [Tokenizers in a helper process] in cli/convert_command.cc.
  const std::string helper =
      beside_program("TANDEM_TOKENIZE", {"tandem-tokenize"}, "tandem-tokenize");
  const std::string line = helper_first_line(
      shell_quoted(helper) + " --vocab " + shell_quoted(type) + " " + shell_quoted(model->second),
      helper);
  const data::IdsHeader h = data::parse_ids_header(line, helper);
  return {h.vocab_size, h.eod_id};
}

bool same_value(const std::string& given, const std::string& valid) {
  if (given == valid) return true;
  char* end = nullptr;
  const double a = std::strtod(given.c_str(), &end);
  if (end == given.c_str() || *end != '\0') return false;
  const double b = std::strtod(valid.c_str(), &end);
  return a == b;
}

// The value `text` of --`name` as an integer in [1, most]; tandem::Error naming it otherwise.
long long whole_number(const std::string& name, const std::string& text, long long most,
                       const char* valid) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  TANDEM_CHECK(end != text.c_str() && *end == '\0' && errno == 0 && n >= 1 && n <= most, "--", name,
               " ", text, " is invalid: it must be ", valid);
  return n;
}

}  // namespace

void apply_megatron_options(RunOptions& o, const Origins& origins) {
  const std::map<std::string, std::string>& given = o.megatron;
  for (const MegatronOption& m : megatron_options()) {
    const auto it = given.find(m.name);
    if (it == given.end()) continue;
    TANDEM_CHECK(m.kind != kRefused, "--", m.name, " is not taken: ", m.note,
                 " (docs/megatron.md)");
    if (m.kind != kOnly) continue;
    bool ok = false;
    std::string values;
    for (const std::string& v : m.only) {
      ok = ok || same_value(it->second, v);
      values += (values.empty() ? "" : ", ") + v;
    }
    TANDEM_CHECK(ok, "--", m.name, " ", it->second, " is not taken: ", m.note, "; tandem takes ",
                 values, " (docs/megatron.md)");
  }
  long long divisor = 0;  // --make-vocab-size-divisible-by, 0 when not given
  if (const auto it = given.find("make-vocab-size-divisible-by"); it != given.end()) {
    divisor = whole_number(it->first, it->second, 1 << 20, "an integer in [1, 1048576]");
  }
  TANDEM_CHECK(given.count("tokenizer-model") == 0 || given.count("tokenizer-type") > 0,
               "--tokenizer-model needs --tokenizer-type (HuggingFaceTokenizer, "
               "GPTSentencePieceTokenizer, Llama2Tokenizer or SentencePieceTokenizer)");
  if (const auto type = given.find("tokenizer-type"); type != given.end()) {
    // Megatron-LM pads to a multiple of the divisor times the tensor-parallel size, so that each
    // tensor-parallel rank holds as many rows.
    const int64_t n = (divisor > 0 ? divisor : 128) * o.parallel.tensor_model_parallel_size;
    const auto padded = [n](int64_t rows) { return (rows + n - 1) / n * n; };
    if (type->second == "NullTokenizer") {
      // Megatron-LM's NullTokenizer takes ids below --vocab-size V and adds V as its
      // end-of-document id (the document options' unless --eod-token-id gives another); the
      // model's rows are V + 1 padded to the divisor.
      TANDEM_CHECK(given.count("tokenizer-model") == 0,
                   "--tokenizer-model is not read with --tokenizer-type NullTokenizer (its "
                   "vocabulary is --vocab-size): give one of them");
      if (o.train.eod_token_id < 0) o.train.eod_token_id = o.model.vocab_size;
      o.model.vocab_size = padded(o.model.vocab_size + 1);
    } else {
      const data::TokenizerVocab v = megatron_tokenizer_vocab(type->second, given);
      TANDEM_CHECK(!was_given(origins, "vocab-size") || o.model.vocab_size == padded(v.size),
                   "--vocab-size ", o.model.vocab_size,
                   " is not the vocabulary of --tokenizer-type ", type->second,
                   " --tokenizer-model ", given.at("tokenizer-model"), " (", v.size, " tokens, ",
                   padded(v.size), " rows padded, end-of-document id ", v.eod,
                   "): Megatron-LM takes the tokenizer's and ignores --vocab-size; leave it out");
      if (o.train.eod_token_id < 0) o.train.eod_token_id = v.eod;
      o.model.vocab_size = padded(v.size);
    }
  } else if (divisor > 0) {
    const long long n = divisor * o.parallel.tensor_model_parallel_size;
    TANDEM_CHECK(o.model.vocab_size % n == 0, "--make-vocab-size-divisible-by ", divisor,
                 " x --tensor-model-parallel-size ", o.parallel.tensor_model_parallel_size,
                 ": --vocab-size ", o.model.vocab_size, " is not a multiple of ", n,
                 ", and tandem does not pad the vocabulary (Megatron-LM "
                 "would train ",
                 (o.model.vocab_size + n - 1) / n * n,
                 " rows); give a --vocab-size that is a multiple (docs/megatron.md)");
  }
  for (const std::string& module : recompute_modules(given)) {
    TANDEM_CHECK(std::find(kRecomputeModules.begin(), kRecomputeModules.end(), module) !=
                     kRecomputeModules.end(),
                 "--recompute-modules ", module,
                 " is not a module Megatron-LM recomputes; valid: ", join(kRecomputeModules));
    if (module == "moe_act") {
      TANDEM_CHECK(!was_given(origins, "recompute-experts") || o.train.recompute_experts,
                   "--recompute-modules moe_act is --recompute-experts, which is given as false: "
                   "give one of them");
      o.train.recompute_experts = true;
    }
    if (module == "mlp" || module == "shared_experts") {  // Note [Recomputed modules]
      const uint32_t bit = parse_recompute(module);
      TANDEM_CHECK(!was_given(origins, "recompute") || (parse_recompute(o.train.recompute) & bit),
                   "--recompute-modules ", module, " is --recompute ", module,
                   ", which --recompute ", o.train.recompute, " leaves out: give one of them");
      if (!(parse_recompute(o.train.recompute) & bit)) {
        o.train.recompute += (o.train.recompute.empty() ? "" : ",") + module;
      }
    }
  }
  if (given.count("overlap-moe-expert-parallel-comm") > 0) {
    TANDEM_CHECK(!was_given(origins, "schedule") || o.parallel.schedule == "combined-1f1b",
                 "--overlap-moe-expert-parallel-comm is --schedule combined-1f1b, but --schedule ",
                 o.parallel.schedule, " is given too: give one of them");
    o.parallel.schedule = "combined-1f1b";
  }
  if (const auto it = given.find("num-layers-per-virtual-pipeline-stage"); it != given.end()) {
    const long long n = whole_number(it->first, it->second, LLONG_MAX, "an integer >= 1");
    TANDEM_CHECK(!was_given(origins, "virtual-pipeline-model-parallel-size"),
                 "--num-layers-per-virtual-pipeline-stage and "
                 "--virtual-pipeline-model-parallel-size both set the model chunks: give one");
    const int64_t pp = o.parallel.pipeline_model_parallel_size, layers = o.model.num_layers;
    TANDEM_CHECK(layers % (pp * n) == 0, "--num-layers-per-virtual-pipeline-stage ", n,
                 ": --num-layers ", layers, " is not a multiple of it times the ", pp,
                 " pipeline stages");
    o.parallel.virtual_pipeline_model_parallel_size = layers / (pp * n);
  }
}

std::vector<std::string> recompute_modules(const std::map<std::string, std::string>& given) {
  const auto granularity = given.find("recompute-granularity");
  const bool selective = given.count("recompute-activations") > 0 ||
                         (granularity != given.end() && granularity->second == "selective");
  if (!selective) return {};
  const auto modules = given.find("recompute-modules");
  if (modules == given.end()) return {"core_attn"};  // Megatron-LM's default
  std::vector<std::string> out;
  std::string word;
  for (char c : modules->second + " ") {
    if (c == ' ' || c == ',') {
      if (!word.empty()) out.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  return out;
}

std::string megatron_recompute_note(const std::map<std::string, std::string>& given) {
  std::string kept;
  const auto granularity = given.find("recompute-granularity");
  if (granularity != given.end() && granularity->second == "full") {
    kept = "whole layers (--recompute-granularity full)";
  }
  if (given.count("moe-layer-recompute") > 0) {
    kept += std::string(kept.empty() ? "" : ", ") + "the MoE layers (--moe-layer-recompute)";
  }
  for (const std::string& module : recompute_modules(given)) {
    if (module == "core_attn" || module == "moe_act" || module == "mlp" ||
        module == "shared_experts") {
      continue;  // what tandem does: its attention, --recompute-experts, --recompute
    }
    kept += std::string(kept.empty() ? "" : ", ") + module;
  }
  if (kept.empty()) return "";
  return "note: Megatron-LM would recompute " + kept +
         " in the backward; tandem keeps those activations (the same values; its planned memory "
         "counts them, docs/megatron.md)";
}

std::string megatron_model_note(const std::map<std::string, std::string>& given) {
  bool megatron = false;
  for (const MegatronOption& m : megatron_options()) {
    megatron = megatron || (given.count(m.name) > 0 && m.kind == kNeutral);
  }
  if (!megatron) return "";
  std::string missing;
  for (const ModelMarker& k : megatron_model_markers()) {
    if (given.count(k.name) > 0) continue;
    missing += std::string(missing.empty() ? "" : "; ") + "without --" + k.name + ", " +
               k.megatron_default;
  }
  if (missing.empty()) return "";
  return "note: Megatron-LM would build " + missing +
         "; tandem builds RMSNorm, SwiGLU and RoPE layers without biases or dropout "
         "(docs/megatron.md)";
}

}  // namespace tandem::cli
