// The tandem program: train, eval, plan, generate, convert. Only this file turns errors into exit
// codes: 0 success; 2 bad input, a tandem::Error or a command-line parse error
// (Note [Exit codes] in cli/options.cc); 1 an internal error, a tandem::InternalError (printed
// with the file and line that detected it) or any other exception.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "core/test_faults.h"

namespace {

// Note [Test faults] (core/test_faults.h): TANDEM_TEST_ERROR makes the program fail before it
// reads its command line (tests/cli/test_exit_codes.cc, tests/dist/test_tandem_mpi.cc).
void fail_if_a_test_asks() {
  const tandem::TestFaults f = tandem::test_faults();
  if (f.error.empty()) return;
  if (f.error_rank >= 0) {
    const char* mine = std::getenv("OMPI_COMM_WORLD_RANK");
    if (mine == nullptr || std::atoi(mine) != f.error_rank) return;
  }
  if (f.error == "internal") TANDEM_INTERNAL_ERROR("TANDEM_TEST_ERROR=", f.error, " asks for this");
  TANDEM_CHECK(f.error != "user", "TANDEM_TEST_ERROR=", f.error, " asks for this");
}

int run(int argc, char** argv) {
  fail_if_a_test_asks();
  CLI::App app{
      "tandem: trains Mixture-of-Experts transformers with pipeline, expert and data "
      "parallelism and the combined 1F1B schedule"};
  app.require_subcommand(1);
  tandem::cli::register_train_command(app);
  tandem::cli::register_generate_command(app);
  tandem::cli::register_eval_command(app);
  tandem::cli::register_convert_command(app);
  tandem::cli::register_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints CLI11's message and usage hint to stderr
    return 2;
  }
  return 0;
}

// Runs fn; what it throws becomes a message on stderr and an exit code.
int exit_code_of(const std::function<int()>& fn) {
  try {
    return fn();
  } catch (const tandem::Error& e) {
    std::fflush(stdout);
    std::cerr << "tandem: error: " << e.what() << "\n";
    return 2;
  } catch (const tandem::InternalError& e) {
    std::fflush(stdout);
    std::cerr << "tandem: internal error at " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "tandem: internal error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::fflush(stdout);
    std::cerr << "tandem: internal error: an exception of unknown type\n";
    return 1;
  }
}

}  // namespace

// Under mpirun every rank runs this main; an error on any rank ends the whole job (MPI_Abort with
// the same exit code), so no rank is left waiting for one that has stopped.
int main(int argc, char** argv) {
  const bool under_mpi = tandem::comm::launched_by_mpirun();
  bool mpi_up = false;
  const int code = exit_code_of([&] {
    if (under_mpi) mpi_up = tandem::comm::mpi_initialize(&argc, &argv);
    return run(argc, argv);
  });
  if (mpi_up) {
    if (code != 0) tandem::comm::mpi_abort(code);
    tandem::comm::mpi_finalize();
  }
  return code;
}
