// The addition task's held-out problems as a data set (addition_held_out.h).
#include "data/addition_held_out.h"

#include <algorithm>

#include "core/error.h"
#include "data/addition.h"

namespace tandem::data {

AdditionHeldOutDataset::AdditionHeldOutDataset(uint64_t seed, int max_digits)
    : seed_(seed), max_digits_(max_digits) {
  (void)addition_max_problem_length(max_digits);  // checks max_digits
}

void AdditionHeldOutDataset::sample(int64_t index, int32_t* out, int64_t length) const {
  TANDEM_CHECK(index >= 0, "held-out addition sample index ", index,
               " is invalid: it must be >= 0");
  TANDEM_CHECK(length >= 0, "held-out addition sample length ", length,
               " is invalid: it must be >= 0");
  const int64_t problem = addition_max_problem_length(max_digits_);
  const int64_t per_sample = std::max<int64_t>(1, (length + problem - 1) / problem);
  int64_t filled = 0;
  for (int64_t k = 0; filled < length; ++k) {
    const AdditionProblem p = make_eval_problem(seed_, index * per_sample + k, max_digits_);
    const std::string text = p.prompt + p.answer + "\n";
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(text.size()), length - filled);
    for (int64_t i = 0; i < n; ++i) out[filled + i] = static_cast<unsigned char>(text[i]);
    filled += n;
  }
}

std::string AdditionHeldOutDataset::describe() const {
  return "the held-out problems of the addition task (max_digits " + std::to_string(max_digits_) +
         ", seed " + std::to_string(seed_) + ")";
}

}  // namespace tandem::data
