#include "planner/estimate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/input_error.hpp"
#include "core/whole_count.hpp"
#include "documents/recipe.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;
using namespace core;

// Bytes in the largest binary unit that keeps a digit before the point: 0.00 GiB says nothing
// about a 3 MiB buffer (the CPU profiles' and tiny models' sizes).
std::string gib(double bytes) {
  const double a = std::abs(bytes);
  if (a >= kGiB || a == 0) return fmt::format("{:.2f} GiB", bytes / kGiB);
  if (a >= kGiB / 1024) return fmt::format("{:.2f} MiB", bytes / (kGiB / 1024));
  if (a >= 1024) return fmt::format("{:.2f} KiB", bytes / 1024);
  return fmt::format("{:.0f} B", bytes);
}

std::string seconds(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

Verdict verdict_of(const Scenario& sc, const Evaluation& e) {
  if (e.fits) return Verdict::fits;
  if (e.result.valid && e.result.peak_bytes <= sc.hardware.memory_bytes) return Verdict::tight;
  return Verdict::does_not_fit;
}

const char* verdict_name(Verdict v) {
  switch (v) {
  case Verdict::fits:
    return "fits";
  case Verdict::tight:
    return "tight";
  case Verdict::does_not_fit:
    return "does not fit";
  }
  return "?";
}

StepInput step_input(const Scenario& sc, const ShardingSpec& spec, const TrainingJob& job) {
  StepInput in;
  in.model = &sc.model;
  in.hardware = &sc.hardware;
  in.cluster = sc.cluster;
  in.job = job;
  in.spec = spec;
  in.accounting = sc.accounting;
  return in;
}

namespace {

// A data-parallel plan's one stage: the whole model, its peak, its compute per micro-batch.
void report_one_stage(const Scenario& sc, Evaluation& e) {
  const auto& r = e.result;
  StageReport st;
  st.blocks = static_cast<double>(sc.model.layers);
  st.at_peak = r.at_peak;
  st.peak_when = r.peak_when;
  st.forward_s = r.forward_per_mb_s;
  st.backward_s = r.backward_per_mb_s;
  e.stages = {st};
  e.exposed_s = {};
  e.exposed_s.data = r.exposed_comm_s;
  e.bytes = {};
  e.bytes.data = r.comm_bytes_per_gpu;
}

}  // namespace

Evaluation evaluate(const Scenario& sc, const ShardingSpec& spec, const TrainingJob& job,
                    Trace* trace) {
  Evaluation e;
  e.spec = spec;
  e.job = job;
  e.result = simulate_step(step_input(sc, spec, job), trace);
  e.fits = e.result.valid && e.result.peak_bytes <= sc.usable_bytes();
  report_one_stage(sc, e);
  return e;
}

Evaluation layout_evaluation(const Scenario& sc, const ShardingSpec& spec, const TrainingJob& job,
                             const ParallelLayout& layout, const ParallelStep& step) {
  Evaluation e;
  e.spec = spec;
  e.job = job;
  e.result = step.step;
  e.fits = e.result.valid && e.result.peak_bytes <= sc.usable_bytes();
  e.layout = layout;
  if (layout.trivial()) {
    report_one_stage(sc, e);
    return e;
  }
  for (const auto& m : step.memory.stages) {
    const auto i = static_cast<std::size_t>(m.stage);
    StageReport st;
    st.stage = m.stage;
    st.blocks = m.blocks;
    st.in_flight = m.in_flight;
    st.at_peak = {m.param_bytes,      m.grad_bytes,   m.optimizer_bytes,
                  m.activation_bytes, m.buffer_bytes, m.overhead_bytes};
    // A context-parallel rank's walk names its moment in the summary; the stages' model theirs.
    st.peak_when =
        m.moment.empty() && step.memory.stages.size() == 1 ? step.step.peak_when : m.moment;
    st.forward_s = i < step.stage_forward_s.size() ? step.stage_forward_s[i] : 0.0;
    st.backward_s = i < step.stage_backward_s.size() ? step.stage_backward_s[i] : 0.0;
    e.stages.push_back(st);
  }
  e.step_stage = step.step_stage;
  e.bubble_s = step.bubble_s;
  e.bubble_fraction = step.walk.bubble_fraction;
  e.exposed_s = {step.tp_exposed_s, step.cp_exposed_s, 0.0, step.dp_exposed_s};
  e.bytes = {step.tp_bytes, step.cp_bytes, step.pp_bytes, step.dp_bytes};
  return e;
}

Evaluation evaluate_layout(const Scenario& sc, const ShardingSpec& spec, const TrainingJob& job,
                           const ParallelLayout& layout) {
  if (layout.trivial()) return evaluate(sc, spec, job);
  return layout_evaluation(sc, spec, job, layout,
                           simulate_parallel_step(step_input(sc, spec, job), layout));
}

Evaluation evaluate_choosing_micro_batch(const Scenario& sc, const ShardingSpec& spec,
                                         Trace* trace) {
  if (sc.job.micro_batch > 0) return evaluate(sc, spec, sc.job, trace);
  const std::int64_t per_gpu = sc.job.global_batch / sc.cluster.gpus;
  std::vector<std::int64_t> divisors;
  for (std::int64_t b = per_gpu; b >= 1; --b)
    if (per_gpu % b == 0) divisors.push_back(b);
  TrainingJob job = sc.job;
  for (auto b : divisors) {
    job.micro_batch = b;
    auto e = evaluate(sc, spec, job);
    if (e.fits || b == 1) {
      if (trace) e = evaluate(sc, spec, job, trace);
      return e;
    }
  }
  job.micro_batch = 1;
  return evaluate(sc, spec, job, trace);
}

void check_countable(const Scenario& sc, const Evaluation& e) {
  const auto& r = e.result;
  if (!(r.peak_bytes > kMaxCount)) return;
  const double states = total(r.model_states);
  const std::string what = fmt::format(
      "{} needs {:.3g} bytes per GPU under {} ({:.3g} of them model states), past the {:.3g} "
      "(2^62) a plan can count",
      sc.model.name, r.peak_bytes, e.spec.strategy, states, kMaxCount);
  if (states > kMaxCount)
    throw InputError(sc.model.architecture == Architecture::uniform ? "--params" : "--model", what);
  if (sc.job.micro_batch > 0)
    throw InputError("--micro-batch", fmt::format("{} sequences of {} tokens: {}",
                                                  e.job.micro_batch, e.job.seq_len, what));
  throw InputError("--seq-len", fmt::format("{} tokens, even 1 sequence per micro-batch: {}",
                                            e.job.seq_len, what));
}

std::string scenario_line(const Scenario& sc) {
  const auto& m = sc.model;
  const double params = static_cast<double>(m.total_params());
  const std::string count =
      params >= 1e9 ? fmt::format("{:.2f} B", params / 1e9) : fmt::format("{:.2f} M", params / 1e6);
  return fmt::format(
      "{} ({} params) on {} x {} ({} node{}), seq {}, global batch {}, {} {}, recipe {}", m.name,
      count, sc.cluster.gpus, sc.hardware.name, sc.cluster.nodes(),
      sc.cluster.nodes() == 1 ? "" : "s", sc.job.seq_len, sc.job.global_batch,
      precision_name(sc.job.precision), optimizer_name(sc.job.optimizer),
      recipe_name(sc.job.recipe));
}

std::vector<std::pair<std::string, double>> exposed_by_wait(const StepResult& r) {
  std::vector<std::pair<std::string, double>> out;
  const int host = static_cast<int>(Stream::host);
  // The CPU step is exposed in full unless the hardware blocks (then the stream claims none of it).
  const double cpu = std::min(r.host_optimizer_s, r.exposed_s[host]);
  for (int s = 1; s < kStreams; ++s)
    out.emplace_back(stream_name(static_cast<Stream>(s)), r.exposed_s[s] - (s == host ? cpu : 0.0));
  out.emplace_back(kCpuOptimizerWait, cpu);
  return out;
}

namespace {

nlohmann::json memory_json(const Scenario& sc, const StepResult& r) {
  nlohmann::json breakdown = nlohmann::json::object();
  nlohmann::json states = nlohmann::json::object();
  for (int c = 0; c < kCategories; ++c) {
    breakdown[category_name(static_cast<Category>(c))] = count_json(r.at_peak[c]);
    if (c <= static_cast<int>(Category::optimizer_states))
      states[category_name(static_cast<Category>(c))] = count_json(r.model_states[c]);
  }
  return {{"peak_bytes", count_json(r.peak_bytes)},
          {"allocated_peak_bytes", count_json(r.allocated_peak_bytes)},
          {"reserve_bytes", count_json(r.reserve_bytes)},
          {"device_bytes", count_json(r.device_bytes)},
          {"margin_bytes", count_json(sc.usable_bytes() - r.peak_bytes)},
          {"capacity_bytes", count_json(r.capacity_bytes)},
          {"usable_bytes", count_json(sc.usable_bytes())},
          {"breakdown", breakdown},
          {"model_states", states},
          {"model_states_bytes", count_json(total(r.model_states))},
          {"peak_when", r.peak_when}};
}

nlohmann::json dimensions_json(const ByDimension& v) {
  return {{"tensor", v.tensor}, {"context", v.context}, {"pipeline", v.pipeline}, {"data", v.data}};
}

nlohmann::json time_json(const Evaluation& e) {
  const auto& r = e.result;
  nlohmann::json exposed = nlohmann::json::object();
  for (const auto& [name, s] : exposed_by_wait(r)) exposed[name] = s;
  nlohmann::json by_kind = nlohmann::json::object();
  for (int k = 0; k < kComputeKinds; ++k)
    by_kind[compute_kind_name(static_cast<ComputeKind>(k))] = r.compute_by_kind_s[k];
  nlohmann::json out = {{"step_s", r.step_s},
                        {"compute_s", r.compute_s},
                        {"recompute_s", r.recompute_s},
                        {"optimizer_s", r.optimizer_s},
                        {"compute_by_kind_s", by_kind},
                        {"step_stage", e.step_stage},
                        {"bubble_s", e.bubble_s},
                        {"bubble_fraction", e.bubble_fraction},
                        {"exposed_comm_s", r.exposed_comm_s},
                        {"straggler_wait_s", r.straggler_wait_s},
                        {"exposed_by_dimension_s", dimensions_json(e.exposed_s)},
                        {"exposed_by_stream_s", exposed}};
  if (r.host_optimizer_s > 0) out["host_optimizer_s"] = r.host_optimizer_s;
  return out;
}

nlohmann::json comm_json(const Evaluation& e) {
  const auto& r = e.result;
  nlohmann::json bytes_by_op = nlohmann::json::object();
  for (int op = 0; op < kCollectives; ++op)
    if (r.comm_bytes_by_op[op] > 0)
      bytes_by_op[traits(static_cast<Collective>(op)).name] = r.comm_bytes_by_op[op];
  return {{"bytes_per_gpu", r.comm_bytes_per_gpu},
          {"bytes_by_dimension", dimensions_json(e.bytes)},
          {"bytes_by_collective", bytes_by_op},
          {"calibrated", r.calibrated_comm},
          {"extrapolated", r.extrapolated_comm}};
}

nlohmann::json stages_json(const Evaluation& e) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : e.stages) {
    nlohmann::json bytes = nlohmann::json::object();
    for (int c = 0; c < kCategories; ++c)
      bytes[category_name(static_cast<Category>(c))] = count_json(st.at_peak[c]);
    stages.push_back({{"stage", st.stage},
                      {"blocks", st.blocks},
                      {"in_flight_micro_batches", st.in_flight},
                      {"peak_bytes", count_json(total(st.at_peak))},
                      {"peak_when", st.peak_when},
                      {"breakdown", bytes},
                      {"forward_s", st.forward_s},
                      {"backward_s", st.backward_s}});
  }
  return stages;
}

}  // namespace

