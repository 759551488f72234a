#include "core/standard_output.hpp"
#include "planner/cli.hpp"

int main(int argc, char** argv) {
  return shardplan::core::finish_standard_output("planner",
                                                 shardplan::planner::run_cli(argc, argv));
}
