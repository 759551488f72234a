// The plan document: what `planner recommend --emit plan` writes and `executor --plan` runs. It is
// self-contained (the model's config.json is embedded) and carries the prediction, so that
// `planner validate` can compare it with what the executor measured.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/job.hpp"
#include "costmodel/model.hpp"
#include "costmodel/sharding.hpp"
#include "costmodel/simulator.hpp"

namespace shardplan::costmodel {

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
  TrainingJob job;  // micro_batch set
  ShardingSpec spec;
  PlanPrediction prediction;
};

nlohmann::json plan_to_json(const Plan& p);
Plan plan_from_json(const nlohmann::json& doc);  // throws InputError naming the JSON pointer
PlanPrediction prediction_from(const StepResult& r);

}  // namespace shardplan::costmodel
