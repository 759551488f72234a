#include "planner/cli.hpp"

int main(int argc, char** argv) { return shardplan::planner::run_cli(argc, argv); }