nlohmann::json evaluation_to_json(const Scenario& sc, const Evaluation& e) {
  const auto& r = e.result;
  const auto& l = e.layout;
  const int d = l.data_parallel(sc.cluster.gpus);
  auto parallelism = documents::layout_to_json(l);
  parallelism["data_parallel"] = d;
  parallelism["micro_batches"] = r.grad_accumulation;  // per replica and step, whatever the layout
  nlohmann::json out = {{"model", sc.model.name},
                        {"hardware", sc.hardware.name},
                        {"gpus", sc.cluster.gpus},
                        {"gpus_per_node", sc.cluster.gpus_per_node},
                        {"strategy", e.spec.strategy},
                        {"flavour", flavour_name(e.spec.flavour)},
                        {"shard_group_size", e.spec.group(std::max(1, d) * l.context_parallel)},
                        {"offload", offload_name(e.spec.offload)},
                        {"micro_batch", e.job.micro_batch},
                        {"grad_accumulation", r.grad_accumulation},
                        {"checkpointing", checkpointing_label(e.job)},
                        {"precision", precision_name(e.job.precision)},
                        {"optimizer", optimizer_name(e.job.optimizer)},
                        {"params", r.params},
                        {"valid", r.valid},
                        {"fits", e.fits},
                        {"verdict", verdict_name(verdict_of(sc, e))},
                        {"recipe", recipe_name(e.job.recipe)},
                        {"loss", loss_label(e.job)},
                        {"compile", e.job.compile},
                        {"float8", float8_recipe_name(e.job.float8)},
                        {"memory", memory_json(sc, r)},
                        {"time", time_json(e)},
                        {"comm", comm_json(e)},
                        {"throughput", {{"tokens_per_s", r.tokens_per_s}}},
                        {"mfu", r.mfu},
                        {"parallelism", parallelism},
                        {"stages", stages_json(e)}};
  if (const auto mp = fsdp_mixed_precision(e.spec, compute_dtype(e.job.precision))) {
    out["fsdp_mixed_precision"] = fsdp_mixed_precision_name(*mp);
    out["reduce_dtype"] = dtype_name(e.spec.reduce_dtype);
  }
  if (!r.valid) out["reason"] = r.reason;
  out["schema_version"] = kEstimateSchemaVersion;
  return out;
}

