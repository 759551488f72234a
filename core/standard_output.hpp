// The end of a program's standard output: what was written there (std::cout, C's stdout) is
// flushed and checked, so that a full disk or a closed pipe is an error and not a cut file with
// exit code 0 (`planner recommend --format json > /dev/full`).
#pragma once

#include <string_view>

namespace shardplan::core {

// Flushes standard output and returns exit_code when every write to it succeeded. Otherwise, when
// exit_code is 0, says "PROGRAM: standard output: cannot write: REASON" on standard error and
// returns 2 (like any destination that cannot be written); a failed program keeps its own code.
// Called once, at the end of main().
int finish_standard_output(std::string_view program, int exit_code);

}  // namespace shardplan::core
