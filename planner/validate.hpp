// `planner validate`: a plan's prediction against what the executor measured running it.
// For each memory category at the peak, the peak itself, the step time and its parts, and the
// bytes each rank sent: predicted, measured, and the relative error of the prediction,
//   rel_error = (predicted − measured) / measured   (+0.05: the prediction is 5% too high),
// null where nothing was measured. JSON keys (at least): memory.peak_rel_error,
// time.step_rel_error; memory.categories.<name>.{predicted_bytes, measured_bytes, rel_error};
// time.parts.{compute, communication}.{predicted_s, measured_s, rel_error}; notes (why a number
// may not be comparable: a scaled run, a rehearsal, the executor's deviations from the plan).
//
// Measured values are the run document's summary (executor/run_document.hpp): the peak of the
// rank with the highest peak and its breakdown; the slowest rank's median step. The predicted
// compute time includes the optimizer step (the cost model's compute stream runs both), so the
// measured compute part is forward + backward + recompute + optimizer; on a CPU device every
// collective is exposed, so communication compares the predicted exposed communication with the
// collectives' measured time. Bucket copies, accumulation adds and anything else the executor
// spends are reported as the measured-only `other`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "documents/hardware.hpp"

namespace shardplan::planner {

// plan_document: a plan (planner recommend --emit plan); run_document: executor's run.json, or a
// pipeline run's document (its /kind "executor pipeline run"), compared per stage as
// validate_pipeline.hpp says.
// Throws core::InputError naming the JSON pointer of a missing or malformed field (in the
// plan: as plan_from_json; in the run: "/summary/time/step_s: missing key"), and of the first
// field that says the run is not of this plan (its /plan/model, /environment/ranks,
// /plan/strategy, /plan/flavour or /plan/job/micro_batch differs from the plan's), with both
// values. force: compare anyway; the JSON then has "forced" (every difference), and the table
// says so in its first line.
// hardware: a pipeline run's stages are predicted again from the plan, with this profile
// (validate_pipeline.hpp); other runs are compared with the plan's own prediction and refuse it
// (InputError naming --hardware).
nlohmann::json validate_json(const nlohmann::json& plan_document,
                             const nlohmann::json& run_document, bool force = false,
                             const documents::HardwareProfile* hardware = nullptr);
std::string validate_table(const nlohmann::json& plan_document, const nlohmann::json& run_document,
                           bool force = false,
                           const documents::HardwareProfile* hardware = nullptr);

// The comparisons' two helpers, shared with validate_pipeline.cpp: (predicted − measured) /
// measured, null where nothing was measured (0 when neither is); and that as "+5.0%" or "n/a".
nlohmann::json rel_error(double predicted, double measured);
std::string percent(const nlohmann::json& rel_error);

}  // namespace shardplan::planner
