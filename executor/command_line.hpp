// The command line of `executor` (parsing only; every rejection is an InputError naming the flag
// and the value, which main turns into one line and exit code 2):
//
//   mpirun -np N executor --plan plan.json --steps K --out run.json [--capacity-GiB X]
//                         [--scale-layers L --scale-hidden H --scale-heads A --scale-kv-heads K
//                          --scale-intermediate I --scale-vocab V --scale-seq S] [--seed S]
//                         [--lr LR] [--prefetch-as-planned]
//   executor --plan plan.json --rehearse-rank r --world N --out run.json [...]
//   executor scale-config --model M --layers L --hidden H --heads A [--kv-heads K] [--head-dim D]
//                         [--intermediate I] --vocab V [--max-positions P] --out config.json
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "executor/run_setup.hpp"
#include "executor/scaled_model.hpp"

namespace shardplan::executor {

struct RunCommand {
  std::string plan;
  std::string out;
  RunRequest request;
  std::optional<double> capacity_GiB;
  std::optional<int> rehearse_rank;
  std::optional<int> world; // with --rehearse-rank
};

struct ScaleConfigCommand {
  std::string model;
  ScaledSize size;
  std::string out;
};

struct CommandLine {
  enum class Command { run, scale_config, help };
  Command command = Command::run;
  RunCommand run;
  ScaleConfigCommand scale_config;
  std::string help_text;
};

// Throws costmodel::InputError.
CommandLine parse_command_line(int argc, const char* const* argv);

} // namespace shardplan::executor
