// The measuring run of `calibrate` (its default command): sweeps every requested collective on
// every requested group, fits each sweep, measures GEMMs, the model's attention core
// (--attention-seq) and memory bandwidth, and writes the profile from rank 0. Its ranks come from
// mpirun or srun (MPI), or, for --backend nccl, from the environment torchrun sets when that is set
// or the build has no MPI (a process started by hand is then rank 0 of 1).
#pragma once

#include <ostream>

#include "calibrate/options.hpp"

namespace shardplan::calibrate {

// Initializes and finalizes MPI, or joins the ranks through NCCL alone. Returns the exit code: 0,
// 1 (wrong results, or a failure that ended the job), 2 (bad input, reported by rank 0). A failure
// on any rank is reported by that rank with its phase and ends it with 1 (under MPI every rank:
// MPI_Abort; under torchrun the launcher ends the others); a rank without progress for
// options.timeout_s ends the job with 4 (comm/watchdog.hpp).
int run_measurement(const MeasureOptions& options, std::ostream& out, std::ostream& err);

}  // namespace shardplan::calibrate
