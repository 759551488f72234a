#include "executor/run_document.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "core/version.hpp"
#include "core/whole_count.hpp"
#include "documents/plan.hpp"

namespace shardplan::executor {
namespace {

// rank, peak, capacity, 2 breakdowns, reserved peak, context, NCCL
constexpr std::size_t kHeader = 6 + 2 * kMemoryCategoryCount;
constexpr std::size_t kPerStep = 16 + 4 * kCollectiveKindCount;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<StepReport> steady(const std::vector<StepReport>& steps) {
  if (steps.size() <= 1) return steps;
  return {steps.begin() + 1, steps.end()};
}

nlohmann::json breakdown_json(const MemoryBreakdown& b) {
  nlohmann::json j = nlohmann::json::object();
  for (auto c : kMemoryCategories) j[category_name(c)] = b[c];
  return j;
}

nlohmann::json collectives_json(const CollectiveStats& s) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& t = s.kinds[k];
    j[collective_kind_name(static_cast<CollectiveKind>(k))] = {{"calls", t.calls},
                                                               {"seconds", t.seconds},
                                                               {"size_bytes", t.size_bytes},
                                                               {"bytes_sent", t.bytes_sent}};
  }
  return j;
}

// The model FLOPs of one optimizer step on one rank: 3 × the forward's (forward, and a backward of
// twice its FLOPs), counted as documents/model.hpp counts them, without the
// recompute of checkpointing (PaLM's model FLOPs, Chowdhery et al. 2022, appendix B).
double model_flops_per_step(const EngineOptions& o) {
  const auto& m = o.model;
  const double forward_per_token =
      static_cast<double>(m.layers) *
          documents::block_forward_flops_per_token(m, o.micro_batch.seq) +
      documents::head_forward_flops_per_token(m);
  const double tokens =
      static_cast<double>(o.micro_batch.tokens()) * static_cast<double>(o.grad_accumulation);
  return 3.0 * forward_per_token * tokens;
}

}  // namespace

std::size_t packed_size(std::size_t steps) { return kHeader + kPerStep * steps; }

std::vector<double> pack(const RankRecord& r) {
  std::vector<double> v;
  v.reserve(packed_size(r.steps.size()));
  v.push_back(r.rank);
  v.push_back(static_cast<double>(r.peak_bytes));
  // No limit (kUnlimited, 2^63 − 1: no double holds it) travels as −1.
  v.push_back(r.capacity_bytes == TrackedAllocator::kUnlimited
                  ? -1.0
                  : static_cast<double>(r.capacity_bytes));
  for (auto c : kMemoryCategories) v.push_back(static_cast<double>(r.at_peak[c]));
  for (auto c : kMemoryCategories) v.push_back(static_cast<double>(r.category_peaks[c]));
  for (auto x : {r.reserved_peak_bytes, r.context_bytes, r.nccl_bytes})
    v.push_back(static_cast<double>(x));
  for (const auto& s : r.steps) {
    for (double x :
         {static_cast<double>(s.step), s.loss, s.step_s, s.compute_s, s.optimizer_s, s.copy_s,
          s.step_cpu_s, s.compute_cpu_s, s.comm_wait_s, s.forward_s, s.backward_s, s.gather_wait_s,
          s.reduce_wait_s, s.replica_wait_s, s.loss_scale, s.skipped ? 1.0 : 0.0})
      v.push_back(x);
    for (const auto& t : s.collectives.kinds)
      for (double x : {static_cast<double>(t.calls), t.seconds, t.size_bytes, t.bytes_sent})
        v.push_back(x);
  }
  return v;
}

RankRecord unpack(const std::vector<double>& v, std::size_t steps) {
  if (v.size() != packed_size(steps))
    throw std::invalid_argument("rank record of the wrong length");
  RankRecord r;
  std::size_t i = 0;
  auto next = [&] { return v[i++]; };
  auto as_int = [](double x) {
    const auto n = core::rounded_count(x);  // packed from int64s: a count past 2^62 is corrupt
    if (!n) throw std::invalid_argument(fmt::format("rank record holds {}, not a count", x));
    return *n;
  };
  r.rank = static_cast<int>(as_int(next()));
  r.peak_bytes = as_int(next());
  const double capacity = next();
  r.capacity_bytes = capacity < 0 ? TrackedAllocator::kUnlimited : as_int(capacity);
  for (auto c : kMemoryCategories) r.at_peak[c] = as_int(next());
  for (auto c : kMemoryCategories) r.category_peaks[c] = as_int(next());
  r.reserved_peak_bytes = as_int(next());
  r.context_bytes = as_int(next());
  r.nccl_bytes = as_int(next());
  for (std::size_t k = 0; k < steps; ++k) {
    StepReport s;
    s.step = as_int(next());
    s.loss = next();
    s.step_s = next();
    s.compute_s = next();
    s.optimizer_s = next();
    s.copy_s = next();
    s.step_cpu_s = next();
    s.compute_cpu_s = next();
    s.comm_wait_s = next();
    s.forward_s = next();
    s.backward_s = next();
    s.gather_wait_s = next();
    s.reduce_wait_s = next();
    s.replica_wait_s = next();
    s.loss_scale = next();
    s.skipped = next() != 0;
    for (auto& t : s.collectives.kinds) {
      t.calls = as_int(next());
      t.seconds = next();
      t.size_bytes = next();
      t.bytes_sent = next();
    }
    r.steps.push_back(s);
  }
  return r;
}

