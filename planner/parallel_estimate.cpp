#include "planner/parallel_estimate.hpp"

#include <limits>

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "core/number_text.hpp"
#include "planner/estimate.hpp"

namespace shardplan::planner {

using core::InputError;

void add_parallel_options(CLI::App& app, ParallelOptions& o) {
  app.add_option("--tensor-parallel", o.tensor_parallel,
                 "tensor-parallel size t (inside a node; default 1)");
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "split norms and dropouts over the sequence (t > 1)");
  app.add_flag("--async-tensor-parallel", o.async_tensor_parallel,
               "overlap TP's collectives with the GEMMs");
  app.add_option("--pipeline-parallel", o.pipeline_parallel, "pipeline stages p (default 1)");
  app.add_option("--schedule", o.schedule, "1f1b | interleaved-1f1b | gpipe (default 1f1b)");
  app.add_option("--virtual-stages", o.virtual_stages, "model chunks per stage (interleaved-1f1b)");
  app.add_option("--micro-batches", o.micro_batches, "micro-batches per step through the pipeline");
  app.add_option("--context-parallel", o.context_parallel,
                 "context-parallel size c (ring attention)");
  app.add_option("--cp-rotate-method", o.cp_rotate_method,
                 "allgather | alltoall: how torch's ring attention passes the keys and values "
                 "(torchtitan's context_parallel_rotate_method; default allgather)");
  app.add_option("--first-stage-less-layers", o.first_stage_less_layers,
                 "blocks the first pipeline stage gives up for the embeddings (torchtitan's "
                 "default 1, the others' 0)");
  app.add_option("--last-stage-less-layers", o.last_stage_less_layers,
                 "blocks the last pipeline stage gives up for the head (torchtitan's default 1, "
                 "the others' 0)");
}

bool ParallelOptions::one_dimensional() const {
  if (schedule || virtual_stages || micro_batches || sequence_parallel || async_tensor_parallel ||
      first_stage_less_layers || last_stage_less_layers || cp_rotate_method)
    return false;
  for (const auto* v : {&tensor_parallel, &pipeline_parallel, &context_parallel}) {
    if (!*v) continue;
    try {
      if (core::int_from_text("degree", **v) != 1) return false;
    } catch (const InputError&) {
      return false;  // the layout's parser names the flag
    }
  }
  return true;
}

namespace {

// A whole-number flag: `fallback` when not given, refused below `least`.
int degree(const std::optional<std::string>& text, const char* flag, int fallback = 1,
           int least = 1) {
  if (!text) return fallback;
  return core::bounded_int_from_text(flag, *text, least, std::numeric_limits<int>::max());
}

// The micro-batch and the micro-batches from the global batch over d replicas.
void set_micro_batches(const ParallelOptions& o, Scenario& sc, documents::ParallelLayout& l,
                       int d) {
  auto& j = sc.job;
  if (j.global_batch % d != 0)
    throw InputError("--global-batch",
                     fmt::format("{} sequences do not divide over {} data-parallel replicas "
                                 "({} GPUs / {} model-parallel)",
                                 j.global_batch, d, sc.cluster.gpus, l.model_parallel()));
  const std::int64_t per_replica = j.global_batch / d;
  if (o.micro_batches && j.micro_batch == 0) {
    if (per_replica % l.micro_batches != 0)
      throw InputError("--micro-batches",
                       fmt::format("{} does not divide the {} sequences per replica",
                                   l.micro_batches, per_replica));
    j.micro_batch = per_replica / l.micro_batches;
    return;
  }
  if (j.micro_batch == 0) j.micro_batch = 1;
  if (!o.micro_batches) {
    if (per_replica % j.micro_batch != 0)
      throw InputError("--micro-batch",
                       fmt::format("{} does not divide the {} sequences per replica", j.micro_batch,
                                   per_replica));
    l.micro_batches = static_cast<int>(per_replica / j.micro_batch);
  }
}

// "--tensor-parallel 16 --pipeline-parallel 4": the flags the reasons are about.
std::string flags_given(const ParallelOptions& o) {
  std::string s;
  auto add = [&](const char* flag, const std::optional<std::string>& v) {
    if (v) s += fmt::format("{}{} {}", s.empty() ? "" : " ", flag, *v);
  };
  add("--tensor-parallel", o.tensor_parallel);
  add("--pipeline-parallel", o.pipeline_parallel);
  add("--schedule", o.schedule);
  add("--virtual-stages", o.virtual_stages);
  add("--micro-batches", o.micro_batches);
  add("--context-parallel", o.context_parallel);
  add("--first-stage-less-layers", o.first_stage_less_layers);
  add("--last-stage-less-layers", o.last_stage_less_layers);
  add("--cp-rotate-method", o.cp_rotate_method);
  if (o.sequence_parallel) s += s.empty() ? "--sequence-parallel" : " --sequence-parallel";
  if (o.async_tensor_parallel)
    s += s.empty() ? "--async-tensor-parallel" : " --async-tensor-parallel";
  return s;
}

}  // namespace

documents::ParallelLayout layout_from_options(const ParallelOptions& o, Scenario& sc) {
  documents::ParallelLayout l;
  l.tensor_parallel = degree(o.tensor_parallel, "--tensor-parallel");
  l.pipeline_parallel = degree(o.pipeline_parallel, "--pipeline-parallel");
  l.virtual_stages = degree(o.virtual_stages, "--virtual-stages");
  l.micro_batches = degree(o.micro_batches, "--micro-batches");
  l.context_parallel = degree(o.context_parallel, "--context-parallel");
  l.sequence_parallel = o.sequence_parallel;
  l.async_tensor_parallel = o.async_tensor_parallel;
  documents::apply_recipe_split(l, sc.job.recipe);  // the recipe's split unless the flags say
  l.first_stage_less_layers =
      degree(o.first_stage_less_layers, "--first-stage-less-layers", l.first_stage_less_layers, 0);
  l.last_stage_less_layers =
      degree(o.last_stage_less_layers, "--last-stage-less-layers", l.last_stage_less_layers, 0);
  if (o.schedule) l.schedule = documents::schedule_from_name(*o.schedule, "--schedule");
  if (o.cp_rotate_method)
    l.cp_rotate = documents::cp_rotate_from_name(*o.cp_rotate_method, "--cp-rotate-method");
  const int d = l.data_parallel(sc.cluster.gpus);
  if (d == 0)
    throw InputError(
        "--gpus",
        fmt::format("{} GPUs are not a multiple of tensor {} x pipeline {} x context {} = {}",
                    sc.cluster.gpus, l.tensor_parallel, l.pipeline_parallel, l.context_parallel,
                    l.model_parallel()));
  set_micro_batches(o, sc, l, d);
  const auto problems = documents::layout_problems(l, sc.model, sc.job, sc.cluster);
  if (!problems.empty())
    throw InputError(flags_given(o), fmt::format("{}", fmt::join(problems, "; ")));
  return l;
}

}  // namespace shardplan::planner
