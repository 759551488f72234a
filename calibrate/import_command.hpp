// `calibrate import-nccl-tests LOG...`: fits the tables of nccl-tests logs as a measuring run
// fits its own sweeps, and writes the calibration section (merged into --into PROFILE, or alone).
#pragma once

#include <ostream>

#include "calibrate/options.hpp"

namespace shardplan::calibrate {

// Returns the exit code; throws core::InputError for bad logs, flags or files.
int run_import(const ImportOptions& options, std::ostream& out);

}  // namespace shardplan::calibrate
