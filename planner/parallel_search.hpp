// The model-parallel part of the plan space: tensor parallel over the divisors of a node,
// pipeline stages over the divisors of the layers (1F1B, and interleaved with the chunk counts
// that divide a stage), context parallel over powers of two, with sequence parallelism on
// whenever t > 1 (the same bytes on the wire, activations split t ways), each with the
// data-parallel strategies over what is left and every micro-batch that divides a replica's batch.
// Pruning: a layout whose model states alone (no activations) exceed the usable memory is skipped
// with every micro-batch; within a layout, micro-batches grow until one does not fit (activations
// grow with it, nothing else does).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "costmodel/parallel_step.hpp"
#include "planner/scenario.hpp"

#include <nlohmann/json.hpp>

namespace shardplan::planner {

struct LayoutCandidate {
  costmodel::ParallelLayout layout;
  costmodel::ShardingSpec spec;
  costmodel::TrainingJob job;  // with its micro-batch
  costmodel::ParallelStep result;
  bool fits = false;
};

struct LayoutSearch {
  std::vector<LayoutCandidate> ranked;                // fitting, fastest first (ties to lower peak)
  std::optional<LayoutCandidate> best_data_parallel;  // t = p = c = 1, fitting or the smallest peak
  long layouts = 0;                                   // layouts x strategies considered
  long evaluated = 0;                                 // evaluations run after pruning
  double seconds = 0;
};

// The strategies tried over the replicas: ddp, zero1 (DeepSpeed) and fsdp-full (FSDP2).
LayoutSearch search_layouts(const Scenario& sc);

}  // namespace shardplan::planner

namespace shardplan::planner {

// The launch options for a candidate. torchtitan (its Parallelism section, as command-line
// options from 0.2 on: torchtitan/config/job_config.py): data-parallel replicate/shard degrees,
// tensor (torchtitan's TP plan always shards the norms over the sequence), async TP, pipeline
// degree, schedule ("1F1B", "Interleaved1F1B", "GPipe"), layers per (virtual) stage, micro-batch
// size, context degree. Empty when the data-parallel strategy is not one torchtitan runs (ZeRO-1).
std::string torchtitan_options(const Scenario& sc, const LayoutCandidate& c);
// Megatron-LM's arguments (megatron/training/arguments.py): --tensor-model-parallel-size,
// --sequence-parallel, --tp-comm-overlap, --pipeline-model-parallel-size,
// --num-layers-per-virtual-pipeline-stage, --context-parallel-size, --micro-batch-size,
// --global-batch-size, --use-distributed-optimizer (ZeRO-1). Empty for FSDP.
std::string megatron_arguments(const Scenario& sc, const LayoutCandidate& c);

std::string layout_search_table(const Scenario& sc, const LayoutSearch& s, int top);
nlohmann::json layout_search_json(const Scenario& sc, const LayoutSearch& s, int top);

}  // namespace shardplan::planner
