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

// The flags as the user gave them: nullopt when not given. A given value is used or refused,
// never replaced by a default (an empty --model, --gpus 0); numbers are read as decimal text
// (costmodel/number_text.hpp).
struct ScenarioOptions {
  std::optional<std::string> model;     // preset or config.json (neither this nor params: the default)
  std::optional<std::string> params;    // a bare parameter count instead of a model ("7.5e9")
  std::optional<std::string> layers;    // blocks of a bare count (not given: derived)
  std::optional<std::string> hardware;
  std::optional<std::string> job_file;  // a training-job document; flags override its fields
  std::optional<std::string> gpus;
  std::optional<std::string> gpus_per_node;  // not given: the profile's
  std::optional<std::string> seq_len, global_batch, micro_batch;
  std::optional<std::string> precision, optimizer, checkpointing, attention, loss, recipe;
  std::optional<std::string> headroom;  // fraction of capacity kept free (default 0.05)
  std::optional<std::string> accounting;  // default framework
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

// Strategy flags shared by estimate, simulate and compare, as given (nullopt: not given).
struct PlanOptions {
  std::optional<std::string> strategy;
  std::optional<std::string> flavour;
  std::optional<std::string> shard_group_size;  // not given: the GPUs per node
  std::optional<std::string> offload;           // not given: none
};
void add_plan_options(CLI::App& app, PlanOptions& o, bool strategy_required);
// --shard-group-size as a number (make_spec checks its range), or nullopt when not given.
std::optional<int> shard_group_size(const PlanOptions& o);
costmodel::ShardingSpec make_plan_spec(const PlanOptions& o, const std::string& strategy,
                                       const Scenario& sc);

}  // namespace shardplan::planner
