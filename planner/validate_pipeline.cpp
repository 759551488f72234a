#include "planner/validate_pipeline.hpp"

#include <algorithm>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "costmodel/parallel_memory.hpp"
#include "costmodel/parallel_step.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "documents/hardware.hpp"
#include "documents/plan.hpp"
#include "planner/text.hpp"
#include "planner/validate.hpp"

namespace shardplan::planner {
namespace {

using core::InputError;
using core::ObjectReader;
using core::Range;
using nlohmann::json;

constexpr char kKind[] = "executor pipeline run";

// What validate reads from a pipeline run document.
struct PipelineRun {
  std::string model;
  std::string strategy;  // the plan's the stages ran ("" in documents before it was written)
  int world = 0;
  documents::ParallelLayout layout;  // pipeline_parallel, schedule, micro_batches
  int data_parallel = 0;
  std::int64_t micro_batch = 0, seq_len = 0;
  std::vector<double> step_s;       // rank 0's, per step
  std::vector<double> stage_peaks;  // per stage, the largest of its ranks'
};

int count(ObjectReader& r, const char* key) {
  return static_cast<int>(r.integer(key, Range{1, 1e6, false}));
}

void read_layout(ObjectReader& r, PipelineRun& f) {
  ObjectReader p(r.object("pipeline"), "/pipeline");
  f.layout.pipeline_parallel = count(p, "pipeline_parallel");
  f.data_parallel = count(p, "data_parallel");
  f.layout.schedule = documents::schedule_from_name(p.string("schedule"), "/pipeline/schedule");
  f.layout.micro_batches = count(p, "micro_batches");
  // Written since the executor runs the interleaved schedule and TP inside the stages; one
  // chunk per stage and no TP before.
  f.layout.virtual_stages =
      static_cast<int>(p.optional_integer("virtual_stages", Range{1, 1e6, false}).value_or(1));
  f.layout.tensor_parallel =
      static_cast<int>(p.optional_integer("tensor_parallel", Range{1, 1e6, false}).value_or(1));
  f.layout.sequence_parallel = p.optional_boolean("sequence_parallel").value_or(false);
  f.micro_batch = count(p, "micro_batch");
  f.seq_len = count(p, "seq_len");
  p.finish();
  const auto& l = f.layout;
  const bool interleaved = l.schedule == documents::PipelineSchedule::interleaved_1f1b;
  if (!interleaved && l.virtual_stages != 1)
    throw InputError("/pipeline/virtual_stages",
                     fmt::format("{} needs the interleaved-1f1b schedule, got {}", l.virtual_stages,
                                 documents::schedule_name(l.schedule)));
  if (interleaved && l.virtual_stages < 2)
    throw InputError(
        "/pipeline/virtual_stages",
        fmt::format("the interleaved-1f1b schedule needs >= 2, got {}", l.virtual_stages));
  if (interleaved && l.micro_batches % l.pipeline_parallel != 0)
    throw InputError("/pipeline/micro_batches",
                     fmt::format("the interleaved-1f1b schedule needs a multiple of the {} stages, "
                                 "got {}",
                                 l.pipeline_parallel, l.micro_batches));
  if (l.sequence_parallel && l.tensor_parallel == 1)
    throw InputError("/pipeline/sequence_parallel", "true needs \"tensor_parallel\" > 1, got 1");
  if (f.layout.pipeline_parallel * f.data_parallel * l.tensor_parallel != f.world)
    throw InputError("/pipeline/data_parallel",
                     fmt::format("{} stages × {} data-parallel ranks × {} tensor-parallel ranks "
                                 "are not the run's {} ranks (/world)",
                                 f.layout.pipeline_parallel, f.data_parallel, l.tensor_parallel,
                                 f.world));
}

void read_steps(ObjectReader& r, PipelineRun& f) {
  const auto& steps = r.array("steps");
  if (steps.empty()) throw InputError("/steps", "the run has no steps");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    ObjectReader s(steps[i], fmt::format("/steps/{}", i));
    f.step_s.push_back(s.number("step_s", Range::non_negative()));
    for (const char* k :
         {"step", "loss", "forward_s", "backward_s", "p2p_s", "reduce_s", "optimizer_s"})
      s.optional_number(k);
    s.finish();
  }
}

void read_stages(ObjectReader& r, PipelineRun& f) {
  const auto& stages = r.array("stages_measured");
  if (static_cast<int>(stages.size()) != f.layout.pipeline_parallel)
    throw InputError("/stages_measured",
                     fmt::format("{} stages, /pipeline/pipeline_parallel says {}", stages.size(),
                                 f.layout.pipeline_parallel));
  for (std::size_t i = 0; i < stages.size(); ++i) {
    ObjectReader s(stages[i], fmt::format("/stages_measured/{}", i));
    f.stage_peaks.push_back(s.number("peak_bytes", Range::non_negative()));
    // Each category at the peak ("activations_bytes_at_peak", ...): reported by the run only.
    s.ignore_if([](const std::string& k) { return k.ends_with("_bytes_at_peak"); });
    s.finish();
  }
}

PipelineRun read_pipeline_run(const json& run) {
  ObjectReader r(run, "");
  // Written since the documents carry a version; absent in earlier pipeline runs.
  if (const auto version = r.optional_integer("schema_version"); version && *version != 1)
    throw InputError("/schema_version", fmt::format("must be 1, got {}", *version));
  r.optional_string("generator");  // the executor's version
  if (const auto kind = r.string("kind"); kind != kKind)
    throw InputError("/kind", fmt::format("must be \"{}\", got \"{}\"", kKind, kind));
  PipelineRun f;
  f.model = r.string("model");
  f.strategy = r.optional_string("strategy").value_or("");
  f.world = count(r, "world");
  read_layout(r, f);
  read_steps(r, f);
  read_stages(r, f);
  // The trainer's own count of its stages' peaks (and, in documents of earlier versions, a
  // prediction): validate predicts from the plan itself.
  r.array("stages_counted");
  r.ignore_if([](const std::string& k) { return k == "stages_predicted"; });
  r.finish();
  return f;
}

// A profile whose speeds order the walk's events when the plan's cannot be loaded.
constexpr const char* kStandInProfile = "a100-sxm4-80gb";

// The cost model's prediction for the run's layout, from the plan (simulate_parallel_step).
struct Prediction {
  costmodel::ParallelMemory memory;
  std::optional<double> step_s;
  std::vector<std::string> notes;
};

Prediction predict(const documents::Plan& plan, const PipelineRun& run,
                   const documents::HardwareProfile* hardware) {
  Prediction out;
  documents::HardwareProfile hw;
  bool loaded = true;
  if (hardware != nullptr) {
    hw = *hardware;
  } else {
    try {
      hw = documents::load_hardware(plan.hardware);
    } catch (const std::exception&) {
      loaded = false;
      // The walk orders the stages' ops by time: on a profile's speeds, without its per-device
      // overheads; no step time is reported from it.
      hw = documents::load_hardware(kStandInProfile);
      hw.cuda_context_bytes = hw.nccl_workspace_bytes = 0;
      hw.fragmentation = 0;
      out.notes.push_back(fmt::format(
          "the plan's hardware profile \"{}\" could not be loaded here: memory predicted without "
          "per-device overheads, its events ordered on {}'s speeds; no step time (--hardware "
          "names its file)",
          plan.hardware, kStandInProfile));
    }
  }
  const documents::Cluster cluster{run.world, std::max(1, plan.cluster.gpus_per_node)};
  documents::TrainingJob job = plan.job;
  job.seq_len = run.seq_len;
  job.micro_batch = run.micro_batch;
  job.global_batch = static_cast<std::int64_t>(run.layout.data_parallel(run.world)) *
                     run.layout.micro_batches * run.micro_batch;  // the run's
  // The executor's stages reduce their gradients in place (executor/pipeline.hpp): no bucket copy.
  documents::ShardingSpec spec = plan.spec;
  spec.grad_bucket_copy = false;
  const costmodel::StepInput step_in{&plan.model, &hw, cluster, job, spec};
  const auto step = costmodel::simulate_parallel_step(step_in, run.layout);
  if (!step.step.valid)
    throw InputError("/pipeline", "the cost model does not predict this run: " + step.step.reason);
  out.memory = step.memory;
  if (loaded) out.step_s = step.step.step_s;
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

json stages_json(const Prediction& pr, const PipelineRun& run) {
  json stages = json::array();
  for (std::size_t s = 0; s < run.stage_peaks.size(); ++s) {
    const auto& st = pr.memory.stages.at(s);
    stages.push_back({{"stage", s},
                      {"in_flight", st.in_flight},
                      {"predicted_bytes", st.total()},
                      {"measured_bytes", run.stage_peaks[s]},
                      {"rel_error", rel_error(st.total(), run.stage_peaks[s])}});
  }
  return stages;
}

json memory_json(const Prediction& pr, const PipelineRun& run) {
  const auto& peaks = run.stage_peaks;
  const auto measured_stage = std::max_element(peaks.begin(), peaks.end()) - peaks.begin();
  return {{"peak_stage_predicted", pr.memory.peak_stage},
          {"peak_stage_measured", measured_stage},
          {"peak_predicted_name", pr.memory.peak_name},
          {"peak_predicted_bytes", pr.memory.peak_bytes},
          {"peak_measured_bytes", peaks[static_cast<std::size_t>(measured_stage)]},
          {"peak_rel_error",
           rel_error(pr.memory.peak_bytes, peaks[static_cast<std::size_t>(measured_stage)])}};
}

json time_json(const Prediction& pr, const PipelineRun& run) {
  const double measured = median(run.step_s);
  return {{"step_predicted_s", pr.step_s ? json(*pr.step_s) : json(nullptr)},
          {"step_measured_s", measured},
          {"step_rel_error", pr.step_s ? rel_error(*pr.step_s, measured) : json(nullptr)},
          {"steps", run.step_s.size()}};
}

}  // namespace

bool is_pipeline_run(const json& run_document) {
  return run_document.is_object() && run_document.contains("kind") && run_document["kind"] == kKind;
}

json validate_pipeline_json(const json& plan_document, const json& run_document, bool force,
                            const documents::HardwareProfile* hardware) {
  const auto plan = documents::plan_from_json(plan_document);
  const auto run = read_pipeline_run(run_document);
  std::vector<std::string> forced;
  auto differ = [&](const char* pointer, const std::string& of_run, const std::string& of_plan) {
    if (of_run == of_plan) return;
    const auto what = fmt::format("the run's {}, the plan's {}", of_run, of_plan);
    if (!force)
      throw InputError(pointer, fmt::format("not a run of this plan: {} (--force compares them "
                                            "anyway)",
                                            what));
    forced.push_back(fmt::format("{}: {}", pointer, what));
  };
  differ("/model", fmt::format("model \"{}\"", run.model),
         fmt::format("model \"{}\"", plan.model.name));
  differ("/world", fmt::format("{} ranks", run.world), fmt::format("{} ranks", plan.cluster.gpus));
  if (!run.strategy.empty()) differ("/strategy", run.strategy, plan.spec.strategy);
  differ("/pipeline/seq_len", fmt::format("sequence length {}", run.seq_len),
         fmt::format("sequence length {}", plan.job.seq_len));
  const auto pr = predict(plan, run, hardware);
  json out;
  out["kind"] = "pipeline";
  out["plan"] = {{"strategy", plan.spec.strategy},
                 {"flavour", documents::flavour_name(plan.spec.flavour)},
                 {"gpus", plan.cluster.gpus},
                 {"model", plan.model.name},
                 {"hardware", plan.hardware}};
  out["pipeline"] = {{"pipeline_parallel", run.layout.pipeline_parallel},
                     {"data_parallel", run.data_parallel},
                     {"tensor_parallel", run.layout.tensor_parallel},
                     {"sequence_parallel", run.layout.sequence_parallel},
                     {"schedule", documents::schedule_name(run.layout.schedule)},
                     {"virtual_stages", run.layout.virtual_stages},
                     {"micro_batches", run.layout.micro_batches},
                     {"micro_batch", run.micro_batch},
                     {"seq_len", run.seq_len}};
  out["stages"] = stages_json(pr, run);
  out["memory"] = memory_json(pr, run);
  out["time"] = time_json(pr, run);
  out["notes"] = pr.notes;
  if (plan.parallel.pipeline_parallel != run.layout.pipeline_parallel)
    out["notes"].push_back(fmt::format(
        "the plan was made for {} pipeline stage(s) and its own prediction is for that layout; "
        "the per-stage prediction here is for the run's {}",
        plan.parallel.pipeline_parallel, run.layout.pipeline_parallel));
  if (!forced.empty()) out["forced"] = forced;
  out["schema_version"] = 1;
  return out;
}

std::string validate_pipeline_table(const json& plan_document, const json& run_document, bool force,
                                    const documents::HardwareProfile* hardware) {
  const json v = validate_pipeline_json(plan_document, run_document, force, hardware);
  Text t;
  if (v.contains("forced"))
    t.line("forced (--force): not a run of this plan ({})",
           fmt::join(v["forced"].get<std::vector<std::string>>(), "; "));
  const auto& pl = v["plan"];
  const auto& pp = v["pipeline"];
  t.line("plan: {} ({}) on {} ranks, model {}, hardware {}", pl["strategy"].get<std::string>(),
         pl["flavour"].get<std::string>(), pl["gpus"].get<int>(), pl["model"].get<std::string>(),
         pl["hardware"].get<std::string>());
  const int tp = pp["tensor_parallel"].get<int>(), chunks = pp["virtual_stages"].get<int>();
  const std::string inside =
      tp == 1 ? ""
              : fmt::format(" × {} tensor-parallel ranks{}", tp,
                            pp["sequence_parallel"].get<bool>() ? " (sequence parallel)" : "");
  const std::string schedule = chunks == 1 ? pp["schedule"].get<std::string>()
                                           : fmt::format("{} with {} chunks per stage",
                                                         pp["schedule"].get<std::string>(), chunks);
  t.line("run: {} pipeline stages × {} data-parallel ranks{}, {}, {} micro-batches of {} × {} "
         "tokens",
         pp["pipeline_parallel"].get<int>(), pp["data_parallel"].get<int>(), inside, schedule,
         pp["micro_batches"].get<int>(), pp["micro_batch"].get<std::int64_t>(),
         pp["seq_len"].get<std::int64_t>());
  const auto& m = v["memory"];
  t.line("predicted peak: {}", m["peak_predicted_name"].get<std::string>());
  t.line("");
  t.line("{:<10} {:>10} {:>14} {:>14} {:>9}", "stage", "in flight", "predicted MiB", "measured MiB",
         "error");
  for (const auto& s : v["stages"])
    t.line("  {:<8} {:>10g} {:>14.3f} {:>14.3f} {:>9}", s["stage"].get<int>(),
           s["in_flight"].get<double>(), s["predicted_bytes"].get<double>() / kMiB,
           s["measured_bytes"].get<double>() / kMiB, percent(s["rel_error"]));
  t.line("  {:<8} {:>10} {:>14} {:>14} {:>9}", "peak", "",
         fmt::format("stage {}", m["peak_stage_predicted"].get<int>()),
         fmt::format("stage {}", m["peak_stage_measured"].get<int>()),
         percent(m["peak_rel_error"]));
  t.line("");
  const auto& tm = v["time"];
  t.line("{:<25} {:>14} {:>14} {:>9}", "time per step", "predicted s", "measured s", "error");
  t.line("  {:<23} {:>14} {:>14.4f} {:>9}",
         fmt::format("step (median of {})", tm["steps"].get<int>()),
         tm["step_predicted_s"].is_null()
             ? std::string("n/a")
             : fmt::format("{:.4f}", tm["step_predicted_s"].get<double>()),
         tm["step_measured_s"].get<double>(), percent(tm["step_rel_error"]));
  if (!v["notes"].empty()) {
    t.line("");
    t.line("notes");
    for (const auto& n : v["notes"]) t.line("  - {}", n.get<std::string>());
  }
  t.line("");
  t.line("peak memory error {} (stage {} predicted, stage {} measured), step time error {}",
         percent(m["peak_rel_error"]), m["peak_stage_predicted"].get<int>(),
         m["peak_stage_measured"].get<int>(), percent(tm["step_rel_error"]));
  return t.str;
}

}  // namespace shardplan::planner