namespace {

// "parallelism: tensor 8 with sequence parallel, pipeline 4 (interleaved-1f1b, 5 virtual stages,
// 8 micro-batches of 1), context 1, data 8 (fsdp-full)"
std::string layout_line(const Scenario& sc, const Evaluation& e) {
  const auto& l = e.layout;
  std::string pipe =
      fmt::format("pipeline {} ({}", l.pipeline_parallel, documents::schedule_name(l.schedule));
  if (l.virtual_stages > 1) pipe += fmt::format(", {} virtual stages", l.virtual_stages);
  pipe += fmt::format(", {} micro-batch{} of {}", l.micro_batches, l.micro_batches == 1 ? "" : "es",
                      e.job.micro_batch);
  // The split, where the embeddings and the head count as blocks (the recipe's or the flags').
  if (l.first_stage_less_layers > 0 || l.last_stage_less_layers > 0)
    pipe += fmt::format(", the embeddings and the head counted as {} and {} blocks",
                        l.first_stage_less_layers, l.last_stage_less_layers);
  pipe += ")";
  // torch's ring passing its keys and values rank to rank (--cp-rotate-method alltoall).
  const std::string ring = l.cp_rotate == documents::CpRotate::all_to_all ? " (keys rotated)" : "";
  return fmt::format("parallelism: tensor {}{}{}, {}, context {}{}, data {} ({})",
                     l.tensor_parallel, l.sequence_parallel ? " with sequence parallel" : "",
                     l.async_tensor_parallel ? " (async)" : "", pipe, l.context_parallel, ring,
                     l.data_parallel(sc.cluster.gpus), e.spec.strategy);
}

// The table's memory part: the peak by category, against the capacity, and the verdict.
void memory_lines(Text& text, const Scenario& sc, const Evaluation& e) {
  const auto& r = e.result;
  text.line("memory per GPU at the peak");
  const char* labels[kCategories] = {"parameters",
                                     "gradients",
                                     "optimizer states",
                                     "activations",
                                     "buffers (gathered params, buckets)",
                                     "overhead (context, NCCL, fragmentation)"};
  for (int c = 0; c < kCategories; ++c) text.line("  {:<42} {:>12}", labels[c], gib(r.at_peak[c]));
  text.line("  {:<42} {:>12}   of {} ({} usable with {:.0f}% headroom)", "peak", gib(r.peak_bytes),
            gib(r.capacity_bytes), gib(sc.usable_bytes()), sc.headroom * 100);
  text.line("  {:<42} {}", "peak happens at", r.peak_when);
  text.line("  {:<42} {:>12}   (what model-state-only estimators report)", "model states alone",
            gib(total(r.model_states)));
  text.line("  compare with: torch.cuda.max_memory_allocated() {}, max_memory_reserved() {}, "
            "nvidia-smi {}",
            gib(r.allocated_peak_bytes), gib(r.allocated_peak_bytes + r.reserve_bytes),
            gib(r.peak_bytes));
  switch (verdict_of(sc, e)) {
  case Verdict::fits:
    text.line("  verdict: FITS ({} to spare beyond the {:.0f}% headroom)",
              gib(sc.usable_bytes() - r.peak_bytes), sc.headroom * 100);
    break;
  case Verdict::tight:
    text.line("  verdict: TIGHT (fits the {} device with {} to spare, inside the {:.0f}% headroom)",
              gib(r.capacity_bytes), gib(r.capacity_bytes - r.peak_bytes), sc.headroom * 100);
    break;
  case Verdict::does_not_fit:
    text.line("  verdict: DOES NOT FIT (over the device by {})",
              gib(r.peak_bytes - r.capacity_bytes));
    break;
  }
}

// A pipeline's compute is its step stage's, the last to finish its optimizer step: its micro-
// batches' forward and backward (the stage table's compute; the waits are the lines below), and
// its optimizer step.
void step_stage_line(Text& text, const Evaluation& e) {
  const auto& st = e.stages.at(static_cast<std::size_t>(e.step_stage));
  text.line("    of stage {}, the last to finish: {} x ({} + {}) per micro-batch and the optimizer "
            "step {}",
            st.stage, e.result.grad_accumulation, seconds(st.forward_s), seconds(st.backward_s),
            seconds(e.result.optimizer_s));
}

// The table's time part: compute by kind of op, the pipeline's bubble, each stream's (or with
// model parallelism each dimension's) exposed time, the step, throughput.
void time_lines(Text& text, const Evaluation& e) {
  const auto& r = e.result;
  text.line("time per optimizer step");
  text.line("  {:<42} {:>12}", "compute (forward, backward, optimizer)", seconds(r.compute_s));
  // Where the compute stream's time goes, by kind of op (costmodel/compute_time.hpp).
  const char* kind_labels[kComputeKinds] = {"GEMMs",
                                            "attention core",
                                            "memory-bound (norms, activations, loss)",
                                            "host overhead (launches, hooks)",
                                            "recompute",
                                            "optimizer step"};
  // An offloaded optimizer step runs on the host's CPUs, not the compute stream: its own line.
  const bool host_optimizer = r.host_optimizer_s > 0;
  // (Shown for one stage: under a pipeline the stage line says whose compute the step's is.)
  const bool kinds_known = e.layout.pipeline_parallel == 1;
  for (int k = 0; k < kComputeKinds && kinds_known; ++k)
    if (r.compute_by_kind_s[k] > 0 ||
        (k == static_cast<int>(ComputeKind::optimizer) && !host_optimizer))
      text.line("  {:<42} {:>12}", fmt::format("  {}", kind_labels[k]),
                seconds(r.compute_by_kind_s[k]));
  // The simulator runs it on the host stream, the trace on its own lane: the transfers' line
  // counts the transfers alone, the step's line all of its time (the GPU waits for all of it).
  if (e.stages.size() > 1) step_stage_line(text, e);
  if (host_optimizer)
    text.line("  {:<42} {:>12}   (exposed: the GPUs wait for it)",
              "optimizer step on the host's CPUs", seconds(r.host_optimizer_s));
  if (!e.layout.trivial()) {
    const auto& l = e.layout;
    if (l.pipeline_parallel > 1)
      text.line("  {:<42} {:>12}", "pipeline bubble (with the stages' sends)", seconds(e.bubble_s));
    const std::tuple<const char*, double, bool> waits[] = {
        {"tensor parallel", e.exposed_s.tensor, l.tensor_parallel > 1},
        {"context parallel", e.exposed_s.context, l.context_parallel > 1},
        {"pipeline sends", e.exposed_s.pipeline, e.exposed_s.pipeline > 0},
        {"data parallel", e.exposed_s.data, true}};
    for (const auto& [what, t, shown] : waits)
      if (shown) text.line("  {:<42} {:>12}", fmt::format("exposed {}", what), seconds(t));
  }
  for (int s = 1; s < kStreams && e.layout.trivial(); ++s) {
    const double apart = s == static_cast<int>(Stream::host) ? r.host_optimizer_s : 0.0;
    const double exposed = std::max(0.0, r.exposed_s[s] - apart),
                 busy = std::max(0.0, r.busy_s[s] - apart);
    if (exposed > 0 || busy > 0)
      text.line("  {:<42} {:>12}   (busy {})",
                fmt::format("exposed {}", stream_name(static_cast<Stream>(s))), seconds(exposed),
                seconds(busy));
  }
  text.line("  {:<42} {:>12}", "step", seconds(r.step_s));
  text.line(
      "  throughput {:.0f} tokens/s for the job, MFU {:.1f}%, {:.2f} GB sent per GPU per step{}",
      r.tokens_per_s, r.mfu * 100, r.comm_bytes_per_gpu / 1e9,
      r.calibrated_comm ? (r.extrapolated_comm ? " (calibrated curves, extrapolated in group size)"
                                               : " (calibrated curves)")
                        : " (datasheet links)");
}

// Per pipeline stage: its blocks, the micro-batches it holds, its peak by category (the overhead
// too: the columns add up to the peak), its compute.
void stage_lines(Text& text, const Evaluation& e) {
  text.line("{:>5} {:>6} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "stage", "blocks", "in flight", "parameters", "gradients", "optimizer", "buffers",
            "activations", "overhead", "peak", "forward/mb", "backward/mb");
  for (const auto& st : e.stages) {
    const auto c = [&](Category k) { return gib(st.at_peak[static_cast<int>(k)]); };
    text.line("{:>5} {:>6g} {:>9g} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
              st.stage, st.blocks, st.in_flight, c(Category::parameters), c(Category::gradients),
              c(Category::optimizer_states), c(Category::buffers), c(Category::activations),
              c(Category::overhead), gib(total(st.at_peak)), seconds(st.forward_s),
              seconds(st.backward_s));
  }
}

// ", linears in Float8 rowwise (torchao; lm_head in 16 bits)": what the job converts.
std::string float8_label(const TrainingJob& j) {
  if (j.float8 == documents::Float8Recipe::none) return "";
  return fmt::format(", linears in Float8 {} (torchao){}", float8_recipe_name(j.float8),
                     j.float8_filter.empty()
                         ? ""
                         : fmt::format("; {} in 16 bits", fmt::join(j.float8_filter, ", ")));
}

}  // namespace