double steady_median(const std::vector<StepReport>& steps, double StepReport::*field) {
  std::vector<double> v;
  for (const auto& s : steady(steps)) v.push_back(s.*field);
  return median(v);
}

namespace {

// The plan and its prediction, copied so the run document stands alone.
void add_plan(nlohmann::json& doc, const documents::Plan& plan) {
  const auto plan_json = documents::plan_to_json(plan);
  doc["plan"] = {
      {"strategy", plan.spec.strategy},   {"flavour", documents::flavour_name(plan.spec.flavour)},
      {"hardware", plan.hardware},        {"model", plan.model.name},
      {"gpus", plan.cluster.gpus},        {"job", plan_json["job"]},
      {"sharding", plan_json["sharding"]}};
  doc["prediction"] = plan_json["prediction"];
}

nlohmann::json environment_json(const RunSetup& setup, const RunEnvironment& env) {
  nlohmann::json j = {{"backend", env.backend},
                      {"library", env.library},
                      {"ranks", setup.world},
                      {"hosts", env.hosts},
                      {"rehearsal", env.rehearsal},
                      {"build",
                       {{"compiler", __VERSION__},
#ifdef NDEBUG
                        {"assertions", false}
#else
                        {"assertions", true}
#endif
                       }}};
  if (!env.device.empty()) j["device"] = env.device;
  if (env.rehearsal) {
    j["rehearsed_rank"] = env.rehearsed_rank;
    j["collective_time"] =
        "excluded: a rehearsal stands in for each collective with a local copy of the same size";
  }
  return j;
}

nlohmann::json execution_json(const RunSetup& setup, const ShardingEngine& engine,
                              std::size_t steps, bool on_device) {
  const auto& eo = engine.options();
  return {
      {"precision", documents::precision_name(eo.precision)},
      {"gemm_math", eo.precision != documents::Precision::fp32
                        ? fmt::format("{}, fp32 accumulation",
                                      documents::dtype_name(documents::compute_dtype(eo.precision)))
                        : std::string(on_device ? "tf32" : "fp32")},
      {"attention", eo.model_options.flash_attention ? "flash" : "eager"},
      {"world_size", setup.world},
      {"steps", steps},
      {"micro_batch", eo.micro_batch.batch},
      {"seq_len", eo.micro_batch.seq},
      {"grad_accumulation", eo.grad_accumulation},
      {"global_batch", setup.global_batch},
      {"checkpointing", eo.checkpointing == Checkpointing::full ? "full" : "none"},
      {"shard_group", engine.shards().group},
      {"forward_prefetch_executed", engine.forward_prefetch()},
      {"backward_prefetch_executed", engine.backward_prefetch()},
      {"seed", eo.seed},
      {"lr", eo.adamw.lr},
      {"deviations", setup.deviations},
      {"timing", "per-step wall time on each rank; summaries are medians of steps 2..K"}};
}

// On a device: the pool's reserved peak plus the context and NCCL workspace; the difference to
// the tracked peak goes to `overhead` (see run_document.hpp).
std::int64_t peak_of(const RankRecord& r, bool on_device) {
  return on_device ? r.reserved_peak_bytes + r.context_bytes + r.nccl_bytes : r.peak_bytes;
}

MemoryBreakdown at_peak_of(const RankRecord& r, bool on_device) {
  MemoryBreakdown b = r.at_peak;
  if (on_device) b[MemoryCategory::overhead] += peak_of(r, on_device) - r.peak_bytes;
  return b;
}

nlohmann::json step_json(const StepReport& s) {
  nlohmann::json coll = nlohmann::json::object();
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k)
    coll[collective_kind_name(static_cast<CollectiveKind>(k))] = s.collectives.kinds[k].seconds;
  return {{"step", s.step},
          {"loss", s.loss},
          {"step_s", s.step_s},
          {"compute_s", s.compute_s},
          {"optimizer_s", s.optimizer_s},
          {"copy_s", s.copy_s},
          {"step_cpu_s", s.step_cpu_s},
          {"compute_cpu_s", s.compute_cpu_s},
          {"forward_s", s.forward_s},
          {"backward_s", s.backward_s},
          {"comm_wait_s", s.comm_wait_s},
          {"comm_wait_by_stream_s",
           {{"all_gather", s.gather_wait_s},
            {"reduce", s.reduce_wait_s},
            {"replica", s.replica_wait_s}}},
          {"loss_scale", s.loss_scale},
          {"skipped", s.skipped},
          {"collectives_s", coll}};
}

