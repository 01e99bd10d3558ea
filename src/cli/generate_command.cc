// `tandem generate`: loads a saved model and samples from it: the built-in addition task's
// held-out problems with the model's accuracy, or a continuation of --prompt; or, with
// --eval-tokens, prints the loss of a fixed batch (for tests/python/check_hf_load.py).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/addition.h"
#include "data/file_dataset.h"
#include "model/chunk.h"
#include "runtime/checkpoint.h"

namespace tandem::cli {
namespace {

struct GenerateOptions {
  std::string load_dir;
  std::string prompt;
  std::string eval_tokens;  // --eval-tokens FILE
  int64_t max_new_tokens = 32;
  int64_t num_problems = 200;
  int64_t show = 10;
  int max_digits = data::kAdditionDefaultMaxDigits;
  double temperature = 0;  // 0: greedy
  uint64_t seed = 1234;
};

// Picks the next token from one row of logits: argmax, or a sample at `temperature`.
int32_t pick_token(const float* logits, int64_t vocab, double temperature, uint64_t key,
                   uint64_t draw) {
  if (temperature <= 0)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  const float top = *std::max_element(logits, logits + vocab);
  std::vector<double> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += p[v] = std::exp((logits[v] - top) / temperature);
  double u = uniform01(key, draw) * sum;
  for (int64_t v = 0; v < vocab; ++v) {
    if ((u -= p[v]) <= 0) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(vocab - 1);
}

// Continues `prompt` (bytes as tokens) by up to max_new tokens, stopping after `stop`.
std::string complete(const model::ModelChunk& chunk, const std::string& prompt, int64_t max_new,
                     int stop, const GenerateOptions& o, uint64_t stream) {
  const ModelConfig& cfg = chunk.params().config();
  std::vector<int32_t> toks;
  for (const unsigned char byte : prompt) toks.push_back(byte);  // 0..255, never negative
  std::string out;
  for (int64_t i = 0; i < max_new; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(toks.size()) - cfg.seq_length);
    const int64_t seq = static_cast<int64_t>(toks.size()) - start;
    Tensor ids = Tensor::empty({seq}, DType::kI32, MemCategory::kOther, "generate.ids");
    std::copy(toks.begin() + start, toks.end(), ids.data<int32_t>());
    const Tensor logits = chunk.infer_logits(ids, 1, seq);  // (seq, V)
    const int32_t next =
        pick_token(logits.data<float>() + (seq - 1) * cfg.vocab_size, cfg.vocab_size, o.temperature,
                   stream, static_cast<uint64_t>(i));
    toks.push_back(next);
    out.push_back(static_cast<char>(next));
    if (next == stop) break;
  }
  return out;
}

// The sum of an addition problem as usually written: the answer read back, no leading zeros
// ("080" -> "80").
std::string plain_sum(const std::string& reversed) {
  std::string s(reversed.rbegin(), reversed.rend());
  const size_t first = s.find_first_not_of('0');
  return first == std::string::npos ? "0" : s.substr(first);
}

std::string printable(const std::string& s) {
  std::string r;
  for (char ch : s) r += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  return r;
}

// The rows of --eval-tokens: one sequence per line, token ids separated by white space, every
// line the same length, from 2 tokens up to a training sample's seq_length + 1 (the last token
// is only a target: no prediction is made from it); ids in [0, vocab).
std::vector<std::vector<int32_t>> read_token_rows(const std::string& path, const ModelConfig& cfg) {
  std::error_code ec;
  TANDEM_CHECK(std::filesystem::is_regular_file(path, ec), "--eval-tokens ", path,
               std::filesystem::exists(path, ec) ? ": not a regular file" : ": no such file",
               " (give a text file of token ids, one sequence per line)");
  std::ifstream in(path);
  TANDEM_CHECK(in.good(), "--eval-tokens ", path, ": cannot open the file");
  std::vector<std::vector<int32_t>> rows;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::vector<int32_t> row;
    for (std::string word; words >> word;) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
      }
      TANDEM_CHECK(used == word.size() && id >= 0 && id < cfg.vocab_size, "--eval-tokens ", path,
                   " line ", number, ": '", word, "' is not a token id; valid are integers 0 to ",
                   cfg.vocab_size - 1, " (the model's vocab size is ", cfg.vocab_size, ")");
      row.push_back(static_cast<int32_t>(id));
    }
    if (row.empty()) continue;
    TANDEM_CHECK(row.size() >= 2 && static_cast<int64_t>(row.size()) <= cfg.seq_length + 1,
                 "--eval-tokens ", path, " line ", number, " has ", row.size(),
                 " tokens; each line needs 2 to ", cfg.seq_length + 1,
                 " (a training sample: the sequence length the model was trained with, plus 1)");
    TANDEM_CHECK(rows.empty() || row.size() == rows[0].size(), "--eval-tokens ", path, " line ",
                 number, " has ", row.size(), " tokens but the first line has ", rows[0].size(),
                 "; every line (a row of the batch) must have the same length");
    rows.push_back(std::move(row));
  }
  TANDEM_CHECK(!rows.empty(), "--eval-tokens ", path,
               ": no token ids; write one sequence per line, ids separated by spaces");
  return rows;
}

