// The tandem program: train, plan, generate, convert. Only this file turns errors into exit
// codes: 0 success, 2 bad input (a tandem::Error or a command-line parse error), 1 anything else.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <iostream>

#include "cli/commands.h"
#include "comm/mpi_communicator.h"
#include "core/error.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"tandem: trains Mixture-of-Experts transformers with pipeline, expert and data "
               "parallelism and the combined 1F1B schedule"};
  app.require_subcommand(1);
  tandem::cli::register_train_command(app);
  tandem::cli::register_generate_command(app);
  tandem::cli::register_convert_command(app);
#ifdef TANDEM_HAVE_PLAN
  tandem::cli::register_plan_command(app);
#endif
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
  } catch (const tandem::Error& e) {
    std::fflush(stdout);
    std::cerr << "tandem: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "tandem: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

// Under mpirun every rank runs this main; an error on any rank ends the whole job (MPI_Abort with
// the same exit code), so no rank is left waiting for one that has stopped.
int main(int argc, char** argv) {
  const bool under_mpi = tandem::comm::launched_by_mpirun();
  if (under_mpi) tandem::comm::mpi_initialize(&argc, &argv);
  const int code = run(argc, argv);
  if (under_mpi) {
    if (code != 0) tandem::comm::mpi_abort(code);
    tandem::comm::mpi_finalize();
  }
  return code;
}
