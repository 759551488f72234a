// executor: runs a plan for real and writes what it measured (run_command.hpp; `planner validate`
// compares it with the prediction); scale-config writes the config.json of a scaled-down model
// for the planner. Exit codes: 0 done, 1 internal or MPI error, 2 bad input, 3 out of memory
// under --capacity-GiB.
#include <malloc.h>

#include <fstream>
#include <iostream>

#include "comm/process_identity.hpp"
#include "costmodel/input_error.hpp"
#include "executor/command_line.hpp"
#include "executor/run_command.hpp"
#include "executor/scale_config.hpp"

namespace {

int run(int argc, char** argv) {
  using namespace shardplan;
  executor::CommandLine cl;
  try {
    cl = executor::parse_command_line(argc, argv);
    switch (cl.command) {
    case executor::CommandLine::Command::help:
      std::cout << cl.help_text;
      return 0;
    case executor::CommandLine::Command::scale_config: {
      const auto config = executor::scaled_config(cl.scale_config.model, cl.scale_config.size);
      std::ofstream out(cl.scale_config.out);
      if (!(out << config.dump(2) << "\n"))
        throw costmodel::InputError("--out", "cannot write \"" + cl.scale_config.out + "\"");
      return 0;
    }
    case executor::CommandLine::Command::run:
      break;
    }
  } catch (const costmodel::InputError& e) {
    // Under mpirun every rank parses the same command line: one of them says so.
    if (comm::launcher_rank_from_environment() == 0)
      std::cerr << "executor: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "executor: internal error: " << e.what() << "\n";
    return 1;
  }
  return cl.run.rehearse_rank ? executor::run_rehearsal(cl.run) : executor::run_under_mpi(cl.run);
}

} // namespace

int main(int argc, char** argv) {
  // Keep freed buffers in the process's heap for the next step, as a framework's caching
  // allocator keeps them on a GPU: without this, glibc returns every large buffer to the kernel
  // when it is freed and the next step pays page faults and zeroing for all of them again
  // (mallopt(3): M_MMAP_MAX 0 serves every allocation from the heap, M_TRIM_THRESHOLD keeps the
  // heap's free top). The tracked allocator's accounting does not depend on it.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  return run(argc, argv);
}
