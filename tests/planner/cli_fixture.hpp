// Runs the planner's command line in this process and keeps what it printed and its exit code.
#pragma once

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "planner/cli.hpp"

namespace shardplan::planner::testing {

struct Run {
  int code;
  std::string out, err;
};

inline Run planner(std::vector<std::string> args) {
  args.insert(args.begin(), "planner");
  std::vector<char*> argv;
  argv.reserve(args.size());
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  const int code = run_cli(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return {code, out.str(), err.str()};
}

// `planner estimate ARGS --format json`, which must succeed (its stderr shown where it does not).
inline nlohmann::json estimate(std::vector<std::string> args) {
  args.insert(args.begin(), "estimate");
  args.insert(args.end(), {"--format", "json"});
  const auto r = planner(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(r.out);
}

}  // namespace shardplan::planner::testing