std::string evaluation_table(const Scenario& sc, const Evaluation& e) {
  const auto& r = e.result;
  Text text;
  text.line("training code: recipe {} ({}), loss {}{}{}", recipe_name(e.job.recipe),
            recipe_traits(e.job.recipe).description, loss_label(e.job),
            e.job.compile ? ", blocks and loss compiled (torch.compile)" : "", float8_label(e.job));
  if (!e.layout.trivial()) text.line("{}", layout_line(sc, e));
  text.line("plan: {} ({}){}, micro-batch {} x {} accumulation, checkpointing {}, offload {}",
            e.spec.strategy, flavour_name(e.spec.flavour),
            e.spec.shard_group_size > 0 ? fmt::format(", shard group {}", e.spec.shard_group_size)
                                        : "",
            e.job.micro_batch, r.grad_accumulation, checkpointing_label(e.job),
            offload_name(e.spec.offload));
  if (!r.valid) {
    text.line("not runnable: {}", r.reason);
    return text.str;
  }
  text.line("");
  memory_lines(text, sc, e);
  text.line("");
  time_lines(text, e);
  if (e.stages.size() > 1) {
    text.line("");
    stage_lines(text, e);
  }
  return text.str;
}

nlohmann::json trace_to_chrome_json(const Trace& t) {
  // Two processes: the simulated GPU (one rank: its compute and communication streams and the
  // copies over the host link) and the host's CPUs (an offloaded optimizer step).
  constexpr int kGpu = 1, kHost = 2, kCpuOptimizer = 0;
  nlohmann::json events = nlohmann::json::array();
  auto meta = [&](const char* what, int pid, int tid, const std::string& name) {
    nlohmann::json m = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
    if (tid >= 0) m["tid"] = tid;
    events.push_back(std::move(m));
  };
  const bool host_cpu =
      std::any_of(t.spans.begin(), t.spans.end(), [](const TraceSpan& s) { return s.host_cpu; });
  meta("process_name", kGpu, -1, "GPU (one rank, simulated step)");
  // Every stream up to the host's; the context ring's where the step has one.
  for (int s = 0; s < kStreams; ++s)
    if (s <= static_cast<int>(Stream::host) ||
        std::any_of(t.spans.begin(), t.spans.end(),
                    [&](const TraceSpan& sp) { return static_cast<int>(sp.stream) == s; }))
      meta("thread_name", kGpu, s, stream_name(static_cast<Stream>(s)));
  if (host_cpu) {
    meta("process_name", kHost, -1, "host CPUs");
    meta("thread_name", kHost, kCpuOptimizer, "CPU optimizer");
  }
  for (const auto& sp : t.spans)
    events.push_back({{"ph", "X"},
                      {"name", sp.name},
                      {"pid", sp.host_cpu ? kHost : kGpu},
                      {"tid", sp.host_cpu ? kCpuOptimizer : static_cast<int>(sp.stream)},
                      {"ts", sp.start_s * 1e6},
                      {"dur", sp.duration_s * 1e6}});
  // Flow arrows: each all-gather of a unit to the first compute of that unit that starts once the
  // gather has finished (the forward, recompute or backward that waits for it).
  std::map<int, std::vector<double>> compute_starts;  // unit -> its compute spans' starts
  for (const auto& c : t.spans)
    if (c.stream == Stream::compute && !c.host_cpu && c.unit >= 0)
      compute_starts[c.unit].push_back(c.start_s);
  for (auto& [unit, starts] : compute_starts) std::sort(starts.begin(), starts.end());
  int flow_id = 0;
  for (const auto& ag : t.spans) {
    if (ag.stream != Stream::all_gather || ag.unit < 0) continue;
    const auto it = compute_starts.find(ag.unit);
    if (it == compute_starts.end()) continue;
    const double done = ag.start_s + ag.duration_s;
    const auto w = std::lower_bound(it->second.begin(), it->second.end(), done - 1e-12 * done);
    if (w == it->second.end()) continue;
    ++flow_id;
    events.push_back({{"ph", "s"},
                      {"id", flow_id},
                      {"name", "gathered parameters"},
                      {"cat", "dependency"},
                      {"pid", kGpu},
                      {"tid", static_cast<int>(Stream::all_gather)},
                      {"ts", (ag.start_s + ag.duration_s / 2) * 1e6}});
    events.push_back({{"ph", "f"},
                      {"bp", "e"},
                      {"id", flow_id},
                      {"name", "gathered parameters"},
                      {"cat", "dependency"},
                      {"pid", kGpu},
                      {"tid", static_cast<int>(Stream::compute)},
                      {"ts", *w * 1e6}});
  }
  for (const auto& m : t.memory)
    events.push_back({{"ph", "C"},
                      {"name", "memory allocated (GiB)"},
                      {"pid", kGpu},
                      {"ts", m.time_s * 1e6},
                      {"args", {{"GiB", m.bytes / kGiB}}}});
  return {{"schema_version", 1}, {"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void compare_table(const Scenario& sc, const std::vector<Evaluation>& evals, std::ostream& out) {
  if (!sc.defaulted.empty()) out << defaults_line(sc) << "\n";
  out << scenario_line(sc) << "\n" << hardware_line(sc) << "\n";
  // The checkpointing column is as wide as its longest label ("selective-attention").
  std::size_t ckpt = std::string("checkpointing").size();
  for (const auto& e : evals) ckpt = std::max(ckpt, documents::checkpointing_label(e.job).size());
  out << fmt::format("{:<14} {:<10} {:>5} {:<{}} {:>11} {:>11} {:>11} {:>10} {:>11} {:>7}  {}\n",
                     "strategy", "flavour", "mb", "checkpointing", ckpt, "states GiB", "peak GiB",
                     "step s", "exposed s", "tokens/s", "MFU", "verdict");
  for (const auto& e : evals) {
    const auto& r = e.result;
    if (!r.valid) {
      out << fmt::format("{:<14} {:<10} not runnable: {}\n", e.spec.strategy,
                         documents::flavour_name(e.spec.flavour), r.reason);
      continue;
    }
    out << fmt::format("{:<14} {:<10} {:>5} {:<{}} {:>11.2f} {:>11.2f} {:>11.3f} {:>10.3f} "
                       "{:>11.0f} {:>6.1f}%  {}\n",
                       e.spec.strategy, documents::flavour_name(e.spec.flavour), e.job.micro_batch,
                       documents::checkpointing_label(e.job), ckpt,
                       documents::total(r.model_states) / (1 << 30), r.peak_bytes / (1 << 30),
                       r.step_s, r.exposed_comm_s, r.tokens_per_s, 100 * r.mfu,
                       e.fits ? "fits" : "DOES NOT FIT");
  }
}

}  // namespace shardplan::planner
