// Note [Test faults] (core/test_faults.h): the environment, read.
#include "core/test_faults.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tandem {
TestFaults test_faults() {
  TestFaults f;
  if (const char* spec = std::getenv("TANDEM_TEST_ERROR"); spec != nullptr && *spec != '\0') {
    f.error.assign(spec, std::strcspn(spec, ","));
    if (const char* rank = std::strstr(spec, ",rank=")) f.error_rank = std::atoi(rank + 6);
  }
  if (const char* spec = std::getenv("TANDEM_FAULT")) {
    int r = -1;
    long long it = -1;
    char mode[16] = {0};
    if (std::sscanf(spec, "rank=%d,iter=%lld,mode=%15s", &r, &it, mode) == 3) {
      f.fault_rank = r;
      f.fault_iteration = static_cast<int64_t>(it);
      f.fault_mode = mode;
    }
  }
  if (const char* it = std::getenv("TANDEM_TEST_POISON_GRAD_ITER")) {
    f.poison_grad_iteration = std::atoll(it);
  }
  if (const char* rank = std::getenv("TANDEM_TEST_SAVE_FAIL_RANK")) {
    f.save_fail_rank = std::atoi(rank);
  }
  if (const char* ms = std::getenv("TANDEM_TEST_SAVE_DELAY_MS")) f.save_delay_ms = std::atoll(ms);
  if (const char* stage = std::getenv("TANDEM_TEST_SAVE_DELAY_STAGE")) f.save_delay_stage = stage;
  return f;
}

}  // namespace tandem
