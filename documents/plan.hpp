// The plan document: what `planner recommend --emit plan` writes and `executor --plan` runs. It is
// self-contained (the model's config.json is embedded) and carries the prediction, so that
// `planner validate` can compare it with what the executor measured.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "documents/breakdown.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "documents/sharding.hpp"

namespace shardplan::documents {

// What the planner predicted for the plan (the simulator's step: costmodel::prediction_from).
struct PlanPrediction {
  double peak_bytes = 0;
  Breakdown at_peak{};
  double step_s = 0;
  double compute_s = 0;
  double exposed_comm_s = 0;
  double comm_bytes_per_gpu = 0;
  std::string peak_when;
};

struct Plan {
  ModelSpec model;
  std::string hardware;  // profile name or path it was planned for
  Cluster cluster;
  // GPU memory per device in GiB when the plan was made for another size than the profile's
  // (planner --gpu-memory-GiB): the capacity the executor then checks against.
  // JSON: /capacity/gpu_memory_GiB, absent when the profile's size was used.
  std::optional<double> gpu_memory_GiB;
  TrainingJob job;    // micro_batch set
  ShardingSpec spec;  // the data-parallel strategy over world / (t·p·c) replicas
  // Tensor, pipeline and context parallelism. JSON: /parallel, written only when t·p·c > 1 (a
  // data-parallel plan's document is as before); read back with plan_parallel_from_json.
  ParallelLayout parallel;
  PlanPrediction prediction;
};

// The plan's /parallel object, the names the executor's flags use:
// {"tensor": t, "sequence_parallel": bool, "async_tensor_parallel": bool, "pipeline": p,
//  "schedule": "1f1b" | "interleaved-1f1b" | "gpipe", "virtual_stages": v, "micro_batches": m,
//  "context": c}. Every key is required when the object is there.
nlohmann::json plan_parallel_to_json(const ParallelLayout& l);
// Throws InputError naming the key's pointer under `pointer` and the value: an unknown key, a
// degree below 1, an unknown schedule, virtual stages without the interleaved schedule, sequence
// or async tensor parallelism without tensor parallel > 1. What depends on the model, job and
// cluster is checked by plan_from_json (layout_problems).
ParallelLayout plan_parallel_from_json(const nlohmann::json& j, const std::string& pointer);

nlohmann::json plan_to_json(const Plan& p);
Plan plan_from_json(const nlohmann::json& doc);  // throws InputError naming the JSON pointer

}  // namespace shardplan::documents
