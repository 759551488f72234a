// calibrate: measures a cluster's collectives, GEMMs and memory bandwidth and writes a hardware
// profile; or fits nccl-tests logs. Under mpirun or torchrun, only rank 0 reports bad input.
#include <cstdio>
#include <exception>
#include <iostream>

#include <fmt/format.h>

#include "calibrate/import_command.hpp"
#include "calibrate/options.hpp"
#include "comm/launch_env.hpp"
#include "comm/process_identity.hpp"
#include "core/input_error.hpp"
#include "core/standard_output.hpp"

#if defined(SHARDPLAN_HAVE_MPI) || defined(SHARDPLAN_HAVE_NCCL)
#define SHARDPLAN_CALIBRATE_MEASURES 1
#include "calibrate/measure_command.hpp"
#endif

namespace {

// This process's rank as its launcher numbered it: torchrun's RANK, else mpirun's or srun's, else
// 0 (a process started by hand, or a RANK that is not a rank: then every process reports).
int launcher_rank() {
  using namespace shardplan;
  if (comm::launched_with_torchrun_environment()) {
    try {
      return comm::read_launch_environment().rank;
    } catch (const core::InputError&) {
      return 0;
    }
  }
  return comm::launcher_rank_from_environment();
}

int run(int argc, char** argv) {
  using namespace shardplan;
  const bool reports = launcher_rank() == 0;
  calibrate::CommandLine command_line;
  try {
    command_line = calibrate::parse_command_line(argc, argv);
    if (command_line.command == calibrate::CommandLine::Command::measure)
      calibrate::require_backend(command_line.measure.backend);
  } catch (const core::InputError& e) {
    if (reports) fmt::print(stderr, "calibrate: {}\n", e.what());
    return 2;
  }
  switch (command_line.command) {
  case calibrate::CommandLine::Command::help:
    if (reports) std::cout << command_line.help_text;
    return 0;
  case calibrate::CommandLine::Command::import_logs:
  case calibrate::CommandLine::Command::import_overheads:
    try {
      return command_line.command == calibrate::CommandLine::Command::import_logs
                 ? calibrate::run_import(command_line.import, std::cout, std::cerr)
                 : calibrate::run_import_overheads(command_line.overheads, std::cout);
    } catch (const core::InputError& e) {
      fmt::print(stderr, "calibrate: {}\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      fmt::print(stderr, "calibrate: error: {}\n", e.what());
      return 1;
    }
  case calibrate::CommandLine::Command::measure:
#if defined(SHARDPLAN_CALIBRATE_MEASURES)
    try {
      return calibrate::run_measurement(command_line.measure, std::cout, std::cerr);
    } catch (const std::exception& e) {  // MPI could not even start
      fmt::print(stderr, "calibrate: error: {}\n", e.what());
      return 1;
    }
#else
    break;  // require_backend rejects every backend in a build without MPI and NCCL
#endif
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  return shardplan::core::finish_standard_output("calibrate", run(argc, argv));
}
