#include "documents/parallel.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "documents/recipe.hpp"

namespace shardplan::documents {

using core::InputError;
using core::ObjectReader;
using core::Range;

namespace {

constexpr int kMaxDegree = 1'000'000;

// Problems of the degrees among themselves and against the cluster.
void degree_problems(const ParallelLayout& l, const Cluster& c, std::vector<std::string>& out) {
  const int t = l.tensor_parallel, p = l.pipeline_parallel, cp = l.context_parallel;
  if (t < 1 || p < 1 || cp < 1 || l.virtual_stages < 1 || l.micro_batches < 1) {
    out.push_back(
        fmt::format("degrees must be >= 1, got tensor {} pipeline {} context {} virtual stages {} "
                    "micro-batches {}",
                    t, p, cp, l.virtual_stages, l.micro_batches));
    return;
  }
  if (c.gpus_per_node > 0 && t > c.gpus_per_node)
    out.push_back(fmt::format(
        "tensor parallel {} is larger than a node of {} GPUs: its all-reduces per layer "
        "would cross the inter-node links",
        t, c.gpus_per_node));
  if (c.gpus_per_node > 0 && t <= c.gpus_per_node && c.gpus_per_node % t != 0)
    out.push_back(
        fmt::format("tensor parallel {} does not divide a node of {} GPUs", t, c.gpus_per_node));
  if (c.gpus % l.model_parallel() != 0)
    out.push_back(
        fmt::format("{} GPUs are not a multiple of tensor {} x pipeline {} x context {} = {}",
                    c.gpus, t, p, cp, l.model_parallel()));
  if (l.sequence_parallel && t == 1)
    out.push_back("sequence parallelism splits the tensor-parallel group's norms and dropouts: it "
                  "needs tensor "
                  "parallel > 1");
  if (l.async_tensor_parallel && t == 1)
    out.push_back("async tensor parallelism needs tensor parallel > 1");
  if (l.schedule == PipelineSchedule::interleaved_1f1b) {
    // Megatron-LM (megatron/core/pipeline_parallel/schedules.py,
    // forward_backward_pipelining_with_interleaving): micro-batches must be a multiple of the
    // pipeline size, and the schedule needs more than one stage and one chunk.
    if (p < 2)
      out.push_back(
          fmt::format("the interleaved schedule needs pipeline parallel >= 2, got {}", p));
    if (l.virtual_stages < 2)
      out.push_back(fmt::format("the interleaved schedule needs virtual stages >= 2, got {}",
                                l.virtual_stages));
    if (l.micro_batches % p != 0)
      out.push_back(fmt::format(
          "the interleaved schedule needs micro-batches ({}) to be a multiple of pipeline "
          "parallel ({})",
          l.micro_batches, p));
  } else if (l.virtual_stages != 1) {
    out.push_back(fmt::format("virtual stages {} need the interleaved-1f1b schedule, not {}",
                              l.virtual_stages, schedule_name(l.schedule)));
  }
}

std::string schedule_list(const std::vector<PipelineSchedule>& schedules) {
  std::vector<std::string> names;
  names.reserve(schedules.size());
  for (auto s : schedules) names.emplace_back(schedule_name(s));
  return fmt::format("{}", fmt::join(names, ", "));
}

// Problems of the blocks' split over the model parts.
void split_problems(const ParallelLayout& l, const ModelSpec& m, const TrainingJob& j,
                    std::vector<std::string>& out) {
  const std::int64_t parts = static_cast<std::int64_t>(l.pipeline_parallel) * l.virtual_stages;
  const int f = l.first_stage_less_layers, e = l.last_stage_less_layers;
  if (f < 0 || e < 0) {
    out.push_back(
        fmt::format("first and last stage less layers must be >= 0, got {} and {}", f, e));
    return;
  }
  if (l.pipeline_parallel == 1 && (f > 0 || e > 0)) {
    out.push_back(fmt::format("first and last stage less layers ({} and {}) need pipeline "
                              "parallel > 1",
                              f, e));
    return;
  }
  const std::int64_t effective = m.layers + f + e;
  const std::int64_t base = effective / parts;
  if (base == 0 || f > base || e > base) {
    out.push_back(fmt::format("{} layers (+ {} for the embeddings, + {} for the head) leave a "
                              "model part of pipeline {} x virtual stages {} = {} without blocks",
                              m.layers, f, e, l.pipeline_parallel, l.virtual_stages, parts));
    return;
  }
  // Megatron-LM splits evenly: --num-layers (with --account-for-embedding/loss-in-pipeline-split
  // one more each) must divide over the parts (megatron/core/transformer/transformer_block.py,
  // get_num_layers_to_build).
  if (recipe_traits(j.recipe).pipeline_even_split && effective % parts != 0)
    out.push_back(fmt::format(
        "Megatron-LM splits {} layers{} evenly over pipeline {} x virtual stages {} = {}: they do "
        "not divide",
        m.layers,
        f + e > 0 ? fmt::format(" (+ {} for the embeddings, + {} for the loss)", f, e) : "",
        l.pipeline_parallel, l.virtual_stages, parts));
}

// The dimensions the recipe's trainer does not run (RecipeTraits::offers_*, an empty schedules),
// each refusal naming the recipes whose trainers do; and a mixture of experts' (data parallelism
// only).
void dimension_problems(const ParallelLayout& l, const RecipeTraits& r, const ModelSpec& m,
                        std::vector<std::string>& out) {
  // transformers' tp_plan splits the experts by its own ep_plan, and expert parallelism is not
  // planned yet: a mixture of experts runs data-parallel only.
  if (m.moe.experts > 0 && !l.trivial())
    out.push_back("a mixture of experts under tensor, pipeline or context parallelism is not "
                  "planned yet (nor expert parallelism): plan it data-parallel");
  using Offers = bool (*)(const RecipeTraits&);
  const auto refuse = [&](const char* what, int degree, Offers offers) {
    std::vector<std::string> others;
    for (int i = 0; i < kRecipes; ++i)
      if (const RecipeTraits& o = recipe_traits(static_cast<Recipe>(i)); offers(o))
        others.emplace_back(o.name);
    out.push_back(fmt::format("the {} recipe's trainer runs no {} (asked for {}); the recipes "
                              "that do: {}",
                              r.name, what, degree, fmt::join(others, ", ")));
  };
  if (l.tensor_parallel > 1 && !r.offers_tensor_parallel)
    refuse("tensor parallelism", l.tensor_parallel,
           [](const RecipeTraits& o) { return o.offers_tensor_parallel; });
  else if (l.tensor_parallel > 1 && l.sequence_parallel && !r.offers_sequence_parallel)
    refuse("sequence parallelism", l.tensor_parallel,
           [](const RecipeTraits& o) { return o.offers_sequence_parallel; });
  if (l.pipeline_parallel > 1 && r.schedules.empty())
    refuse("pipeline", l.pipeline_parallel,
           [](const RecipeTraits& o) { return !o.schedules.empty(); });
  if (l.context_parallel > 1 && !r.offers_context_parallel)
    refuse("context parallelism", l.context_parallel,
           [](const RecipeTraits& o) { return o.offers_context_parallel; });
}

// Problems of the degrees against the model's shapes and the job.
void shape_problems(const ParallelLayout& l, const ModelSpec& m, const TrainingJob& j,
                    const Cluster& c, std::vector<std::string>& out) {
  const int t = l.tensor_parallel, p = l.pipeline_parallel, cp = l.context_parallel;
  if (m.heads % t != 0)
    out.push_back(
        fmt::format("{} attention heads do not divide over tensor parallel {}", m.heads, t));
  if (m.kv_heads % t != 0)
    out.push_back(
        fmt::format("{} key/value heads do not divide over tensor parallel {}", m.kv_heads, t));
  if (m.intermediate % t != 0)
    out.push_back(
        fmt::format("MLP width {} does not divide over tensor parallel {}", m.intermediate, t));
  split_problems(l, m, j, out);
  // Load-balanced causal context parallelism (Megatron-core / Transformer Engine's
  // get_batch_on_this_cp_rank): the sequence is cut into 2·c chunks, rank r taking chunks r and
  // 2c−1−r so that every rank sees the same share of the causal mask.
  if (cp > 1 && j.seq_len % (2 * static_cast<std::int64_t>(cp)) != 0)
    out.push_back(
        fmt::format("sequence {} does not divide into 2 x context parallel {} = {} chunks",
                    j.seq_len, cp, 2 * cp));
  if (l.cp_rotate != CpRotate::all_gather && cp == 1)
    out.push_back("a rotate method needs context parallelism");
  if (l.cp_rotate != CpRotate::all_gather &&
      recipe_traits(j.recipe).ring != RingCode::torch_all_gather)
    out.push_back(fmt::format("the {} recipe's ring passes the keys and values hop by hop: it has "
                              "no rotate method",
                              recipe_name(j.recipe)));
  if (cp > 1 && j.attention != AttentionImpl::flash)
    out.push_back("context parallelism runs ring attention on fused (flash) kernels; eager "
                  "attention materializes "
                  "the scores");
  // Sequence parallelism splits the local sequence over the TP ranks (Megatron asserts
  // seq_length % tensor_model_parallel_size == 0 with --sequence-parallel).
  if (l.sequence_parallel && t > 1 && (j.seq_len / std::max(cp, 1)) % t != 0)
    out.push_back(fmt::format(
        "sequence {} per context rank does not divide over tensor parallel {} for sequence "
        "parallelism",
        j.seq_len / std::max(cp, 1), t));
  // torchtitan's op-level save list: context parallelism alone is walked op by op, as the
  // data-parallel step; a block of PyTorch's own model code (hf, torchtitan) keeps its list per
  // block under a pipeline and on its local tensors under tensor parallelism (measured:
  // tests/costmodel/data/oracle_tp_units.json). Other recipes' blocks are not torchtitan's.
  const RecipeTraits& r = recipe_traits(j.recipe);
  dimension_problems(l, r, m, out);
  if (p > 1 && !r.schedules.empty() &&
      std::find(r.schedules.begin(), r.schedules.end(), l.schedule) == r.schedules.end())
    out.push_back(fmt::format("the {} recipe's pipeline has no {} schedule (it has {})",
                              recipe_name(j.recipe), schedule_name(l.schedule),
                              schedule_list(r.schedules)));
  const bool pytorch_blocks = r.tensor_parallel == TensorParallelCode::torch_styles;
  if (j.checkpointing == Checkpointing::selective_op &&
      (((p > 1 || t > 1) && !pytorch_blocks) || (cp > 1 && !r.framework)))
    out.push_back(fmt::format("op-level selective checkpointing is torchtitan's, not the {} "
                              "recipe's, under tensor, pipeline or context parallelism",
                              recipe_name(j.recipe)));
  // A compiled block is measured on one rank (tests/costmodel/data/oracle_compile_units.json) and
  // under torchtitan's tensor parallelism (oracle_tp_units.json); under context parallelism its
  // partition runs on a ring, not measured.
  if (j.compile && cp > 1)
    out.push_back("--compile: what a compiled block keeps under context parallelism is not "
                  "measured (one rank's block is, and torchtitan's under tensor parallelism)");
  // Async TP splits the sequence-parallel all-gathers and reduce-scatters (torch's micro-pipeline
  // pass matches all_gather -> mm and mm -> reduce_scatter; Megatron-LM's arguments.py asserts
  // --sequence-parallel under --tp-comm-overlap), in the frameworks that have it.
  if (l.async_tensor_parallel && t > 1 && !l.sequence_parallel)
    out.push_back("async tensor parallelism overlaps sequence parallelism's all-gathers and "
                  "reduce-scatters: it needs --sequence-parallel");
  if (l.async_tensor_parallel && r.async_tp == AsyncTp::none)
    out.push_back(
        fmt::format("the {} recipe's tensor parallelism has no async mode", recipe_name(j.recipe)));
  const int d = l.data_parallel(c.gpus);
  if (d > 0 && j.micro_batch > 0) {
    const std::int64_t per_step = static_cast<std::int64_t>(d) * l.micro_batches * j.micro_batch;
    if (per_step != j.global_batch)
      out.push_back(fmt::format(
          "data parallel {} x micro-batches {} x micro-batch {} = {} sequences, not the "
          "global batch {}",
          d, l.micro_batches, j.micro_batch, per_step, j.global_batch));
  }
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> n = {"1f1b", "interleaved-1f1b", "gpipe"};
  return n;
}
const char* schedule_name(PipelineSchedule s) {
  return schedule_names()[static_cast<std::size_t>(s)].c_str();
}
PipelineSchedule schedule_from_name(const std::string& s, const std::string& where) {
  const auto& n = schedule_names();
  for (std::size_t i = 0; i < n.size(); ++i)
    if (n[i] == s) return static_cast<PipelineSchedule>(i);
  throw InputError(where, fmt::format("must be one of {}, got \"{}\"", fmt::join(n, ", "), s));
}

const char* cp_rotate_name(CpRotate r) {
  return r == CpRotate::all_to_all ? "alltoall" : "allgather";
}

CpRotate cp_rotate_from_name(const std::string& s, const std::string& where) {
  if (s == "allgather") return CpRotate::all_gather;
  if (s == "alltoall") return CpRotate::all_to_all;
  throw InputError(where, fmt::format("must be one of allgather, alltoall, got \"{}\"", s));
}

std::vector<std::int64_t> pipeline_parts(const ParallelLayout& l, std::int64_t layers) {
  const std::int64_t parts = static_cast<std::int64_t>(l.pipeline_parallel) * l.virtual_stages;
  const std::int64_t effective = layers + l.first_stage_less_layers + l.last_stage_less_layers;
  std::vector<std::int64_t> out(static_cast<std::size_t>(parts), effective / parts);
  for (std::int64_t k = 0; k < effective % parts; ++k) ++out[static_cast<std::size_t>(k)];
  out.front() -= l.first_stage_less_layers;
  out.back() -= l.last_stage_less_layers;
  return out;
}

void apply_recipe_split(ParallelLayout& l, Recipe r) {
  const int less = l.pipeline_parallel > 1 ? recipe_traits(r).pipeline_less_layers : 0;
  l.first_stage_less_layers = less;
  l.last_stage_less_layers = less;
}

std::int64_t stage_blocks(const ParallelLayout& l, std::int64_t layers, int s) {
  const auto parts = pipeline_parts(l, layers);
  std::int64_t n = 0;
  for (std::size_t k = static_cast<std::size_t>(s); k < parts.size();
       k += static_cast<std::size_t>(l.pipeline_parallel))
    n += parts[k];
  return n;
}

std::int64_t stage_first_block(const ParallelLayout& l, std::int64_t layers, int s) {
  const auto parts = pipeline_parts(l, layers);
  std::int64_t n = 0;
  for (std::size_t k = 0; k < static_cast<std::size_t>(s); ++k) n += parts[k];
  return n;
}

std::vector<std::string> layout_problems(const ParallelLayout& l, const ModelSpec& m,
                                         const TrainingJob& j, const Cluster& c) {
  std::vector<std::string> out;
  degree_problems(l, c, out);
  const bool degrees = l.tensor_parallel >= 1 && l.pipeline_parallel >= 1 &&
                       l.context_parallel >= 1 && l.virtual_stages >= 1 && l.micro_batches >= 1;
  if (degrees) shape_problems(l, m, j, c, out);  // they divide by the degrees
  return out;
}

ParallelLayout layout_from_json(const nlohmann::json& doc, const std::string& pointer) {
  ObjectReader r(doc, pointer);
  const Range degree{1, kMaxDegree, false};
  ParallelLayout l;
  auto read_int = [&](const char* key, int fallback) {
    return static_cast<int>(r.optional_integer(key, degree).value_or(fallback));
  };
  l.tensor_parallel = read_int("tensor_parallel", 1);
  l.sequence_parallel = r.optional_boolean("sequence_parallel").value_or(false);
  l.async_tensor_parallel = r.optional_boolean("async_tensor_parallel").value_or(false);
  l.pipeline_parallel = read_int("pipeline_parallel", 1);
  if (auto s = r.optional_string("schedule"))
    l.schedule = schedule_from_name(*s, r.pointer_of("schedule"));
  l.virtual_stages = read_int("virtual_stages", 1);
  l.micro_batches = read_int("micro_batches", 1);
  l.context_parallel = read_int("context_parallel", 1);
  if (auto m = r.optional_string("cp_rotate_method"))
    l.cp_rotate = cp_rotate_from_name(*m, r.pointer_of("cp_rotate_method"));
  const Range less{0, kMaxDegree, false};
  l.first_stage_less_layers =
      static_cast<int>(r.optional_integer("first_stage_less_layers", less).value_or(0));
  l.last_stage_less_layers =
      static_cast<int>(r.optional_integer("last_stage_less_layers", less).value_or(0));
  r.finish();
  // What the document alone can get wrong; the rest depends on the model and cluster
  // (layout_problems).
  if (l.virtual_stages > 1 && l.schedule != PipelineSchedule::interleaved_1f1b)
    throw InputError(
        r.pointer_of("virtual_stages"),
        fmt::format("{} virtual stages need \"schedule\": \"interleaved-1f1b\", got \"{}\"",
                    l.virtual_stages, schedule_name(l.schedule)));
  if (l.sequence_parallel && l.tensor_parallel == 1)
    throw InputError(r.pointer_of("sequence_parallel"), "true needs tensor_parallel > 1, got 1");
  if (l.async_tensor_parallel && l.tensor_parallel == 1)
    throw InputError(r.pointer_of("async_tensor_parallel"),
                     "true needs tensor_parallel > 1, got 1");
  return l;
}

nlohmann::json layout_to_json(const ParallelLayout& l) {
  return {{"tensor_parallel", l.tensor_parallel},
          {"sequence_parallel", l.sequence_parallel},
          {"async_tensor_parallel", l.async_tensor_parallel},
          {"pipeline_parallel", l.pipeline_parallel},
          {"schedule", schedule_name(l.schedule)},
          {"virtual_stages", l.virtual_stages},
          {"micro_batches", l.micro_batches},
          {"context_parallel", l.context_parallel},
          {"cp_rotate_method", cp_rotate_name(l.cp_rotate)},
          {"first_stage_less_layers", l.first_stage_less_layers},
          {"last_stage_less_layers", l.last_stage_less_layers}};
}

}  // namespace shardplan::documents
