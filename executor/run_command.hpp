// Running a plan: every rank of the plan (the CPU backend under MPI; the CUDA backend under MPI,
// torchrun or alone) or a rehearsal of one rank in one process (either backend).
// Each returns the exit code: 0 done, 2 bad input (one line on stderr, rank 0 only: every rank
// reads the same plan and fails alike), 3 out of memory under --gpu-memory-GiB (every rank that
// crosses the capacity prints its line; MPI_Abort then ends every rank with code 3, so none waits
// in a collective for a rank that has stopped), 1 anything else (MPI_Abort with 1 under MPI; the
// failing rank names itself and its phase), 4 no progress for --timeout-s (comm/watchdog.hpp).
#pragma once

#include "executor/command_line.hpp"

namespace shardplan::executor {

int run(const RunCommand& command);

}  // namespace shardplan::executor
