// The measuring run of `calibrate` (its default command), under mpirun or srun: sweeps every
// requested collective on every requested group, fits each sweep, measures GEMMs and memory
// bandwidth, and writes the profile from rank 0.
#pragma once

#include <ostream>

#include "calibrate/options.hpp"

namespace shardplan::calibrate {

// Initializes and finalizes MPI. Returns the exit code: 0, 1 (wrong results, or a failure that
// ended the job), 2 (bad input, reported by rank 0). A failure on any rank is reported by that
// rank with its phase and ends every rank (MPI_Abort with 1); a rank without progress for
// options.timeout_s ends the job with 4 (comm/watchdog.hpp).
int run_measurement(const MeasureOptions& options, std::ostream& out, std::ostream& err);

} // namespace shardplan::calibrate
