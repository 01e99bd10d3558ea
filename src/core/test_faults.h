// Note [Test faults]: the environment variables with which tests make the program fail on
// purpose, read in this one place. None of them is a setting: a run without them is a
// normal run, and no user needs them.
//   TANDEM_TEST_ERROR=internal|user[,rank=R]  fail that way before the command line is read
//                                             (only on world rank R under mpirun)
//   TANDEM_FAULT=rank=R,iter=I,mode=M         on world rank R before step I: exit (M exit), hang
//                                             (M hang), or NaN gradients in step I (M nan)
//   TANDEM_TEST_POISON_GRAD_ITER=I            NaN gradients in step I on every rank
//   TANDEM_TEST_SAVE_FAIL_RANK=R              world rank R fails after writing its checkpoint
//                                             shards
//   TANDEM_TEST_SAVE_DELAY_MS=N               a save announces each stage on stderr and waits N
//   TANDEM_TEST_SAVE_DELAY_STAGE=S            ms, at stage S only when this is set
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct TestFaults {
  std::string error;    // TANDEM_TEST_ERROR: "internal" or "user"; "" none
  int error_rank = -1;  // its ",rank=R"; -1: every rank
  int fault_rank = -1;  // TANDEM_FAULT
  int64_t fault_iteration = -1;
  std::string fault_mode;              // exit | hang | nan
  int64_t poison_grad_iteration = -1;  // TANDEM_TEST_POISON_GRAD_ITER
  int save_fail_rank = -1;             // TANDEM_TEST_SAVE_FAIL_RANK
  int64_t save_delay_ms = -1;          // TANDEM_TEST_SAVE_DELAY_MS; -1: saves do not announce
  std::string save_delay_stage;        // TANDEM_TEST_SAVE_DELAY_STAGE; "": every stage
};

// The test faults the environment asks for now (read at each call: in-process tests set the
// variables between runs).
TestFaults test_faults();

}  // namespace tandem