// The mean next-token cross-entropy over every row and position (token t + 1 predicted from the
// tokens up to t), as Hugging Face computes the loss with labels = input ids; in double from the
// f32 logits. No router aux loss: transformers leaves it out unless output_router_logits is set.
double eval_loss(const model::ModelChunk& chunk, const std::vector<std::vector<int32_t>>& rows) {
  const int64_t batch = static_cast<int64_t>(rows.size());
  const int64_t seq = static_cast<int64_t>(rows[0].size());
  const int64_t vocab = chunk.params().config().vocab_size;
  Tensor ids = Tensor::empty({batch * seq}, DType::kI32, MemCategory::kOther, "eval.ids");
  for (int64_t r = 0; r < batch; ++r) {
    std::copy(rows[r].begin(), rows[r].end(), ids.data<int32_t>() + r * seq);
  }
  const Tensor logits = chunk.infer_logits(ids, batch, seq);  // (batch * seq, V) f32
  double sum = 0;
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t t = 0; t + 1 < seq; ++t) {
      const float* row = logits.data<float>() + (r * seq + t) * vocab;
      const double top = *std::max_element(row, row + vocab);
      double z = 0;
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v]) - top);
      sum += top + std::log(z) - static_cast<double>(row[rows[r][t + 1]]);
    }
  }
  return sum / static_cast<double>(batch * (seq - 1));
}

void run_generate(const GenerateOptions& o) {
  std::unique_ptr<model::Parameters> params = runtime::load_model_checkpoint(o.load_dir);
  const model::ModelChunk chunk(*params);
  if (!o.eval_tokens.empty()) {
    const std::vector<std::vector<int32_t>> rows = read_token_rows(o.eval_tokens, params->config());
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", eval_loss(chunk, rows));
    std::cout << "loss: " << text << " (" << rows.size() << " x " << rows[0].size()
              << " tokens, mean next-token cross-entropy)\n";
    return;
  }
  if (!o.prompt.empty()) {
    const int64_t vocab = params->config().vocab_size;
    for (const unsigned char byte : o.prompt) {
      TANDEM_CHECK(byte < vocab, "--prompt: its byte ", static_cast<int>(byte),
                   " is no token of the model in ", o.load_dir, " (vocab size ", vocab,
                   "): --prompt feeds bytes as tokens, so it needs a byte-level model (vocab "
                   ">= 256) or text of bytes below ",
                   vocab);
    }
    std::cout << o.prompt << complete(chunk, o.prompt, o.max_new_tokens, -1, o, o.seed) << "\n";
    return;
  }
  TANDEM_CHECK(params->config().vocab_size >= 256, "the model in ", o.load_dir, " has vocab size ",
               params->config().vocab_size,
               ": the addition task needs byte tokens (256); pass --prompt for other models");
  int64_t correct = 0;
  std::cout << "held-out addition problems (answers are written least significant digit first):\n";
  for (int64_t i = 0; i < o.num_problems; ++i) {
    const data::AdditionProblem p = data::make_eval_problem(o.seed, i, o.max_digits);
    const std::string got = complete(chunk, p.prompt, o.max_digits + 2, '\n', o, o.seed + i);
    const bool ok = data::score_addition_completion(p, got);
    correct += ok;
    if (i < o.show) {
      std::cout << "  " << p.prompt << printable(got) << (ok ? "   correct" : "   wrong, expected ")
                << (ok ? "" : p.answer) << "   (" << p.prompt << plain_sum(p.answer) << ")\n";
    }
  }
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.1f%%",
                100.0 * static_cast<double>(correct) / static_cast<double>(o.num_problems));
  std::cout << "accuracy " << correct << "/" << o.num_problems << " (" << percent
            << ") on held-out problems (the task's validation set: pairs never trained on)\n";
}

}  // namespace

void register_generate_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "generate",
      "Sample from a saved model: the addition task's held-out problems and accuracy, "
      "or a continuation of --prompt");
  auto o = std::make_shared<GenerateOptions>();
  sub->add_option("--load", o->load_dir, "Model directory written by `tandem train --save`")
      ->required();
  CLI::Option* prompt = sub->add_option("--prompt", o->prompt,
                                        "Text to continue (bytes as tokens) instead of the task");
  sub->add_option("--eval-tokens", o->eval_tokens,
                  "Instead of sampling, print the mean next-token cross-entropy of the token ids "
                  "in this file (one sequence per line, ids separated by spaces, all lines the "
                  "same length): the loss transformers computes with labels = input ids")
      ->excludes(prompt);
  sub->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate after --prompt")
      ->check(decimal_number(FieldBound::kPositive, false))
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--num-problems", o->num_problems, "Held-out addition problems to score")
      ->check(decimal_number(FieldBound::kPositive, false))
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--show", o->show, "How many of them to print")
      ->check(decimal_number(FieldBound::kNonNegative, false));
  sub->add_option("--max-digits", o->max_digits, "Operand digits of the addition problems")
      ->check(decimal_number(FieldBound::kPositive, false))
      ->check(CLI::Range(1, data::kAdditionMaxDigitsLimit));
  sub->add_option("--temperature", o->temperature, "Sampling temperature; 0 is greedy")
      ->check(finite_number(FieldBound::kNonNegative));
  sub->add_option("--seed", o->seed, "Seed of the problems and of sampling")
      ->check(decimal_number(FieldBound::kAny, true));
  sub->callback([sub, o] {
    TANDEM_CHECK(sub->count("--prompt") == 0 || !o->prompt.empty(),
                 "--prompt is empty: give the text to continue (e.g. --prompt \"12+34=\"), or "
                 "leave --prompt out for the addition task's held-out problems");
    run_generate(*o);
  });
}

}  // namespace tandem::cli