nlohmann::json rank_memory_json(const RankRecord& r, bool on_device) {
  nlohmann::json memory = {{"peak_bytes", peak_of(r, on_device)},
                           {"tracked_peak_bytes", r.peak_bytes},
                           {"at_peak", breakdown_json(at_peak_of(r, on_device))},
                           {"category_peaks", breakdown_json(r.category_peaks)},
                           {"capacity_bytes", r.capacity_bytes == TrackedAllocator::kUnlimited
                                                  ? nlohmann::json(nullptr)
                                                  : nlohmann::json(r.capacity_bytes)}};
  if (on_device)
    memory["device"] = {
        {"reserved_peak_bytes", r.reserved_peak_bytes},
        {"allocated_peak_bytes", r.peak_bytes},
        {"fragmentation",
         r.peak_bytes > 0
             ? static_cast<double>(r.reserved_peak_bytes) / static_cast<double>(r.peak_bytes) - 1.0
             : 0.0},
        {"cuda_context_bytes", r.context_bytes},
        {"nccl_workspace_bytes", r.nccl_bytes}};
  return memory;
}

// Medians over the steady steps (2..K), each step's record as well.
nlohmann::json rank_time_json(const RankRecord& r, double step_median) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : r.steps) steps.push_back(step_json(s));
  nlohmann::json coll_median = nlohmann::json::object();
  double coll_sum = 0;
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    std::vector<double> v;
    for (const auto& s : steady(r.steps)) v.push_back(s.collectives.kinds[k].seconds);
    const double m = median(v);
    coll_median[collective_kind_name(static_cast<CollectiveKind>(k))] = m;
    coll_sum += m;
  }
  return {{"step_s", step_median},
          {"compute_s", steady_median(r.steps, &StepReport::compute_s)},
          {"optimizer_s", steady_median(r.steps, &StepReport::optimizer_s)},
          {"copy_s", steady_median(r.steps, &StepReport::copy_s)},
          {"step_cpu_s", steady_median(r.steps, &StepReport::step_cpu_s)},
          {"compute_cpu_s", steady_median(r.steps, &StepReport::compute_cpu_s)},
          {"forward_s", steady_median(r.steps, &StepReport::forward_s)},
          {"backward_s", steady_median(r.steps, &StepReport::backward_s)},
          {"comm_wait_s", steady_median(r.steps, &StepReport::comm_wait_s)},
          {"comm_wait_by_stream_s",
           {{"all_gather", steady_median(r.steps, &StepReport::gather_wait_s)},
            {"reduce", steady_median(r.steps, &StepReport::reduce_wait_s)},
            {"replica", steady_median(r.steps, &StepReport::replica_wait_s)}}},
          {"collectives_s", coll_median},
          {"collectives_total_s", coll_sum},
          {"steps", steps}};
}

nlohmann::json rank_json(const RankRecord& r, double step_median, bool on_device) {
  CollectiveStats total;
  for (const auto& s : r.steps) total += s.collectives;
  return {{"rank", r.rank},
          {"memory", rank_memory_json(r, on_device)},
          {"time", rank_time_json(r, step_median)},
          {"collectives", collectives_json(total)}};
}

