// The fixed part of a planning question — model, hardware, cluster, training job — gathered from
// the command line (and an optional job document), with units and ranges checked at the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "costmodel/accounting.hpp"
#include "costmodel/hardware.hpp"
#include "costmodel/job.hpp"
#include "costmodel/model.hpp"
#include "costmodel/sharding.hpp"

namespace shardplan::planner {

struct ScenarioOptions {
  std::string model;          // preset or config.json; empty with params == 0: the default
  double params = 0;          // a bare parameter count instead of a model
  std::int64_t layers = 0;    // blocks for a bare count (0: derived)
  std::string hardware;
  std::string job_file;       // a training-job document; flags override its fields
  int gpus = 0;
  int gpus_per_node = 0;      // 0: the profile's
  std::int64_t seq_len = 0;
  std::int64_t global_batch = 0;
  std::int64_t micro_batch = 0;
  std::string precision, optimizer, checkpointing, attention, loss, recipe;
  double headroom = 0.05;     // fraction of capacity kept free
  std::string accounting = "framework";
};

struct Scenario {
  costmodel::ModelSpec model;
  costmodel::HardwareProfile hardware;
  costmodel::Cluster cluster;
  costmodel::TrainingJob job;
  costmodel::Accounting accounting = costmodel::Accounting::framework;
  double headroom = 0.05;
  bool is_default = false;    // nothing was said: the built-in default job
  // What the user named (by flag or in the job document): the search keeps these as given.
  bool checkpointing_named = false, loss_named = false;
  double usable_bytes() const { return hardware.memory_bytes * (1.0 - headroom); }
};

// The built-in default: llama-2-7b on 8 × a100-sxm4-80gb, seq 4096, 4 sequences per GPU.
inline constexpr const char* kDefaultModel = "llama-2-7b";
inline constexpr const char* kDefaultHardware = "a100-sxm4-80gb";
inline constexpr int kDefaultGpus = 8;
inline constexpr std::int64_t kDefaultSeqLen = 4096;
inline constexpr std::int64_t kDefaultSequencesPerGpu = 4;

void add_scenario_options(CLI::App& app, ScenarioOptions& o);
Scenario make_scenario(const ScenarioOptions& o);  // throws costmodel::InputError

// Strategy flags shared by estimate, simulate and compare.
struct PlanOptions {
  std::string strategy;
  std::string flavour;
  int shard_group_size = 0;
  std::string offload = "none";
};
void add_plan_options(CLI::App& app, PlanOptions& o, bool strategy_required);
costmodel::ShardingSpec make_plan_spec(const PlanOptions& o, const std::string& strategy,
                                       const Scenario& sc);

}  // namespace shardplan::planner
