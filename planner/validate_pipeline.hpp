// `planner validate` of a pipeline-parallel run (executor --pipeline-parallel P, its document kind
// "executor pipeline run", executor/pipeline_run.hpp): per stage, the cost model's peak for the
// run's layout (costmodel/parallel_memory.hpp, from the plan's model, job, strategy and hardware
// with the run's stages, schedule, micro-batches and micro-batch) against the peak measured on
// the stage's ranks (the largest of them); which stage holds the peak, predicted and measured;
// the step time, predicted by the parallel step model (costmodel/parallel_step.hpp) where the
// plan's hardware profile can be loaded, against the median of the run's steps (rank 0's).
// rel_error = (predicted − measured) / measured, as validate.hpp's.
//
// JSON: {"kind": "pipeline", "plan": {...}, "pipeline": {pipeline_parallel, data_parallel,
// schedule, micro_batches, micro_batch, seq_len}, "stages": [{stage, predicted_bytes,
// measured_bytes, rel_error, in_flight}], "memory": {peak_stage_predicted, peak_stage_measured,
// peak_predicted_bytes, peak_measured_bytes, peak_rel_error, peak_predicted_name}, "time":
// {step_predicted_s (null without a profile), step_measured_s, step_rel_error, steps},
// "notes": [...], "schema_version": 1}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "documents/hardware.hpp"

namespace shardplan::planner {

// Whether the run document is a pipeline run's (its /kind).
bool is_pipeline_run(const nlohmann::json& run_document);

// Throws core::InputError naming the run's JSON pointer of a missing or malformed field (a
// stage count that is not /pipeline/pipeline_parallel, ranks that are not stages × data-parallel
// ranks, an unknown schedule, no steps), and of the first field that says the run is not of this
// plan (/model, /world), with both values; force compares anyway. hardware: the profile to
// predict the stages with (planner validate --hardware); nullptr: the plan's /hardware preset,
// or none when it is not one here (memory without per-device overheads, no step time; a note
// says so).
nlohmann::json validate_pipeline_json(const nlohmann::json& plan_document,
                                      const nlohmann::json& run_document, bool force = false,
                                      const documents::HardwareProfile* hardware = nullptr);
std::string validate_pipeline_table(const nlohmann::json& plan_document,
                                    const nlohmann::json& run_document, bool force = false,
                                    const documents::HardwareProfile* hardware = nullptr);

}  // namespace shardplan::planner