// The summary: memory of the rank with the highest peak, time of the slowest rank.
nlohmann::json summary_json(const nlohmann::json& peak, const nlohmann::json& slow,
                            const RankRecord& slow_record, const EngineOptions& eo,
                            const RunEnvironment& env) {
  // Bytes the slowest rank sent per step (the cost model's comm_bytes_per_gpu).
  double bytes_sent = 0;
  for (const auto& s : slow_record.steps)
    for (const auto& t : s.collectives.kinds) bytes_sent += t.bytes_sent;
  const double steps = static_cast<double>(std::max<std::size_t>(1, slow_record.steps.size()));
  const double step_s = slow["time"]["step_s"].get<double>();
  const double flops = model_flops_per_step(eo);

  nlohmann::json summary = {{"memory",
                             {{"peak_bytes", peak["memory"]["peak_bytes"]},
                              {"rank", peak["rank"]},
                              {"at_peak", peak["memory"]["at_peak"]}}},
                            {"time",
                             {{"rank", slow["rank"]},
                              {"step_s", slow["time"]["step_s"]},
                              {"compute_s", slow["time"]["compute_s"]},
                              {"optimizer_s", slow["time"]["optimizer_s"]},
                              {"copy_s", slow["time"]["copy_s"]},
                              {"step_cpu_s", slow["time"]["step_cpu_s"]},
                              {"compute_cpu_s", slow["time"]["compute_cpu_s"]},
                              {"collectives_s", slow["time"]["collectives_total_s"]},
                              {"collectives_by_kind_s", slow["time"]["collectives_s"]},
                              {"forward_s", slow["time"]["forward_s"]},
                              {"backward_s", slow["time"]["backward_s"]},
                              {"comm_wait_s", slow["time"]["comm_wait_s"]},
                              {"comm_wait_by_stream_s", slow["time"]["comm_wait_by_stream_s"]},
                              {"collectives_overlap", env.collectives_overlap()},
                              {"model_flops_per_step", flops},
                              {"collective_time_excluded", env.rehearsal}}},
                            {"comm_bytes_per_step", bytes_sent / steps}};
  // Achieved FLOP/s, and the MFU where the device's peak is known (absent otherwise).
  auto& time = summary["time"];
  if (step_s > 0) {
    time["achieved_TFLOPs"] = flops / step_s / 1e12;
    if (env.peak_flops > 0) {
      time["peak_TFLOPs"] = env.peak_flops / 1e12;
      time["mfu"] = flops / step_s / env.peak_flops;
    }
  }
  if (!env.device.empty()) summary["memory"]["device"] = peak["memory"]["device"];
  return summary;
}

}  // namespace

nlohmann::json run_document(const RunSetup& setup, const ShardingEngine& engine,
                            const std::vector<RankRecord>& ranks, const RunEnvironment& env) {
  if (ranks.empty()) throw std::invalid_argument("no rank records");
  const auto& eo = engine.options();
  const bool on_device = !env.device.empty();
  nlohmann::json doc;
  doc["schema_version"] = 1;
  doc["generator"] = core::generator();
  doc["kind"] = "shardplan.run";
  add_plan(doc, setup.plan);
  doc["environment"] = environment_json(setup, env);
  doc["model"] = {{"name", eo.model.name},
                  {"params", eo.model.total_params()},
                  {"scaled", setup.scaled},
                  {"units", engine.layout().unit_count()},
                  {"config", eo.model.hf_config}};
  // Tensor parallelism: the engine's model is one rank's slice (tensor_parallel.hpp); the whole
  // model's parameters, and the slice's.
  if (const auto& tp = eo.model_options.tensor_parallel; tp.full != nullptr) {
    doc["model"]["params"] = tp.full->spec().total_params();
    doc["model"]["tensor_parallel"] = {{"size", tp.size()},
                                       {"sequence_parallel", tp.sequence_parallel},
                                       {"local_params", eo.model.total_params()}};
  }
  if (const auto& cp = eo.model_options.context_parallel; cp.active())
    doc["model"]["context_parallel"] = {{"size", cp.size()},
                                        {"sequence_share", eo.micro_batch.seq}};
  doc["execution"] = execution_json(setup, engine, ranks.front().steps.size(), on_device);

  nlohmann::json loss = nlohmann::json::array();
  for (const auto& s : ranks.front().steps) loss.push_back(s.loss);
  doc["loss"] = loss;

  nlohmann::json per_rank = nlohmann::json::array();
  std::size_t peak_rank = 0, slow_rank = 0;
  std::vector<double> step_medians;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto& r = ranks[i];
    if (peak_of(r, on_device) > peak_of(ranks[peak_rank], on_device)) peak_rank = i;
    step_medians.push_back(steady_median(r.steps, &StepReport::step_s));
    if (step_medians.back() > step_medians[slow_rank]) slow_rank = i;
    per_rank.push_back(rank_json(r, step_medians.back(), on_device));
  }
  doc["ranks"] = per_rank;
  doc["summary"] =
      summary_json(per_rank[peak_rank], per_rank[slow_rank], ranks[slow_rank], eo, env);
  return doc;
}

}  // namespace shardplan::executor
