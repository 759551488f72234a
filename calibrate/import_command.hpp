// `calibrate import-nccl-tests LOG...`: fits the tables of nccl-tests logs as a measuring run
// fits its own sweeps, and writes the calibration section (merged into --into PROFILE, or alone).
#pragma once

#include <ostream>

#include "calibrate/options.hpp"

namespace shardplan::calibrate {

// Returns the exit code; throws core::InputError for bad logs, flags or files. `out` receives the
// document when it goes to standard output (no --out and no --into, or `-o -`) and nothing else;
// the fits and what was written go to `notes`, so that `out` parses as JSON.
int run_import(const ImportOptions& options, std::ostream& out, std::ostream& notes);

}  // namespace shardplan::calibrate
