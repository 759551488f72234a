// The model-parallel part of the plan space: tensor parallel over the divisors of a node,
// pipeline stages over the divisors of the layers (1F1B, and interleaved with the chunk counts
// that divide a stage), context parallel over powers of two, with sequence parallelism on
// whenever t > 1 (the same bytes on the wire, activations split t ways), each with the
// data-parallel strategies over what is left, the activation checkpointing modes (none, selective
// attention where attention is eager, full; or the job's) and every micro-batch that divides a
// replica's batch.
// Pruning: a layout whose model states alone (no activations) exceed the usable memory is skipped
// with every micro-batch; within a layout, micro-batches grow until one does not fit (activations
// grow with it, nothing else does), and a mode with more recompute starts above the largest
// micro-batch a mode with less fitted (at the same micro-batch it is only slower). A walked
// pipeline whose step cannot be shorter than the `keep`-th fastest fitting plan found so far
// (costmodel::parallel_step_bound above it) is not walked: it cannot rank among them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/parallel_step.hpp"
#include "documents/recipe.hpp"
#include "planner/scenario.hpp"

#include <nlohmann/json.hpp>

namespace shardplan::planner {

struct LayoutCandidate {
  documents::ParallelLayout layout;
  documents::ShardingSpec spec;
  documents::TrainingJob job;  // with its micro-batch
  costmodel::ParallelStep result;
  bool fits = false;
};

struct LayoutSearch {
  std::vector<LayoutCandidate> ranked;                // fitting, fastest first (ties to lower peak)
  std::optional<LayoutCandidate> best_data_parallel;  // t = p = c = 1, fitting or the smallest peak
  long layouts = 0;                                   // layouts x strategies considered
  long evaluated = 0;                                 // evaluations run after pruning
  long outranked = 0;  // pipelines not walked: their bound above the keep-th fastest step
  int keep = 0;        // the fitting plans ranked exactly (0: all)
  double seconds = 0;
};

// The pipeline variants the search tries for p stages of `layers` blocks: one stage has no
// schedule; more run 1F1B, and interleaved with 2..8 chunks where the chunks divide a stage's
// blocks and the recipe's pipeline has it (RecipeTraits::schedules).
std::vector<std::pair<documents::PipelineSchedule, int>>
pipeline_variants(int p, std::int64_t layers, const documents::RecipeTraits& r);

// The strategies tried over the replicas: ddp, zero1 (DeepSpeed) and fsdp-full (FSDP2). `keep`:
// how many of the fastest fitting plans the caller uses (0: every one that fits, none passed
// over); `counts`, where given: which plans count among them (the ones a framework can run).
LayoutSearch search_layouts(const Scenario& sc, int keep,
                            const std::function<bool(const LayoutCandidate&)>& counts = {});

// Where FSDP over every GPU stops. The batch limit: a step's sequences per GPU (below one, or not
// dividing, some GPUs have nothing to run). The activation wall: FSDP (fsdp-full) at micro-batch 1
// without recompute, its peak and the activations in it. The exposed communication: of the best
// data-parallel plan the search found, what its collectives leave exposed.
struct FsdpLimits {
  double sequences_per_gpu = 0;
  bool batch_divides = false;
  double no_recompute_peak_bytes = 0, no_recompute_activation_bytes = 0;  // 0: not evaluated
  double best_exposed_s = 0, best_step_s = 0;                             // 0: no plan
};
FsdpLimits fsdp_limits(const Scenario& sc, const LayoutSearch& s);

}  // namespace shardplan::planner

namespace shardplan::planner {

// The table, with the best layout's torchtitan 0.3.0 options and Megatron-LM arguments on a line
// each (emit_parallel.hpp); the JSON has both for every ranked layout.
std::string layout_search_table(const Scenario& sc, const LayoutSearch& s, int top);
nlohmann::json layout_search_json(const Scenario& sc, const LayoutSearch& s, int top);

}  // namespace shardplan::planner
