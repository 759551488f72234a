// The command line of `executor` (parsing only; every rejection is an InputError naming the flag
// and the value, which main turns into one line and exit code 2):
//
//   mpirun -np N executor --plan plan.json --steps K --out run.json [--gpu-memory-GiB X]
//                         [--backend cpu|cuda]   (cuda: one GPU per rank, under mpirun, under
//                          torchrun --no-python, or one process alone)
//                         [--layers L --hidden H --heads A --kv-heads K
//                          --intermediate I --vocab V --seq-len S] [--seed S]
//                         [--lr LR] [--prefetch-as-planned] [--collective-streams] [--timeout-s T]
//                         [--inject-fault crash|hang|oom|throw@RANK:STEP]   (tests only)
//                         [--save DIR [--save-every K] [--overwrite]] [--resume DIR]
//                          (checkpoint.hpp)
//                         [--pipeline-parallel P [--schedule 1f1b|gpipe] [--micro-batches M]]
//                          (pipeline_run.hpp)
//   executor --plan plan.json --rehearse-rank r --world N --out run.json [...]
//   executor scale-config --model M --layers L --hidden H --heads A [--kv-heads K] [--head-dim D]
//                         [--intermediate I] --vocab V [--max-positions P] --out config.json
//   executor consolidate DIR --out model.bin   (a checkpoint's fp32 parameters in model order)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "comm/fault_injection.hpp"
#include "executor/checkpoint.hpp"
#include "executor/pipeline_run.hpp"
#include "executor/run_setup.hpp"
#include "executor/scaled_model.hpp"

namespace shardplan::executor {

// Where the ranks compute: the CPU backend (MPI, host memory) or the CUDA backend (one GPU per
// rank, NCCL, executor/cuda/).
enum class ComputeBackend { cpu, cuda };

struct RunCommand {
  ComputeBackend backend = ComputeBackend::cpu;
  std::string plan;
  std::string out;
  RunRequest request;
  std::optional<double> capacity_GiB;  // on a GPU: the most bytes its memory pool may reserve
  std::optional<int> rehearse_rank;
  std::optional<int> world;  // with --rehearse-rank
  double timeout_s = 300;    // a rank without progress for this long ends the job (watchdog)
  std::optional<comm::FaultInjection> fault;  // --inject-fault, for the tests of the above
  CheckpointOptions checkpoint;               // --save, --save-every, --overwrite, --resume
  PipelineFlags pipeline;  // --pipeline-parallel, --schedule, --micro-batches (pipeline_run.hpp)
};

struct ScaleConfigCommand {
  std::string model;
  ScaledSize size;
  std::string out;
};

struct ConsolidateCommand {
  std::string dir;  // the checkpoint
  std::string out;  // model.bin
};

struct CommandLine {
  enum class Command { run, scale_config, consolidate, help };
  Command command = Command::run;
  RunCommand run;
  ScaleConfigCommand scale_config;
  ConsolidateCommand consolidate;
  std::string help_text;
};

// Throws core::InputError.
CommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace shardplan::executor
