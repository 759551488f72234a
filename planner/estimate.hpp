// One plan evaluated for a scenario: the simulator's result plus the choices made for it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/simulator.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

struct Evaluation {
  documents::ShardingSpec spec;
  documents::TrainingJob job;  // with the micro-batch used
  costmodel::StepResult result;
  bool fits = false;  // valid and peak <= usable capacity
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

nlohmann::json evaluation_to_json(const Scenario& sc, const Evaluation& e);
std::string scenario_line(const Scenario& sc);
std::string evaluation_table(const Scenario& sc, const Evaluation& e);
// Chrome trace-event JSON (loads in Perfetto): one track per stream, a memory counter track.
nlohmann::json trace_to_chrome_json(const costmodel::Trace& t);

// Formatting helpers shared by the renderers.
std::string gib(double bytes);  // "12.34 GiB"
std::string seconds(double s);  // "1.234 s" / "12.3 ms"

}  // namespace shardplan::planner
