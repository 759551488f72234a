#include "documents/plan.hpp"

#include <cmath>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "core/version.hpp"
#include "core/whole_count.hpp"

namespace shardplan::documents {

using core::count_json;
using core::InputError;
using core::ObjectReader;
using core::Range;

nlohmann::json plan_parallel_to_json(const ParallelLayout& l) {
  return {{"tensor", l.tensor_parallel},
          {"sequence_parallel", l.sequence_parallel},
          {"async_tensor_parallel", l.async_tensor_parallel},
          {"pipeline", l.pipeline_parallel},
          {"schedule", schedule_name(l.schedule)},
          {"virtual_stages", l.virtual_stages},
          {"micro_batches", l.micro_batches},
          {"context", l.context_parallel},
          {"cp_rotate_method", cp_rotate_name(l.cp_rotate)}};
}

ParallelLayout plan_parallel_from_json(const nlohmann::json& j, const std::string& pointer) {
  ObjectReader r(j, pointer);
  // A degree is a count of ranks: at most the largest cluster a plan describes (/cluster/gpus).
  const Range degree{1, 1e6, false};
  ParallelLayout l;
  l.tensor_parallel = static_cast<int>(r.integer("tensor", degree));
  l.sequence_parallel = r.boolean("sequence_parallel");
  l.async_tensor_parallel = r.boolean("async_tensor_parallel");
  l.pipeline_parallel = static_cast<int>(r.integer("pipeline", degree));
  l.schedule = schedule_from_name(r.string("schedule"), r.pointer_of("schedule"));
  l.virtual_stages = static_cast<int>(r.integer("virtual_stages", degree));
  l.micro_batches = static_cast<int>(r.integer("micro_batches", degree));
  l.context_parallel = static_cast<int>(r.integer("context", degree));
  if (auto m = r.optional_string("cp_rotate_method"))  // optional: older plans have none
    l.cp_rotate = cp_rotate_from_name(*m, r.pointer_of("cp_rotate_method"));
  r.finish();
  if (l.virtual_stages > 1 && l.schedule != PipelineSchedule::interleaved_1f1b)
    throw InputError(r.pointer_of("virtual_stages"),
                     fmt::format("{} needs \"schedule\": \"interleaved-1f1b\", got \"{}\"",
                                 l.virtual_stages, schedule_name(l.schedule)));
  if (l.schedule == PipelineSchedule::interleaved_1f1b && l.virtual_stages < 2)
    throw InputError(
        r.pointer_of("virtual_stages"),
        fmt::format("the interleaved-1f1b schedule needs >= 2, got {}", l.virtual_stages));
  if (l.sequence_parallel && l.tensor_parallel == 1)
    throw InputError(r.pointer_of("sequence_parallel"), "true needs \"tensor\" > 1, got 1");
  if (l.async_tensor_parallel && l.tensor_parallel == 1)
    throw InputError(r.pointer_of("async_tensor_parallel"), "true needs \"tensor\" > 1, got 1");
  return l;
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json model = {{"name", p.model.name}};
  if (p.model.hf_config.is_null()) {
    model["params"] = p.model.total_params();
    model["layers"] = p.model.layers;
  } else {
    model["config"] = p.model.hf_config;
  }
  nlohmann::json breakdown = nlohmann::json::object();
  for (int c = 0; c < kCategories; ++c)
    breakdown[category_name(static_cast<Category>(c))] = count_json(p.prediction.at_peak[c]);
  nlohmann::json doc = {
      {"schema_version", 1},
      {"generator", core::generator()},
      {"kind", "shardplan.plan"},
      {"model", model},
      {"hardware", p.hardware},
      {"cluster", {{"gpus", p.cluster.gpus}, {"gpus_per_node", p.cluster.gpus_per_node}}},
      {"job", job_to_json(p.job)},
      {"sharding", spec_to_json(p.spec)},
      {"prediction",
       {{"peak_bytes", count_json(p.prediction.peak_bytes)},
        {"breakdown", breakdown},
        {"step_s", p.prediction.step_s},
        {"compute_s", p.prediction.compute_s},
        {"exposed_comm_s", p.prediction.exposed_comm_s},
        {"comm_bytes_per_gpu", p.prediction.comm_bytes_per_gpu},
        {"peak_when", p.prediction.peak_when}}}};
  if (p.gpu_memory_GiB) doc["capacity"] = {{"gpu_memory_GiB", *p.gpu_memory_GiB}};
  if (!p.parallel.trivial()) doc["parallel"] = plan_parallel_to_json(p.parallel);
  return doc;
}

Plan plan_from_json(const nlohmann::json& doc) {
  ObjectReader r(doc, "");
  const auto version = r.integer("schema_version");
  if (version != 1) throw InputError("/schema_version", fmt::format("must be 1, got {}", version));
  r.optional_string("generator");  // the program and version that wrote it
  const auto kind = r.string("kind");
  if (kind != "shardplan.plan")
    throw InputError("/kind", fmt::format("must be \"shardplan.plan\", got \"{}\"", kind));
  Plan p;
  {
    ObjectReader m(r.object("model"), "/model");
    const auto name = m.string("name");
    if (const auto* config = m.optional_object("config")) {
      try {
        p.model = model_from_hf_config(*config, name);
      } catch (const InputError& e) {
        throw InputError("/model/config" + e.where(),
                         std::string(e.what()).substr(e.where().size() + 2));
      }
    } else {
      p.model = model_from_param_count(m.number("params", Range{1e3, 1e15, false}),
                                       m.integer("layers", Range{1, 1e5, false}));
    }
    p.model.name = name;
    m.finish();
  }
  p.hardware = r.string("hardware");
  {
    ObjectReader c(r.object("cluster"), "/cluster");
    p.cluster.gpus = static_cast<int>(c.integer("gpus", Range{1, 1e6, false}));
    p.cluster.gpus_per_node = static_cast<int>(c.integer("gpus_per_node", Range{1, 1024, false}));
    c.finish();
  }
  if (const auto* capacity = r.optional_object("capacity")) {
    ObjectReader c(*capacity, "/capacity");
    // As planner --gpu-memory-GiB takes it: > 0 and at most a million GiB.
    p.gpu_memory_GiB = c.number("gpu_memory_GiB", Range{0, 1e6, true});
    c.finish();
  }
  try {
    p.job = job_from_json(r.object("job"));
  } catch (const InputError& e) {
    throw InputError("/job" + e.where(), std::string(e.what()).substr(e.where().size() + 2));
  }
  if (p.job.micro_batch <= 0) throw InputError("/job/micro_batch", "missing key");
  if (const auto why = moe_unplanned(p.model, p.job); !why.empty())
    throw InputError("/model/config", why);
  p.spec = spec_from_json(r.object("sharding"), "/sharding");
  {
    ObjectReader pr(r.object("prediction"), "/prediction");
    // Byte counts are written back as 64-bit integers (plan_to_json); an exabyte is beyond any
    // device.
    const Range bytes = Range::between(0, 1e18);
    p.prediction.peak_bytes = pr.number("peak_bytes", bytes);
    ObjectReader b(pr.object("breakdown"), "/prediction/breakdown");
    for (int c = 0; c < kCategories; ++c)
      p.prediction.at_peak[c] = b.number(category_name(static_cast<Category>(c)), bytes);
    b.finish();
    p.prediction.step_s = pr.number("step_s", Range::non_negative());
    p.prediction.compute_s = pr.number("compute_s", Range::non_negative());
    p.prediction.exposed_comm_s = pr.number("exposed_comm_s", Range::non_negative());
    p.prediction.comm_bytes_per_gpu = pr.number("comm_bytes_per_gpu", Range::non_negative());
    p.prediction.peak_when = pr.string("peak_when");
    pr.finish();
  }
  const auto* parallel = r.optional_object("parallel");
  if (parallel) p.parallel = plan_parallel_from_json(*parallel, "/parallel");
  r.finish();
  validate_cluster(p.cluster);
  if (!parallel) {
    validate_job(p.job, p.cluster);
    return p;
  }
  // The layout against the model, the job's batch and the cluster (heads and layers divide, the
  // tensor group stays in a node, data x micro-batches x micro-batch = the global batch).
  if (const auto problems = layout_problems(p.parallel, p.model, p.job, p.cluster);
      !problems.empty())
    throw InputError("/parallel", fmt::format("{}", fmt::join(problems, "; ")));
  return p;
}

}  // namespace shardplan::documents
