// `recommend --model-parallel --emit ...`: one layout of the search (tensor, pipeline and context
// parallelism with DDP, ZeRO-1 or FSDP over the replicas) as a framework runs it, or as the plan
// document the executor reads. Versions checked:
//   torchtitan 0.2.2 (torchtitan/config/job_config.py, class Parallelism; TOML for
//     --job.config_file) and 0.3.0 (torchtitan/config/configs.py, ParallelismConfig and
//     CompileConfig; tyro command-line options), both from PyPI;
//   Megatron-LM core_v0.19.0 (megatron/training/arguments.py; the arguments made from
//     megatron/core/model_parallel_config.py, transformer_config.py and
//     megatron/training/config/training_config.py, common_config.py by argument_utils.py);
//   DeepSpeed v0.19.5 (deepspeed/runtime/pipe/engine.py, deepspeed/runtime/config.py "pipeline",
//     deepspeed/runtime/tensor_parallel/config.py "tensor_parallel": {"autotp_size"}).
// A layout a framework cannot run is refused with the reason, never emitted wrong.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/parallel_search.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

enum class ParallelFramework { torchtitan, megatron, deepspeed };
const char* framework_name(ParallelFramework f);  // "torchtitan", "Megatron-LM", "DeepSpeed"
// The framework an --emit value names: "torchtitan", "megatron", "deepspeed"; none for "plan".
std::optional<ParallelFramework> emitted_framework(const std::string& emit);

// Why the framework cannot run the candidate as it was costed, one line ("" when it can).
std::string cannot_express(ParallelFramework f, const Scenario& sc, const LayoutCandidate& c);
// The fastest fitting layout the framework runs as costed; the lines that say why faster ones
// were passed over go to `notes`. Throws an InputError naming --emit when none is expressible.
const LayoutCandidate& expressible_layout(ParallelFramework f, const std::string& emit,
                                          const Scenario& sc, const LayoutSearch& found,
                                          std::vector<std::string>& notes);

// The plan document (costmodel/plan.hpp) with its /parallel object.
nlohmann::json layout_plan_document(const Scenario& sc, const LayoutCandidate& c);

// torchtitan: the 0.2.x TOML (or the line saying 0.2.x cannot run it) and the 0.3.0 command line.
std::string torchtitan_parallel_settings(const Scenario& sc, const LayoutCandidate& c);
// The 0.3.0 options on one line (the search table's "torchtitan:" line); "" when torchtitan
// cannot run the candidate.
std::string torchtitan_options(const Scenario& sc, const LayoutCandidate& c);
// Megatron-LM: the pretrain_gpt.py command line with the parallelism, batch and recompute
// arguments.
std::string megatron_parallel_arguments(const Scenario& sc, const LayoutCandidate& c);
// The same arguments on one line; "" when Megatron-LM cannot run the candidate.
std::string megatron_arguments(const Scenario& sc, const LayoutCandidate& c);
// DeepSpeed: the config for a pipeline over PipelineModule stages (tensor parallelism and
// context parallelism are refused by cannot_express).
nlohmann::json deepspeed_parallel_config(const Scenario& sc, const LayoutCandidate& c);
// The line that says how to build the PipelineModule ("" without a pipeline).
std::string deepspeed_pipeline_note(const Scenario& sc, const LayoutCandidate& c);

}  // namespace shardplan::planner
