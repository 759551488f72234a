#include "planner/validate.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "costmodel/parallel_step.hpp"
#include "documents/hardware.hpp"
#include "documents/plan.hpp"
#include "documents/recipe.hpp"
#include "planner/text.hpp"
#include "planner/validate_pipeline.hpp"

namespace shardplan::planner {

nlohmann::json rel_error(double predicted, double measured) {
  if (measured == 0) return predicted == 0 ? nlohmann::json(0.0) : nlohmann::json(nullptr);
  return (predicted - measured) / measured;
}

std::string percent(const nlohmann::json& e) {
  return e.is_null() ? std::string("n/a") : fmt::format("{:+.1f}%", 100 * e.get<double>());
}

namespace {

using core::InputError;
using core::ObjectReader;
using core::Range;
using nlohmann::json;

// What validate reads from a run document: its summary, and what says how comparable it is.
struct RunFacts {
  double peak_bytes = 0;
  std::array<double, documents::kCategories> at_peak{};
  double step_s = 0, compute_s = 0, optimizer_s = 0, copy_s = 0, collectives_s = 0;
  std::optional<double> step_cpu_s, compute_cpu_s;  // CPU time of the computing thread
  // A GPU run: the time the compute stalled on collectives (the exposed communication), the
  // achieved FLOP/s and MFU, and the device's memory terms.
  std::optional<double> comm_wait_s, achieved_TFLOPs, mfu;
  std::optional<json> device, comm_wait_by_stream;
  std::optional<bool> collectives_overlap;  // beside the compute (absent in older documents)
  std::string backend;                      // "mpi", "nccl", "rehearsal"
  bool collective_time_excluded = false;
  double comm_bytes_per_step = 0;
  bool scaled = false;
  bool rehearsal = false;
  int world = 0;
  std::string model, strategy, flavour;  // the plan the run was made from, as it records it
  std::int64_t micro_batch = 0;          // 0: not recorded
  // What the run executed (/execution; absent from older documents), and the ranks whose memory
  // and time /summary reports.
  std::optional<std::int64_t> executed_world, executed_seq_len, executed_micro_batch;
  std::int64_t memory_rank = 0, time_rank = 0;
  std::vector<std::string> deviations;
  int tensor_parallel = 1;  // /model/tensor_parallel/size: the run's t (1: none)
  bool sequence_parallel = false;
  int context_parallel = 1;  // /model/context_parallel/size: the run's c (1: none)
  bool model_parallel() const { return tensor_parallel > 1 || context_parallel > 1; }
};

void read_summary_memory(ObjectReader& s, RunFacts& f) {
  ObjectReader m(s.object("memory"), "/summary/memory");
  f.peak_bytes = m.number("peak_bytes", Range::non_negative());
  if (f.peak_bytes != std::floor(f.peak_bytes))
    throw InputError("/summary/memory/peak_bytes",
                     fmt::format("must be a whole number of bytes, got {}", f.peak_bytes));
  f.memory_rank = m.integer("rank", Range::non_negative());
  ObjectReader b(m.object("at_peak"), "/summary/memory/at_peak");
  double sum = 0;
  for (int c = 0; c < documents::kCategories; ++c) {
    f.at_peak[static_cast<std::size_t>(c)] = b.number(
        documents::category_name(static_cast<documents::Category>(c)), Range::non_negative());
    sum += f.at_peak[static_cast<std::size_t>(c)];
  }
  b.finish();
  // The executor's peak is its categories at that moment (executor/run_document.cpp): a peak
  // beside other categories was edited or written by something else.
  if (std::abs(sum - f.peak_bytes) > 1e-9 * f.peak_bytes + 1)
    throw InputError(
        "/summary/memory/peak_bytes",
        fmt::format("{} is not the sum of the categories at the peak ({})", f.peak_bytes, sum));
  if (const auto* d = m.optional_object("device")) f.device = *d;
  m.finish();
}

void read_summary_time(ObjectReader& s, RunFacts& f) {
  ObjectReader t(s.object("time"), "/summary/time");
  f.time_rank = t.integer("rank", Range::non_negative());
  f.step_s = t.number("step_s", Range::non_negative());
  f.compute_s = t.number("compute_s", Range::non_negative());
  f.optimizer_s = t.number("optimizer_s", Range::non_negative());
  f.copy_s = t.number("copy_s", Range::non_negative());
  f.collectives_s = t.number("collectives_s", Range::non_negative());
  f.step_cpu_s = t.optional_number("step_cpu_s", Range::non_negative());
  f.compute_cpu_s = t.optional_number("compute_cpu_s", Range::non_negative());
  t.object("collectives_by_kind_s");
  f.comm_wait_s = t.optional_number("comm_wait_s", Range::non_negative());
  f.collectives_overlap = t.optional_boolean("collectives_overlap");
  t.optional_number("forward_s", Range::non_negative());
  t.optional_number("backward_s", Range::non_negative());
  if (const auto* w = t.optional_object("comm_wait_by_stream_s")) f.comm_wait_by_stream = *w;
  t.optional_number("model_flops_per_step", Range::non_negative());
  f.achieved_TFLOPs = t.optional_number("achieved_TFLOPs", Range::non_negative());
  t.optional_number("peak_TFLOPs", Range::positive());
  f.mfu = t.optional_number("mfu", Range::non_negative());
  f.collective_time_excluded = t.boolean("collective_time_excluded");
  t.finish();
}

// /summary: the rank of the highest peak's memory, the slowest rank's time.
void read_summary(ObjectReader& r, RunFacts& f) {
  ObjectReader s(r.object("summary"), "/summary");
  read_summary_memory(s, f);
  read_summary_time(s, f);
  f.comm_bytes_per_step = s.number("comm_bytes_per_step", Range::non_negative());
  s.finish();
}

RunFacts read_run(const json& run) {
  ObjectReader r(run, "");
  if (r.integer("schema_version") != 1)
    throw InputError("/schema_version",
                     fmt::format("must be 1, got {}", core::describe_value(run["schema_version"])));
  r.optional_string("generator");  // the executor's version
  if (const auto kind = r.string("kind"); kind != "shardplan.run")
    throw InputError("/kind", fmt::format("must be \"shardplan.run\", got \"{}\"", kind));
  RunFacts f;
  read_summary(r, f);
  {
    ObjectReader mo(r.object("model"), "/model");
    f.scaled = mo.boolean("scaled");
    for (const char* k : {"name", "params", "units", "config"}) mo.ignore(k);
    if (const auto* tp = mo.optional_object("tensor_parallel")) {
      ObjectReader t(*tp, "/model/tensor_parallel");
      f.tensor_parallel = static_cast<int>(t.integer("size", Range{1, 1e6, false}));
      f.sequence_parallel = t.boolean("sequence_parallel");
      t.number("local_params", Range::non_negative());
      t.finish();
    }
    if (const auto* cp = mo.optional_object("context_parallel")) {
      ObjectReader c(*cp, "/model/context_parallel");
      f.context_parallel = static_cast<int>(c.integer("size", Range{1, 1e6, false}));
      c.integer("sequence_share", Range{1, 1e12, false});
      c.finish();
    }
    mo.finish();
  }
  {
    ObjectReader e(r.object("environment"), "/environment");
    f.rehearsal = e.boolean("rehearsal");
    f.world = static_cast<int>(e.integer("ranks", Range{1, 1e6, false}));
    f.backend = e.string("backend");
    for (const char* k :
         {"library", "hosts", "build", "rehearsed_rank", "collective_time", "device"})
      e.ignore(k);
    e.finish();
  }
  for (const auto& [pointer, rank] :
       {std::pair{"/summary/memory/rank", f.memory_rank}, {"/summary/time/rank", f.time_rank}})
    if (rank >= f.world)
      throw InputError(pointer, fmt::format("{} is not a rank of the run's {} (/environment/ranks)",
                                            rank, f.world));
  {
    ObjectReader p(r.object("plan"), "/plan");
    f.strategy = p.string("strategy");
    f.model = p.string("model");
    f.flavour = p.string("flavour");
    const auto& job = p.object("job");
    if (job.contains("micro_batch") && job["micro_batch"].is_number_integer())
      f.micro_batch = job["micro_batch"];
    for (const char* k : {"hardware", "gpus", "job", "sharding"}) p.ignore(k);
    p.finish();
  }
  {
    ObjectReader x(r.object("execution"), "/execution");
    f.executed_world = x.optional_integer("world_size", Range{1, 1e6, false});
    f.executed_seq_len = x.optional_integer("seq_len", Range{1, 1e12, false});
    f.executed_micro_batch = x.optional_integer("micro_batch", Range{1, 1e12, false});
    if (const auto* d = x.optional_array("deviations"))
      for (const auto& v : *d)
        if (v.is_string()) f.deviations.push_back(v.get<std::string>());
    x.ignore_if([](const std::string&) { return true; });
    x.finish();
  }
  for (const char* k : {"prediction", "loss", "ranks"}) r.ignore(k);
  // The consolidated parameters' sha256 at the start and the end (executor/checkpoint.hpp): for
  // comparing runs, not the prediction; absent from rehearsals and older documents.
  for (const char* k : {"initial_params_sha256", "final_params_sha256"}) r.optional_string(k);
  r.finish();
  return f;
}

// What predicts a tensor- or context-parallel run's memory (the JSON's predicted_by).
constexpr const char* kModelParallelPredictor = "the step walk (simulate_parallel_step), one stage";

// A run with tensor or context parallelism: the memory of its one stage as the step walk counts
// it for the run's t, sequence parallelism and c (simulate_parallel_step; the plan's own
// prediction is for its layout, data parallelism alone unless its /parallel says the same). A
// profile that cannot be loaded here is taken without per-device overheads, as the executor's
// pipeline run takes it.
documents::PlanPrediction model_parallel_prediction(const documents::Plan& plan,
                                                    const RunFacts& run) {
  documents::HardwareProfile hw;
  try {
    hw = documents::load_hardware(plan.hardware);
  } catch (const std::exception&) {
    hw = documents::HardwareProfile{};
  }
  costmodel::StepInput in;
  in.model = &plan.model;
  in.hardware = &hw;
  in.cluster = plan.cluster;
  in.job = plan.job;
  // What ran is the executor's own model code, whatever recipe the plan was costed for.
  in.job.recipe = documents::Recipe::executor;
  in.job.loss = documents::recipe_traits(in.job.recipe).loss;
  in.spec = plan.spec;
  documents::ParallelLayout layout_of_run;
  layout_of_run.tensor_parallel = run.tensor_parallel;
  layout_of_run.sequence_parallel = run.sequence_parallel;
  layout_of_run.context_parallel = run.context_parallel;
  // The plan's micro-batches over the run's replicas.
  const int replicas = std::max(1, layout_of_run.data_parallel(plan.cluster.gpus));
  layout_of_run.micro_batches = static_cast<int>(
      std::max<std::int64_t>(1, plan.job.global_batch / (replicas * plan.job.micro_batch)));
  const auto step = costmodel::simulate_parallel_step(in, layout_of_run).step;
  if (!step.valid)
    throw core::InputError(run.tensor_parallel > 1 ? "/model/tensor_parallel/size"
                                                   : "/model/context_parallel/size",
                           fmt::format("the plan cannot run this way: {}", step.reason));
  documents::PlanPrediction pr = plan.prediction;
  pr.at_peak = step.at_peak;
  pr.peak_bytes = step.peak_bytes;
  std::string layout;
  if (run.tensor_parallel > 1)
    layout = fmt::format("tensor parallelism {}{}", run.tensor_parallel,
                         run.sequence_parallel ? " and sequence parallelism" : "");
  if (run.context_parallel > 1)
    layout +=
        fmt::format("{}context parallelism {}", layout.empty() ? "" : ", ", run.context_parallel);
  pr.peak_when = "the one stage with " + layout;
  return pr;
}

json compare(double predicted, double measured, const char* unit) {
  return {{fmt::format("predicted_{}", unit), predicted},
          {fmt::format("measured_{}", unit), measured},
          {"rel_error", rel_error(predicted, measured)}};
}

// Where the run is not of the plan: "<run's JSON pointer>: the run's X, the plan's Y", one each.
std::vector<std::pair<std::string, std::string>> differences(const documents::Plan& plan,
                                                             const RunFacts& run) {
  std::vector<std::pair<std::string, std::string>> d;
  auto differ = [&d](const char* pointer, const std::string& of_run, const std::string& of_plan) {
    if (of_run != of_plan)
      d.emplace_back(pointer, fmt::format("the run's {}, the plan's {}", of_run, of_plan));
  };
  differ("/plan/model", fmt::format("model \"{}\"", run.model),
         fmt::format("model \"{}\"", plan.model.name));
  differ("/environment/ranks", fmt::format("{} ranks", run.world),
         fmt::format("{} ranks", plan.cluster.gpus));
  differ("/plan/strategy", run.strategy, plan.spec.strategy);
  differ("/plan/flavour", run.flavour, documents::flavour_name(plan.spec.flavour));
  if (run.micro_batch != 0)
    differ("/plan/job/micro_batch", fmt::format("micro-batch {}", run.micro_batch),
           fmt::format("micro-batch {}", plan.job.micro_batch));
  // What the executor ran, beside the plan it records.
  if (run.executed_world)
    differ("/execution/world_size", fmt::format("{} ranks", *run.executed_world),
           fmt::format("{} ranks", plan.cluster.gpus));
  // A scaled run (executor --seq-len, --layers, ...) says so in /model/scaled and runs another
  // length by design; under context parallelism a rank runs its share of each sequence.
  if (run.executed_seq_len && !run.scaled)
    differ("/execution/seq_len",
           fmt::format("sequence length {}", *run.executed_seq_len * run.context_parallel),
           fmt::format("sequence length {}", plan.job.seq_len));
  if (run.executed_micro_batch)
    differ("/execution/micro_batch", fmt::format("micro-batch {}", *run.executed_micro_batch),
           fmt::format("micro-batch {}", plan.job.micro_batch));
  return d;
}

json memory_json(const documents::PlanPrediction& pr, const RunFacts& run) {
  json categories = json::object();
  for (int c = 0; c < documents::kCategories; ++c) {
    const auto name = documents::category_name(static_cast<documents::Category>(c));
    categories[name] = compare(pr.at_peak[static_cast<std::size_t>(c)],
                               run.at_peak[static_cast<std::size_t>(c)], "bytes");
  }
  return {{"categories", categories},
          {"peak_predicted_bytes", pr.peak_bytes},
          {"peak_measured_bytes", run.peak_bytes},
          {"peak_rel_error", rel_error(pr.peak_bytes, run.peak_bytes)}};
}

// The step's time, predicted and measured, in parts.
json time_json(const documents::PlanPrediction& pr, const RunFacts& run) {
  const double measured_compute = run.compute_s + run.optimizer_s;
  // Collectives that ran beside the compute (a GPU's streams, a CPU run's collective streams) are
  // queued, not waited for: the communication that did not overlap is the time the compute
  // waited for it. Blocking collectives are exposed whole. (A run document without the key
  // overlapped them on a GPU only.)
  const bool overlapped = run.collectives_overlap.value_or(run.backend == "nccl");
  const double measured_comm = overlapped && run.comm_wait_s ? *run.comm_wait_s : run.collectives_s;
  const double other = std::max(0.0, run.step_s - measured_compute - measured_comm);
  json t = {{"step_predicted_s", pr.step_s},
            {"step_measured_s", run.step_s},
            {"step_rel_error", rel_error(pr.step_s, run.step_s)},
            {"parts",
             {{"compute", compare(pr.compute_s, measured_compute, "s")},
              {"communication", compare(pr.exposed_comm_s, measured_comm, "s")},
              {"other", {{"measured_s", other}, {"copy_s", run.copy_s}}}}},
            {"comm_bytes", compare(pr.comm_bytes_per_gpu, run.comm_bytes_per_step, "bytes")}};
  if (run.step_cpu_s) t["step_cpu_s"] = *run.step_cpu_s;
  if (run.compute_cpu_s) t["compute_cpu_s"] = *run.compute_cpu_s;
  if (run.achieved_TFLOPs) t["achieved_TFLOPs"] = *run.achieved_TFLOPs;
  if (run.mfu) t["mfu"] = *run.mfu;
  // Which of the run's fields the measured communication is.
  t["parts"]["communication"]["measured_as"] =
      overlapped && run.comm_wait_s ? "summary.time.comm_wait_s" : "summary.time.collectives_s";
  if (run.comm_wait_by_stream)
    t["parts"]["communication"]["by_stream_s"] = *run.comm_wait_by_stream;
  return t;
}

// What makes the comparison weaker: a scaled model, a rehearsal, a busy machine, the executor's
// deviations.
json notes_json(const RunFacts& run) {
  json notes = json::array();
  if (run.scaled)
    notes.push_back("the run used a scaled-down copy of the plan's model: the prediction is for "
                    "the plan's model");
  if (run.rehearsal || run.collective_time_excluded)
    notes.push_back(
        "a rehearsal: collectives were local copies, so communication time is not comparable");
  if (run.rehearsal && run.device)
    notes.push_back("a rehearsal on a GPU makes no NCCL communicator: the prediction's NCCL "
                    "workspace is not in the measured peak");
  if (run.step_cpu_s && run.step_s > 0 && *run.step_cpu_s < 0.9 * run.step_s)
    notes.push_back(fmt::format(
        "the measuring rank's thread ran {:.0f}% of the step's wall time: other load on the "
        "machine took its core, so the measured times are inflated",
        100 * *run.step_cpu_s / run.step_s));
  for (const auto& d : run.deviations) notes.push_back("executor: " + d);
  return notes;
}

}  // namespace

json validate_json(const json& plan_document, const json& run_document, bool force,
                   const documents::HardwareProfile* hardware) {
  if (is_pipeline_run(run_document))
    return validate_pipeline_json(plan_document, run_document, force, hardware);
  if (hardware != nullptr)
    throw InputError("--hardware", "only a pipeline run's stages are predicted again; this run is "
                                   "compared with the plan's own prediction");
  const auto plan = documents::plan_from_json(plan_document);
  const auto run = read_run(run_document);
  const auto differ = differences(plan, run);
  if (!differ.empty() && !force)
    throw InputError(differ.front().first,
                     fmt::format("not a run of this plan: {} (--force compares them anyway)",
                                 differ.front().second));
  const auto pr = run.model_parallel() ? model_parallel_prediction(plan, run) : plan.prediction;
  json out;
  out["plan"] = {
      {"strategy", plan.spec.strategy}, {"flavour", documents::flavour_name(plan.spec.flavour)},
      {"gpus", plan.cluster.gpus},      {"micro_batch", plan.job.micro_batch},
      {"model", plan.model.name},       {"hardware", plan.hardware},
      {"peak_when", pr.peak_when}};

  out["memory"] = memory_json(pr, run);
  out["time"] = time_json(pr, run);
  if (run.tensor_parallel > 1) {
    out["memory"]["tensor_parallel"] = {{"size", run.tensor_parallel},
                                        {"sequence_parallel", run.sequence_parallel},
                                        {"predicted_by", kModelParallelPredictor}};
  }
  if (run.context_parallel > 1)
    out["memory"]["context_parallel"] = {{"size", run.context_parallel},
                                         {"predicted_by", kModelParallelPredictor}};
  if (run.device) out["memory"]["device"] = *run.device;
  out["notes"] = notes_json(run);
  if (run.model_parallel() && (plan.parallel.tensor_parallel != run.tensor_parallel ||
                               plan.parallel.context_parallel != run.context_parallel))
    out["notes"].push_back(fmt::format(
        "the plan's step time is for tensor parallelism {} and context parallelism {}, the "
        "run's are {} and {}; its memory is predicted for the run's",
        plan.parallel.tensor_parallel, plan.parallel.context_parallel, run.tensor_parallel,
        run.context_parallel));
  // The run ran the executor's own model code: its memory is predicted for that code, whatever
  // recipe the plan was costed for (model_parallel_prediction).
  if (run.model_parallel() && plan.job.recipe != documents::Recipe::executor)
    out["notes"].push_back(fmt::format(
        "the plan was costed for the {} recipe's code; the run's memory is predicted for the "
        "executor's, which ran",
        documents::recipe_name(plan.job.recipe)));
  if (!differ.empty()) {
    json forced = json::array();
    for (const auto& [pointer, what] : differ)
      forced.push_back(fmt::format("{}: {}", pointer, what));
    out["forced"] = forced;
  }
  out["schema_version"] = 1;
  return out;
}

std::string validate_table(const json& plan_document, const json& run_document, bool force,
                           const documents::HardwareProfile* hardware) {
  if (is_pipeline_run(run_document))
    return validate_pipeline_table(plan_document, run_document, force, hardware);
  const json v = validate_json(plan_document, run_document, force, hardware);
  Text t;
  if (v.contains("forced")) {
    std::vector<std::string> what;
    for (const auto& d : v["forced"]) what.push_back(d.get<std::string>());
    t.line("forced (--force): not a run of this plan ({}); the errors below compare two plans",
           fmt::join(what, "; "));
  }
  t.line("plan: {} ({}) on {} ranks, micro-batch {}, model {}, hardware {}",
         v["plan"]["strategy"].get<std::string>(), v["plan"]["flavour"].get<std::string>(),
         v["plan"]["gpus"].get<int>(), v["plan"]["micro_batch"].get<std::int64_t>(),
         v["plan"]["model"].get<std::string>(), v["plan"]["hardware"].get<std::string>());
  t.line("predicted peak: {}", v["plan"]["peak_when"].get<std::string>());
  t.line("");
  t.line("{:<28} {:>14} {:>14} {:>9}", "memory at the peak", "predicted MiB", "measured MiB",
         "error");
  for (const auto& [name, c] : v["memory"]["categories"].items())
    t.line("  {:<26} {:>14.3f} {:>14.3f} {:>9}", name, c["predicted_bytes"].get<double>() / kMiB,
           c["measured_bytes"].get<double>() / kMiB, percent(c["rel_error"]));
  const auto& m = v["memory"];
  t.line("  {:<26} {:>14.3f} {:>14.3f} {:>9}", "peak",
         m["peak_predicted_bytes"].get<double>() / kMiB,
         m["peak_measured_bytes"].get<double>() / kMiB, percent(m["peak_rel_error"]));
  t.line("");
  const auto& tm = v["time"];
  t.line("{:<28} {:>14} {:>14} {:>9}", "time per step", "predicted s", "measured s", "error");
  t.line("  {:<26} {:>14.4f} {:>14.4f} {:>9}", "step", tm["step_predicted_s"].get<double>(),
         tm["step_measured_s"].get<double>(), percent(tm["step_rel_error"]));
  const auto& parts = tm["parts"];
  t.line("  {:<26} {:>14.4f} {:>14.4f} {:>9}", "compute (with optimizer)",
         parts["compute"]["predicted_s"].get<double>(),
         parts["compute"]["measured_s"].get<double>(), percent(parts["compute"]["rel_error"]));
  t.line("  {:<26} {:>14.4f} {:>14.4f} {:>9}", "communication",
         parts["communication"]["predicted_s"].get<double>(),
         parts["communication"]["measured_s"].get<double>(),
         percent(parts["communication"]["rel_error"]));
  t.line("  {:<26} {:>14} {:>14.4f} {:>9}", "other (copies, gaps)", "-",
         parts["other"]["measured_s"].get<double>(), "");
  t.line("  {:<26} {:>14.0f} {:>14.0f} {:>9}", "bytes sent per rank",
         tm["comm_bytes"]["predicted_bytes"].get<double>(),
         tm["comm_bytes"]["measured_bytes"].get<double>(), percent(tm["comm_bytes"]["rel_error"]));
  if (tm.contains("achieved_TFLOPs"))
    t.line("  {:<26} {:>14} {:>14.1f}", "achieved TFLOP/s", "-",
           tm["achieved_TFLOPs"].get<double>());
  if (tm.contains("mfu"))
    t.line("  {:<26} {:>14} {:>13.1f}%", "MFU", "-", 100 * tm["mfu"].get<double>());
  if (!v["notes"].empty()) {
    t.line("");
    t.line("notes");
    for (const auto& n : v["notes"]) t.line("  - {}", n.get<std::string>());
  }
  t.line("");
  t.line("peak memory error {}, step time error {}", percent(m["peak_rel_error"]),
         percent(tm["step_rel_error"]));
  return t.str;
}

}  // namespace shardplan::planner
