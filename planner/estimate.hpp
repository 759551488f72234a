// One plan evaluated for a scenario: the simulator's result plus the choices made for it.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/parallel_step.hpp"
#include "costmodel/simulator.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// A step's seconds or bytes split over the layout's dimensions: tensor, context and pipeline
// parallelism's, and data parallelism's (all of a one-dimensional plan's).
struct ByDimension {
  double tensor = 0, context = 0, pipeline = 0, data = 0;
  double sum() const { return tensor + context + pipeline + data; }
};

// One pipeline stage (the whole model when p = 1): its memory at its own peak and its compute
// stream's time per micro-batch.
struct StageReport {
  int stage = 0;
  double blocks = 0;               // transformer blocks on the stage
  double in_flight = 1;            // micro-batches whose activations it holds at once
  documents::Breakdown at_peak{};  // bytes by category at the stage's peak (sums to it)
  std::string peak_when;           // the step's moment of that peak ("loss backward", ...)
  double forward_s = 0;            // per micro-batch, recompute apart, exposed TP/CP waits in
  double backward_s = 0;           // per micro-batch, recompute included
};

// Every plan, whatever its layout, is reported as one of these (evaluation_to_json).
struct Evaluation {
  documents::ShardingSpec spec;
  documents::TrainingJob job;  // with the micro-batch used
  costmodel::StepResult result;
  bool fits = false;                 // valid and peak <= usable capacity
  documents::ParallelLayout layout;  // t = p = c = 1 for a data-parallel plan
  std::vector<StageReport> stages;   // one per pipeline stage
  int step_stage = 0;                // the stage whose optimizer step ends last (its time parts)
  double bubble_s = 0;               // the busiest stage's pipeline idle time
  double bubble_fraction = 0;        // the schedule's idle share of the busiest stage's work
  ByDimension exposed_s;             // the compute stream's waits: sum to result.exposed_comm_s
  ByDimension bytes;                 // bytes one GPU sends: sum to result.comm_bytes_per_gpu
};

// Near the edge, three verdicts: fits (the peak is within the usable capacity, headroom kept),
// tight (it fits the device only by eating into the headroom), does not fit (beyond the device).
enum class Verdict { fits, tight, does_not_fit };
Verdict verdict_of(const Scenario& sc, const Evaluation& e);
const char* verdict_name(Verdict v);  // "fits", "tight", "does not fit"

costmodel::StepInput step_input(const Scenario& sc, const documents::ShardingSpec& spec,
                                const documents::TrainingJob& job);
Evaluation evaluate(const Scenario& sc, const documents::ShardingSpec& spec,
                    const documents::TrainingJob& job, costmodel::Trace* trace = nullptr);
// A plan with tensor, pipeline or context parallelism (job.micro_batch set, the layout's
// micro-batches agreeing with it); a trivial layout is evaluate()'s plan.
Evaluation evaluate_layout(const Scenario& sc, const documents::ShardingSpec& spec,
                           const documents::TrainingJob& job,
                           const documents::ParallelLayout& layout);
// The report of a layout already simulated (the layout search's candidates).
Evaluation layout_evaluation(const Scenario& sc, const documents::ShardingSpec& spec,
                             const documents::TrainingJob& job,
                             const documents::ParallelLayout& layout,
                             const costmodel::ParallelStep& step);
// The job's micro-batch if set, otherwise the largest divisor of the per-GPU batch that fits
// (the smallest if none does, so the answer shows by how much).
Evaluation evaluate_choosing_micro_batch(const Scenario& sc, const documents::ShardingSpec& spec,
                                         costmodel::Trace* trace = nullptr);
// Refuses (core::InputError) a plan the user asked for whose bytes per GPU pass
// core::kMaxCount (2^62, core/whole_count.hpp), naming the input that made them so big:
// --params or --model when the model states alone do, else --micro-batch (as given) or --seq-len.
void check_countable(const Scenario& sc, const Evaluation& e);

// The compute stream's waiting by what it waits for: each collective stream, the host stream's
// PCIe copies ("host transfers"), and an offload plan's CPU optimizer step apart from those copies
// (the simulator runs it on the host stream). Sums to the streams' exposed time.
std::vector<std::pair<std::string, double>> exposed_by_wait(const costmodel::StepResult& r);
inline constexpr const char* kCpuOptimizerWait = "CPU optimizer step";

// The one document of a plan, whatever its layout: the scenario, memory (the peak stage's),
// time (step = compute + bubble + exposed communication, each split by what it is), comm,
// throughput, fits and verdict, parallelism (t, p, c, d, the schedule) and stages[].
// Version 2: parallelism and stages added, and one shape for every layout.
inline constexpr int kEstimateSchemaVersion = 2;
nlohmann::json evaluation_to_json(const Scenario& sc, const Evaluation& e);
std::string scenario_line(const Scenario& sc);
std::string evaluation_table(const Scenario& sc, const Evaluation& e);
// `planner compare`'s table: one row per evaluation (strategy, flavour, micro-batch,
// checkpointing, model states, peak, step, exposed communication, throughput, MFU, verdict).
void compare_table(const Scenario& sc, const std::vector<Evaluation>& evals, std::ostream& out);
// Chrome trace-event JSON (loads in Perfetto): one track per stream, a memory counter track.
nlohmann::json trace_to_chrome_json(const costmodel::Trace& t);

// Formatting helpers shared by the renderers.
std::string gib(double bytes);  // "12.34 GiB"
std::string seconds(double s);  // "1.234 s" / "12.3 ms"

}  // namespace shardplan::planner
