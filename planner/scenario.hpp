// The fixed part of a planning question — model, hardware, cluster, training job — gathered from
// the command line (and an optional job document), with units and ranges checked at the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/accounting.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/sharding.hpp"

namespace CLI {
class App;  // <CLI/CLI.hpp>, included by the .cpp files that add the options
}  // namespace CLI

namespace shardplan::planner {

// The flags as the user gave them: nullopt when not given. A given value is used or refused,
// never replaced by a default (an empty --model, --gpus 0); numbers are read as decimal text
// (core/number_text.hpp).
struct ScenarioOptions {
  std::optional<std::string> model;  // preset or config.json (neither this nor params: the default)
  std::optional<std::string> params;  // a bare parameter count instead of a model ("7.5e9")
  std::optional<std::string> layers;  // blocks of a bare count (not given: derived)
  std::optional<std::string> hardware;
  std::optional<std::string> gpu_memory_GiB;  // replaces the profile's GPU memory
  std::optional<std::string> job_file;        // a training-job document; flags override its fields
  std::optional<std::string> gpus;
  std::optional<std::string> gpus_per_node;  // not given: the profile's
  std::optional<std::string> seq_len, global_batch, micro_batch;
  std::optional<std::string> precision, optimizer, checkpointing, attention, loss, recipe;
  std::optional<std::string> fsdp_mixed_precision;  // default | pure | full
  bool compile = false;                     // --compile: torch.compile as the recipe runs it
  std::optional<std::string> fsdp2_groups;  // root | ends (not given: the recipe's)
  std::optional<std::string> float8;        // none | rowwise | rowwise_with_gw_hp
  std::vector<std::string> float8_filter;   // module names Float8 skips
  std::optional<std::string> headroom;      // fraction of capacity kept free (default 0.05)
  std::optional<std::string> accounting;    // default framework
  // A config.json and a hardware profile already in memory, in place of --model and --hardware
  // (the Python module's dicts); refused beside the flag they replace.
  std::optional<nlohmann::json> model_document, hardware_document;
};

// clang-tidy 14 says its (noexcept) default constructor may throw: it follows nlohmann::json's
// noexcept default constructor into json_value(value_t), to a throw that null never reaches
// (llvm/llvm-project#54956: the analysis does not stop at noexcept).
struct Scenario {  // NOLINT(bugprone-exception-escape)
  documents::ModelSpec model;
  documents::HardwareProfile hardware;
  documents::Cluster cluster;
  documents::TrainingJob job;
  costmodel::Accounting accounting = costmodel::Accounting::framework;
  double headroom = 0.05;
  bool is_default = false;  // nothing was said: the built-in default job
  // What the user named (by flag or in the job document): the search keeps these as given.
  bool checkpointing_named = false, loss_named = false, attention_named = false;
  // Where the job's FSDP mixed precision was named ("--fsdp-mixed-precision" or the job file's
  // key), for the plans that cannot take it; empty when it was not.
  std::string fsdp_mixed_precision_field;
  // The profile's GPU memory when --gpu-memory-GiB replaced it (hardware.memory_bytes is the
  // override).
  std::optional<double> profile_memory_bytes;
  // The parts of the question the user left to the built-in defaults, as "--flag value".
  std::vector<std::string> defaulted;
  double usable_bytes() const { return hardware.memory_bytes * (1.0 - headroom); }
};

// The built-in default: llama-2-7b on 8 × a100-sxm4-80gb, seq 4096, 4 sequences per GPU.
inline constexpr const char* kDefaultModel = "llama-2-7b";
inline constexpr const char* kDefaultHardware = "a100-sxm4-80gb";
inline constexpr int kDefaultGpus = 8;
inline constexpr std::int64_t kDefaultSeqLen = 4096;
inline constexpr std::int64_t kDefaultSequencesPerGpu = 4;

void add_scenario_options(CLI::App& app, ScenarioOptions& o);
// Throws core::InputError. check_batch: the global batch must divide over every GPU (data
// parallelism alone); a plan with model parallelism checks it over its replicas instead.
Scenario make_scenario(const ScenarioOptions& o, bool check_batch = true);

// "not given, so defaulted: --hardware a100-sxm4-80gb, --gpus 8"; "" when the user gave them all.
std::string defaults_line(const Scenario& sc);
// How the hardware is read: the GPU memory (and its override) and the inter-node bandwidth per
// GPU and per node, with the profile key it came from.
std::string hardware_line(const Scenario& sc);
nlohmann::json hardware_json(const Scenario& sc);

// Strategy flags shared by estimate, simulate and compare, as given (nullopt: not given).
struct PlanOptions {
  std::optional<std::string> strategy;
  std::optional<std::string> flavour;
  std::optional<std::string> shard_group_size;   // not given: the GPUs per node
  std::optional<std::string> offload;            // not given: none
  std::optional<std::string> reduce_dtype;       // not given: the framework's default
  std::optional<std::string> backward_prefetch;  // FSDP1's: pre | none (not given: the recipe's)
  // DeepSpeed's: fused (its FusedAdam, from the config's optimizer section) | torch (a torch.optim
  // optimizer the script passes): ShardingSpec::torch_optimizer (not given: fused).
  std::optional<std::string> deepspeed_optimizer;
};
// --deepspeed-optimizer: whether the plan's DeepSpeed engine steps a torch.optim optimizer;
// refuses another name, and a plan that does not run DeepSpeed's engine.
bool torch_optimizer_from(const std::string& name, documents::Flavour flavour);
void add_plan_options(CLI::App& app, PlanOptions& o, bool strategy_required);
// What each option's value is, as --help shows it (core/option_types.hpp): the planner's table.
void name_option_types(CLI::App& app);
// --shard-group-size as a number (make_spec checks its range), or nullopt when not given.
std::optional<int> shard_group_size(const PlanOptions& o);
// The spec's dtypes as the framework sets them for the job when the user does not: under FSDP,
// the job's mixed precision mode or the recipe's (documents::FsdpMixedPrecision: the reduction
// in fp32 or the compute dtype, the parameters gathered in the compute dtype or, full, in fp32),
// fp32 reductions only under torchtitan (mixed_precision_reduce, "float32" only:
// torchtitan/config/job_config.py 0.2.x, configs.py 0.3.0); under DeepSpeed
// (engine.py, communication_data_type: the fp16/bf16 training dtype, else fp32), whose buckets
// hold 5e8 elements of their dtype (zero/config.py); DDP reduces the parameters' dtype, fp32
// under autocast. The spec's reduce bucket is in bytes from here on: the simulator and the
// executor take it as it is. FSDP1's backward prefetch is the recipe's
// (RecipeTraits::fsdp1_backward_prefetch).
documents::ShardingSpec with_job_precision(documents::ShardingSpec s,
                                           const documents::TrainingJob& job);
// --reduce-dtype: the gradients' reduction dtype the user set (FSDP's MixedPrecision
// reduce_dtype, DeepSpeed's communication_data_type), a DeepSpeed bucket resized to hold as many
// elements of it. Refused for DDP and the unwrapped run, which have no such setting, and for
// another dtype than fp32 under torchtitan.
documents::ShardingSpec with_reduce_dtype(documents::ShardingSpec s, const std::string& name,
                                          const documents::TrainingJob& job);
// --backward-prefetch: FSDP1's BackwardPrefetch as units gathered ahead in backward (pre: 1,
// BACKWARD_PRE; none: 0); refused for the other flavours, which have no such setting.
int backward_prefetch_units(const std::string& name, documents::Flavour flavour);
documents::ShardingSpec make_plan_spec(const PlanOptions& o, const std::string& strategy,
                                       const Scenario& sc);

}  // namespace shardplan::planner
