// executor: runs a plan for real and writes what it measured (run_command.hpp; `planner validate`
// compares it with the prediction); scale-config writes the config.json of a scaled-down model
// for the planner; consolidate writes a checkpoint's fp32 parameters (checkpoint.hpp). Exit codes:
// 0 done, 1 internal or MPI error (or a rank failed), 2 bad input (a bad checkpoint too),
// 3 out of memory under --gpu-memory-GiB, 4 a rank made no progress for --timeout-s (a crashed rank
// ends the job with its signal: mpirun returns 128 + the signal number).
#include <malloc.h>

#include <iostream>

#include "comm/process_identity.hpp"
#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "core/standard_output.hpp"
#include "core/text.hpp"
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
      core::write_file(cl.scale_config.out, core::json_text(config, 2) + "\n", "--out");
      return 0;
    }
    case executor::CommandLine::Command::consolidate: {
      core::check_destination(cl.consolidate.out, "--out");
      const auto c = executor::consolidate_checkpoint(cl.consolidate.dir, cl.consolidate.out);
      std::cerr << "executor: wrote " << cl.consolidate.out << ": " << c.params
                << " fp32 parameters of step " << c.step << ", sha256 " << c.sha256 << "\n";
      return 0;
    }
    case executor::CommandLine::Command::run:
      break;
    }
  } catch (const core::InputError& e) {
    // Under mpirun every rank parses the same command line: one of them says so.
    if (comm::launcher_rank_from_environment() == 0) std::cerr << "executor: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "executor: internal error: " << e.what() << "\n";
    return 1;
  }
  try {
    return executor::run(cl.run);
  } catch (const core::InputError& e) {  // refused before any rank started
    if (comm::launcher_rank_from_environment() == 0) std::cerr << "executor: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Keep freed buffers in the process's heap for the next step, as a framework's caching
  // allocator keeps them on a GPU: without this, glibc returns every large buffer to the kernel
  // when it is freed and the next step pays page faults and zeroing for all of them again
  // (mallopt(3): M_MMAP_MAX 0 serves every allocation from the heap, M_TRIM_THRESHOLD keeps the
  // heap's free top). The tracked allocator's accounting does not depend on it.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  return shardplan::core::finish_standard_output("executor", run(argc, argv));
}
