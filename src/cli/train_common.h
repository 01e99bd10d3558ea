// Pieces of `tandem train` around its loop (train_command.cc), shared with `tandem eval`
// (eval_command.cc): the device, the world and the layout, the data set, the progress settings,
// the check that every rank was started alike, and the test-only fault injection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cli/options.h"
#include "cli/progress.h"
#include "comm/communicator.h"
#include "data/dataset.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/action.h"
#include "schedule/generators.h"

namespace tandem::cli {

// Layouts of several ranks need mpirun; --node-times-out needs a GPU, --routing-out experts.
void check_supported(const RunOptions& o);
// Opens the GPU for --device cuda (one GPU per process: under mpirun, the rank's local index).
void open_device(const RunOptions& o);
// "the CPU", or the GPU's name and memory.
std::string device_text(Device device);
// The world: MPI's under mpirun, else this process alone (no MPI needed).
std::unique_ptr<comm::Communicator> make_world(const RunOptions& o);

// This rank's groups over `world` and the validated schedule of the options' layout.
struct RunLayout {
  std::unique_ptr<runtime::Groups> groups;  // the trainer keeps a pointer: it must not move
  schedule::ScheduleShape shape;
  schedule::Schedule sched;
};
RunLayout make_layout(std::unique_ptr<comm::Communicator> world, RunOptions& o);

// The built-in addition task without --data-path, else the file in its format (its training
// part under --split).
std::unique_ptr<data::Dataset> make_dataset(const RunOptions& o);
// The progress reporter's settings from the options.
ReporterConfig reporter_config(const RunOptions& o);
// One step's figures for the progress output (memory as a one-rank list).
IterationRecord to_record(const runtime::StepResult& r);

// Throws on every rank when any rank was started with other settings, naming the first key
// that differs and both values.
void check_same_config(comm::Communicator& world, const RunOptions& o);

// The training loop's test faults (Note [Test faults] in core/test_faults.h):
//   TANDEM_FAULT="rank=R,iter=I,mode=exit|hang|nan": rank R dies or hangs before step I, so
//     tests can show that the other ranks stop with an error instead of hanging; or (nan) the
//     first gradient element of rank R's first stage becomes NaN after step I's gradient
//     reduction, a copy the other ranks do not see (Note [Non-finite steps on several ranks] in
//     runtime/grad_reduce.cc);
//   TANDEM_TEST_POISON_GRAD_ITER=I: that NaN on every rank at step I.
// The NaN faults, as the trainer's after-backward hook.
void install_test_faults(runtime::PipelineTrainer& trainer);
// The exit and hang faults, before step `iteration` (1-based) of world rank `rank`.
void test_faults_before_step(int rank, int64_t iteration);

}  // namespace tandem::cli
