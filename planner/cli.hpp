// The `planner` command line: subcommands over the planner library. Returns the exit code:
// 0 success, 2 bad input (one line on stderr naming the field and value), 1 internal error.
#pragma once

namespace shardplan::planner {
int run_cli(int argc, char** argv);
}
