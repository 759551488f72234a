#include "costmodel/parallel_step.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "costmodel/compute_time.hpp"
#include "costmodel/pipeline_walk.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "documents/recipe.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"
#include "documents/workload.hpp"

namespace shardplan::costmodel {

using documents::Category;
using documents::Collective;
using documents::dtype_bytes;
using documents::layout_problems;
using documents::ModelSpec;
using documents::Offload;
using documents::ParallelLayout;
using documents::stage_blocks;
using documents::state_bytes;
using documents::StateBytes;
using documents::TrainingJob;

// Tied word embeddings under a pipeline: the first stage's table and the last stage's copy (the
// head) each collect a gradient, which Megatron-core sums over the embedding group (the first and
// last stages' ranks at the same data, context and tensor position) after the data-parallel
// reduction and before the optimizer step (megatron/core/distributed/finalize_model_grads.py,
// finalize_model_grads then _allreduce_word_embedding_grads): an all-reduce of 2 ranks over the
// v·h/t elements of the vocabulary-split table, in the gradients' reduce dtype; nothing runs beside
// it. Empty when the model does not tie them or there is one stage.
CollectiveCost tied_embedding_allreduce(const StepInput& in, const ParallelLayout& l) {
  const auto& m = *in.model;
  if (!m.tied_embeddings || l.pipeline_parallel < 2) return {};
  const StateBytes sb = state_bytes(in.job.precision, in.spec, Accounting::framework);
  const double reduce_b = std::max(dtype_bytes(in.spec.reduce_dtype), sb.compute);
  const double elements =
      static_cast<double>(m.vocab) * static_cast<double>(m.hidden) / l.tensor_parallel;
  // The two ranks are (p − 1)·t·c·d apart in the mesh order (parallel_layout.hpp).
  const std::int64_t apart = static_cast<std::int64_t>(l.pipeline_parallel - 1) *
                             l.tensor_parallel * l.context_parallel *
                             std::max(1, l.data_parallel(in.cluster.gpus));
  const Group pair{2, apart >= in.cluster.gpus_per_node ? 1 : 2};
  return CommModel(*in.hardware).cost(Collective::all_reduce, pair, elements * reduce_b);
}

double p2p_bytes(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l, double e) {
  const double split = l.sequence_parallel ? l.tensor_parallel : 1;
  return e * static_cast<double>(j.seq_len) / l.context_parallel *
         static_cast<double>(j.micro_batch) * static_cast<double>(m.hidden) / split;
}

namespace {

// The job as one rank of the layout runs it: its share of the ring and of the TP group.
StepInput rank_input(const StepInput& in, const ParallelLayout& l) {
  StepInput rank = in;
  rank.context_parallel = l.context_parallel;
  rank.tensor_parallel = l.tensor_parallel;
  rank.sequence_parallel = l.sequence_parallel;
  rank.async_tensor_parallel = l.async_tensor_parallel;
  rank.cp_rotate = l.cp_rotate;
  return rank;
}

// A walked stage's memory at its peak.
StageMemory stage_memory(const StepResult& r, int stage, double blocks, double in_flight) {
  StageMemory st;
  st.stage = stage;
  st.blocks = blocks;
  st.in_flight = in_flight;
  st.param_bytes = r.at_peak[static_cast<int>(Category::parameters)];
  st.grad_bytes = r.at_peak[static_cast<int>(Category::gradients)];
  st.optimizer_bytes = r.at_peak[static_cast<int>(Category::optimizer_states)];
  st.activation_bytes = r.at_peak[static_cast<int>(Category::activations)];
  st.buffer_bytes = r.at_peak[static_cast<int>(Category::buffers)];
  st.overhead_bytes = r.at_peak[static_cast<int>(Category::overhead)];
  st.moment = r.peak_when;
  st.local_params = r.rank_params;
  return st;
}

// The exposed time and the bytes of a walked stage's rank, by dimension.
void stage_comm(const StepResult& r, ParallelStep& out) {
  out.cp_exposed_s = r.exposed_s[static_cast<int>(Stream::context)];
  out.tp_exposed_s = r.exposed_s[static_cast<int>(Stream::tensor)];
  out.dp_exposed_s = std::max(0.0, r.exposed_comm_s - out.cp_exposed_s - out.tp_exposed_s);
  out.dp_comm_s = 0;  // the data-parallel collectives' streams (not the ring's, not the host's)
  for (const Stream s : {Stream::all_gather, Stream::reduce_scatter, Stream::all_reduce})
    out.dp_comm_s += r.busy_s[static_cast<int>(s)];
  out.cp_bytes = r.context_bytes_per_gpu;
  out.tp_bytes = r.tensor_bytes_per_gpu;
  out.dp_bytes = r.comm_bytes_per_gpu - r.context_bytes_per_gpu - r.tensor_bytes_per_gpu;
}

// One stage walked by the step simulator (one rank of the ring and of the TP group), its report as
// the one stage of the layout.
ParallelStep walk_one_stage(const StepInput& in, const ParallelLayout& l) {
  ParallelStep out;
  auto& r = out.step = simulate_step(rank_input(in, l));
  if (!r.valid) return out;
  StageMemory st = stage_memory(r, 0, static_cast<double>(in.model->layers), 1);
  st.moment.clear();  // the summary names it
  out.memory.stages = {st};
  out.memory.peak_bytes = r.peak_bytes;
  out.memory.peak_name = r.peak_when;
  out.stage_forward_s = {r.forward_per_mb_s};
  out.stage_backward_s = {r.backward_per_mb_s};
  out.compute_per_mb_s = r.forward_per_mb_s + r.backward_per_mb_s;
  stage_comm(r, out);
  return out;
}

// Every stage walked (pipeline_walk.hpp); the step is the stage that ends last.
ParallelStep walk_stages(const StepInput& in, const ParallelLayout& l) {
  ParallelStep out;
  const PipelineStages w = walk_pipeline(rank_input(in, l), l);
  auto& r = out.step;
  if (!w.valid) {
    r = w.stages.empty() ? StepResult{} : w.stages.back();
    r.valid = false;
    r.reason = w.reason;
    r.reason_input = w.reason_input;
    return out;
  }
  const int p = l.pipeline_parallel;
  out.walk = w.walk;
  out.p2p_s = w.p2p_s;
  out.embedding_allreduce_s = w.embedding_allreduce_s;
  out.embedding_bytes = w.embedding_bytes;
  double model_flops = 0;
  for (int s = 0; s < p; ++s) {
    const StepResult& sr = w.stages[static_cast<std::size_t>(s)];
    StageMemory st = stage_memory(sr, s, static_cast<double>(stage_blocks(l, in.model->layers, s)),
                                  w.walk.peak_in_flight[static_cast<std::size_t>(s)]);
    if (sr.peak_bytes > out.memory.peak_bytes) {
      out.memory.peak_bytes = sr.peak_bytes;
      out.memory.peak_stage = s;
      out.memory.peak_name = fmt::format(
          "stage {} of {} ({}{:g} blocks{}, {:g} micro-batches in flight), peak at the {}", s, p,
          s == 0 ? "embeddings, " : "", st.blocks, s == p - 1 ? ", head and loss" : "",
          st.in_flight, sr.peak_when);
      r = sr;
    }
    if (s == 0 || sr.step_s > w.stages[static_cast<std::size_t>(out.step_stage)].step_s)
      out.step_stage = s;
    out.memory.stages.push_back(st);
    out.stage_forward_s.push_back(sr.forward_per_mb_s);
    out.stage_backward_s.push_back(sr.backward_per_mb_s);
    model_flops += sr.model_flops;
  }
  // The step's time is the stage that ends last's; its memory the peak stage's.
  const StepResult& last = w.stages[static_cast<std::size_t>(out.step_stage)];
  const StepResult peak = r;
  r = last;
  r.peak_bytes = peak.peak_bytes;
  r.allocated_peak_bytes = peak.allocated_peak_bytes;
  r.reserve_bytes = peak.reserve_bytes;
  r.at_peak = peak.at_peak;
  r.model_states = peak.model_states;
  r.head_activations_at_peak = peak.head_activations_at_peak;
  r.peak_when = out.memory.peak_name;
  r.model_flops = model_flops;
  r.mfu = model_flops / (r.step_s * in.cluster.gpus *
                         in.hardware->peak(documents::compute_dtype(in.job.precision)));
  out.compute_per_mb_s = last.forward_per_mb_s + last.backward_per_mb_s;
  out.bubble_s = last.bubble_s;
  stage_comm(last, out);
  out.pp_bytes = w.p2p_bytes * l.micro_batches;  // stage 0's activations sent
  r.comm_bytes_per_gpu += out.pp_bytes;
  return out;
}

}  // namespace

double parallel_step_bound(const StepInput& in, const ParallelLayout& l) {
  if (l.pipeline_parallel < 2 || in.spec.offload != Offload::none || in.job.micro_batch <= 0 ||
      !layout_problems(l, *in.model, in.job, in.cluster).empty())
    return 0;
  return pipeline_step_bound(rank_input(in, l), l);
}

ParallelStep simulate_parallel_step(const StepInput& in, const ParallelLayout& l) {
  if (l.trivial()) {
    ParallelStep out;
    out.step = simulate_step(in);
    return out;
  }
  auto problems = layout_problems(l, *in.model, in.job, in.cluster);
  if (in.job.micro_batch <= 0) problems.emplace_back("the micro-batch must be set");
  // The walk does not offload a tensor- or pipeline-parallel rank's states.
  if (in.spec.offload != Offload::none && (l.tensor_parallel > 1 || l.pipeline_parallel > 1))
    problems.emplace_back("offload is not modeled with tensor or pipeline parallelism");
  // DeepSpeed's PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
  // parallelism" (deepspeed/runtime/pipe/engine.py, 0.19.8; measured by
  // validation/measure_deepspeed_pipeline.py, its "refused" probes).
  // Under --recipe deepspeed that engine runs the pipeline, so no other engine's sharding either
  // (ZeRO 0 is walked as DDP: planner/deepspeed_import.cpp).
  const auto flavour = in.spec.flavour;
  if (l.pipeline_parallel > 1 &&
      ((flavour == documents::Flavour::deepspeed && in.spec.shard_gradients) ||
       (documents::recipe_traits(in.job.recipe).pipeline == documents::PipelineRunner::deepspeed &&
        flavour != documents::Flavour::deepspeed && flavour != documents::Flavour::ddp)))
    problems.emplace_back(
        fmt::format("DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only, not {} ({})",
                    in.spec.strategy, documents::flavour_name(flavour)));
  if (!problems.empty()) {
    ParallelStep out;
    auto& r = out.step;
    r.params = in.model->total_params();
    r.micro_batch = in.job.micro_batch;
    r.capacity_bytes = in.hardware->memory_bytes;
    r.valid = false;
    r.reason = fmt::format("{}", fmt::join(problems, "; "));
    return out;
  }
  return l.pipeline_parallel == 1 ? walk_one_stage(in, l) : walk_stages(in, l);
}

}  // namespace shardplan::costmodel
