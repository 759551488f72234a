#include "planner/emit_parallel.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/plan.hpp"
#include "planner/estimate.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;
using namespace core;

namespace {

std::int64_t model_parts(const ParallelLayout& l) {
  return static_cast<std::int64_t>(l.pipeline_parallel) * l.virtual_stages;
}

// The blocks plus the embeddings and the head counted as blocks (the layout's split).
std::int64_t effective_layers(const Scenario& sc, const ParallelLayout& l) {
  return sc.model.layers + l.first_stage_less_layers + l.last_stage_less_layers;
}

// Blocks per model part where they split evenly (Megatron's and DeepSpeed's numbers).
int layers_per_chunk(const Scenario& sc, const ParallelLayout& l) {
  return static_cast<int>(effective_layers(sc, l) / model_parts(l));
}

// torchtitan's pipeline_parallel_layers_per_stage for the layout's p·v parts: it makes
// ceil((L + first + last) / layers_per_stage) parts (distributed/pipeline_parallel.py).
std::int64_t titan_layers_per_stage(const Scenario& sc, const ParallelLayout& l) {
  const auto eff = effective_layers(sc, l), parts = model_parts(l);
  return (eff + parts - 1) / parts;
}

// The split is the blocks alone, evenly.
bool even_blocks(const Scenario& sc, const ParallelLayout& l) {
  return l.first_stage_less_layers == 0 && l.last_stage_less_layers == 0 &&
         sc.model.layers % model_parts(l) == 0;
}

bool fsdp(const LayoutCandidate& c) { return c.spec.shard_parameters; }

const char* titan_schedule(PipelineSchedule s) {
  switch (s) {
  case PipelineSchedule::one_f_one_b:
    return "1F1B";
  case PipelineSchedule::interleaved_1f1b:
    return "Interleaved1F1B";
  case PipelineSchedule::gpipe:
    return "GPipe";
  }
  return "?";
}

// torchtitan (configs.py ParallelismConfig, job_config.py Parallelism): data parallelism is DDP
// (replicate), FSDP2 (shard) or HSDP; mixed precision is bf16 parameters or fp32; activation
// checkpointing none, full or per-op selective.
std::string titan_cannot(const Scenario& sc, const LayoutCandidate& c) {
  const auto& l = c.layout;
  if (l.pipeline_parallel > 1) {
    const auto eff = effective_layers(sc, l), lps = titan_layers_per_stage(sc, l);
    if ((eff + lps - 1) / lps != model_parts(l))
      return fmt::format("torchtitan's pipeline_parallel_layers_per_stage cannot make {} model "
                         "parts of {} layers (+ {} and {} for the embeddings and the head)",
                         model_parts(l), sc.model.layers, l.first_stage_less_layers,
                         l.last_stage_less_layers);
  }
  if (c.spec.flavour != Flavour::ddp && c.spec.flavour != Flavour::fsdp2)
    return fmt::format("torchtitan has no {} (optimizer-only sharding): its data parallelism is "
                       "DDP, FSDP2 or HSDP",
                       c.spec.strategy);
  if (c.job.precision == Precision::fp16_mixed)
    return "torchtitan trains in bf16 or fp32, not fp16 with loss scaling";
  if (c.job.checkpointing == Checkpointing::every)
    return "torchtitan 0.3.0 has no every-n-th-block checkpointing";
  if (c.job.checkpointing == Checkpointing::selective_attention &&
      c.job.attention != AttentionImpl::flash)
    return "torchtitan has no attention-only recompute of eager attention scores";
  return "";
}

// Megatron-LM core_v0.19.0, megatron/training/arguments.py: --use-torch-fsdp2 asserts
// pipeline_model_parallel_size == 1 and --untie-embeddings-and-output-weights; recompute is
// full (uniform over n layers) or selective (core attention).
std::string megatron_cannot(const Scenario& sc, const LayoutCandidate& c) {
  if (fsdp(c) && c.spec.flavour != Flavour::fsdp2)
    return fmt::format("Megatron-LM shards parameters with torch FSDP2 (--use-torch-fsdp2), not {}",
                       flavour_name(c.spec.flavour));
  if (!fsdp(c) && c.spec.flavour != Flavour::megatron)
    return fmt::format("this layout was costed with {}'s {}; Megatron-LM runs its own DDP and "
                       "distributed optimizer (--recipe megatron plans with them)",
                       flavour_name(c.spec.flavour), c.spec.strategy);
  if (fsdp(c) && c.layout.pipeline_parallel > 1)
    return "Megatron-LM refuses --use-torch-fsdp2 with pipeline parallelism "
           "(megatron/training/arguments.py)";
  if (fsdp(c) && sc.model.tied_embeddings)
    return "Megatron-LM's --use-torch-fsdp2 requires --untie-embeddings-and-output-weights, and "
           "this model ties them";
  if (c.job.precision == Precision::bf16)
    return "Megatron-LM keeps fp32 main weights; this plan is pure bf16";
  if (c.job.checkpointing == Checkpointing::every)
    return "Megatron-LM's recompute methods (uniform, block) do not checkpoint every n-th block";
  // transformer_config.py: recompute_granularity "selective" reruns the modules of
  // --recompute-modules (core_attn by default), never a per-op save list.
  if (c.job.checkpointing == Checkpointing::selective_op)
    return "Megatron-LM's selective recompute reruns whole modules (--recompute-modules, "
           "core_attn by default), not torchtitan's per-op save list (selective-op)";
  const auto& l = c.layout;
  if (l.pipeline_parallel > 1 && (l.first_stage_less_layers > 1 || l.last_stage_less_layers > 1 ||
                                  effective_layers(sc, l) % model_parts(l) != 0))
    return fmt::format("Megatron-LM splits the layers evenly over the {} model parts, counting "
                       "the embeddings and the loss as one layer each at most "
                       "(--account-for-embedding/loss-in-pipeline-split); this split has {} "
                       "layers (+ {} and {})",
                       model_parts(l), sc.model.layers, l.first_stage_less_layers,
                       l.last_stage_less_layers);
  return "";
}

// DeepSpeed v0.19.5: the pipeline engine (deepspeed/runtime/pipe/engine.py) asserts ZeRO stage < 2
// and runs one schedule (TrainSchedule, 1F1B: deepspeed/runtime/pipe/schedule.py); AutoTP
// ("tensor_parallel": {"autotp_size"}, deepspeed/runtime/tensor_parallel/config.py) splits the
// linears without sequence parallelism; its sequence parallelism is Ulysses (all-to-all over
// heads), not ring attention.
std::string deepspeed_cannot(const Scenario& sc, const LayoutCandidate& c) {
  const auto& l = c.layout;
  if (l.pipeline_parallel > 1 && !even_blocks(sc, l))
    return fmt::format("DeepSpeed's PipelineModule partitions the {} blocks evenly "
                       "(partition_method \"type:\"); this split counts the embeddings and the "
                       "head as blocks, or does not divide",
                       sc.model.layers);
  if (fsdp(c))
    return "this layout was costed with FSDP2 over the replicas; DeepSpeed's ZeRO-3 is another "
           "engine (and its pipeline engine refuses ZeRO-2 and ZeRO-3)";
  if (c.spec.flavour == Flavour::megatron)
    return fmt::format("this layout was costed with Megatron-core's {} (fp32 main gradients); "
                       "DeepSpeed's engine keeps other buffers",
                       c.spec.shard_optimizer ? "distributed optimizer" : "DDP");
  if (l.context_parallel > 1)
    return "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not ring "
           "attention over a context-parallel group";
  if (l.tensor_parallel > 1 && l.sequence_parallel)
    return "DeepSpeed's AutoTP (tensor_parallel.autotp_size) has no sequence parallelism over "
           "the norms and dropouts";
  if (l.tensor_parallel > 1 && l.pipeline_parallel > 1)
    return "DeepSpeed's pipeline engine takes tensor parallelism from the model's own mpu, not "
           "from AutoTP";
  if (l.pipeline_parallel > 1 && l.schedule != PipelineSchedule::one_f_one_b)
    return fmt::format("DeepSpeed's pipeline engine runs 1F1B only, not {}",
                       schedule_name(l.schedule));
  if (c.job.checkpointing == Checkpointing::selective_attention &&
      c.job.attention != AttentionImpl::flash)
    return "DeepSpeed has no attention-only recompute of eager attention scores";
  if (c.job.checkpointing == Checkpointing::selective_op ||
      c.job.checkpointing == Checkpointing::every)
    return fmt::format("DeepSpeed has no {} checkpointing", checkpointing_label(c.job));
  return "";
}

// One torchtitan option: section.key = value (a TOML literal).
struct TitanOption {
  std::string section, key, value;
};

// The options both torchtitan versions share. local_batch_size is a replica's batch per
// optimizer step: with a pipeline its m micro-batches of pipeline_parallel_microbatch_size; without
// one, a micro-batch, accumulated global / (local x data parallel) times. The less_layers options
// are the layout's split (the embeddings and the head counted as blocks) and layers_per_stage
// gives exactly its p·v parts (torchtitan/distributed/pipeline_parallel.py: parts =
// ceil((L + first_less + last_less) / layers_per_stage), split as documents::pipeline_parts).
std::vector<TitanOption> titan_options(const Scenario& sc, const LayoutCandidate& c) {
  const auto& l = c.layout;
  const int d = l.data_parallel(sc.cluster.gpus);
  const bool pp = l.pipeline_parallel > 1;
  std::vector<TitanOption> o;
  auto add = [&](const char* section, const char* key, std::string value) {
    o.push_back({section, key, std::move(value)});
  };
  add("training", "local_batch_size",
      std::to_string(pp ? static_cast<std::int64_t>(l.micro_batches) * c.job.micro_batch
                        : c.job.micro_batch));
  add("training", "global_batch_size", std::to_string(c.job.global_batch));
  add("training", "seq_len", std::to_string(c.job.seq_len));
  if (c.job.precision == Precision::bf16_mixed)
    add("training", "mixed_precision_param", "\"bfloat16\"");
  else if (c.job.precision == Precision::fp32)
    add("training", "mixed_precision_param", "\"float32\"");
  else if (c.job.precision == Precision::bf16)
    add("training", "dtype", "\"bfloat16\"");
  add("parallelism", "data_parallel_replicate_degree", std::to_string(fsdp(c) ? 1 : d));
  add("parallelism", "data_parallel_shard_degree", std::to_string(fsdp(c) ? d : 1));
  add("parallelism", "tensor_parallel_degree", std::to_string(l.tensor_parallel));
  if (pp) {
    add("parallelism", "pipeline_parallel_degree", std::to_string(l.pipeline_parallel));
    add("parallelism", "pipeline_parallel_schedule",
        fmt::format("\"{}\"", titan_schedule(l.schedule)));
    add("parallelism", "pipeline_parallel_layers_per_stage",
        std::to_string(titan_layers_per_stage(sc, l)));
    add("parallelism", "pipeline_parallel_first_stage_less_layers",
        std::to_string(l.first_stage_less_layers));
    add("parallelism", "pipeline_parallel_last_stage_less_layers",
        std::to_string(l.last_stage_less_layers));
    add("parallelism", "pipeline_parallel_microbatch_size", std::to_string(c.job.micro_batch));
  }
  add("parallelism", "context_parallel_degree", std::to_string(l.context_parallel));
  return o;
}

const char* titan_checkpointing(const TrainingJob& j) {
  if (j.checkpointing == Checkpointing::selective_op) return "selective";  // its save list, "op"
  return j.checkpointing == Checkpointing::full ? "full" : "none";
}

// What torchtitan 0.2.2 refuses beyond what 0.3.0 does: DDP beside another dimension
// (models/llama3/infra/parallelize.py raises "DDP has not supported > 1D parallelism"), and
// tensor parallelism without sequence parallelism (its TP plan always shards the norms).
std::string titan_022_cannot(const LayoutCandidate& c) {
  if (!fsdp(c) && !c.layout.trivial())
    return "0.2.x runs DDP only as the one parallelism (\"DDP has not supported > 1D "
           "parallelism\"); use 0.3.0 below";
  if (c.layout.tensor_parallel > 1 && !c.layout.sequence_parallel)
    return "0.2.x always shards the norms over the sequence under tensor parallelism";
  return "";
}

void titan_toml(Text& t, const Scenario& sc, const LayoutCandidate& c) {
  t.line("# ---- torchtitan 0.2.x (checked: 0.2.2) job config: TOML for --job.config_file, keys of "
         "torchtitan/config/job_config.py ----");
  if (const auto why = titan_022_cannot(c); !why.empty()) {
    t.line("# not expressible in torchtitan 0.2.x: {}", why);
    return;
  }
  std::string section;
  for (const auto& x : titan_options(sc, c)) {
    if (x.section != section) {
      if (!section.empty()) t.line("");
      t.line("[{}]", x.section);
      section = x.section;
    }
    t.line("{} = {}", x.key, x.value);
  }
  // 0.2.2: async TP is a parallelism option that needs [compile] enable with "model" among its
  // components (torchtitan/distributed/tensor_parallel.py).
  if (c.layout.async_tensor_parallel) t.line("enable_async_tensor_parallel = true");
  t.line("");
  t.line("[activation_checkpoint]");
  t.line("mode = \"{}\"", titan_checkpointing(c.job));
  if (c.job.checkpointing == Checkpointing::selective_op) t.line("selective_ac_option = \"op\"");
  if (c.job.float8 != documents::Float8Recipe::none) {
    t.line("");
    t.line("# Float8 ({}): not written for 0.2.x, whose converter options changed between its "
           "releases; use 0.3.0's below",
           documents::float8_recipe_name(c.job.float8));
  }
  // The plan's torch.compile (--compile: each block and the loss), or async TP's.
  if (c.layout.async_tensor_parallel || c.job.compile) {
    t.line("");
    t.line("[compile]");
    t.line("enable = true");
  }
}

// 0.3.0's options as --section.key value; booleans as flags, async TP under --compile
// (CompileConfig asserts --compile.enable with "model" in its components).
std::vector<std::string> titan_030_args(const Scenario& sc, const LayoutCandidate& c) {
  std::vector<std::string> args;
  for (const auto& x : titan_options(sc, c)) {
    std::string value = x.value;
    if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
    args.push_back(fmt::format("--{}.{} {}", x.section, x.key, value));
  }
  if (c.layout.tensor_parallel > 1 && !c.layout.sequence_parallel)
    args.push_back("--parallelism.no_enable_sequence_parallel");
  if (c.layout.async_tensor_parallel || c.job.compile) args.push_back("--compile.enable");
  if (c.layout.async_tensor_parallel) args.push_back("--compile.enable_async_tensor_parallel");
  return args;
}

std::string headline(const Scenario& sc, const LayoutCandidate& c) {
  const auto& l = c.layout;
  std::string pp = fmt::format("pipeline {}", l.pipeline_parallel);
  if (l.pipeline_parallel > 1)
    pp += fmt::format(" ({}{}, {} micro-batches of {})", schedule_name(l.schedule),
                      l.virtual_stages > 1 ? fmt::format(" x{}", l.virtual_stages) : "",
                      l.micro_batches, c.job.micro_batch);
  return fmt::format("# shardplan: tensor {}{}, {}, context {}, data {} ({}), checkpointing {}; "
                     "predicted step {}, peak {} of {} usable per GPU",
                     l.tensor_parallel, l.sequence_parallel ? " with sequence parallel" : "", pp,
                     l.context_parallel, l.data_parallel(sc.cluster.gpus), c.spec.strategy,
                     checkpointing_label(c.job), seconds(c.result.step.step_s),
                     gib(c.result.step.peak_bytes), gib(sc.usable_bytes()));
}

void refuse(ParallelFramework f, const Scenario& sc, const LayoutCandidate& c) {
  if (const auto why = cannot_express(f, sc, c); !why.empty()) throw InputError("--emit", why);
}

std::vector<std::string> megatron_args(const Scenario& sc, const LayoutCandidate& c) {
  const auto& l = c.layout;
  std::vector<std::string> a = {fmt::format("--tensor-model-parallel-size {}", l.tensor_parallel)};
  if (l.sequence_parallel) a.push_back("--sequence-parallel");
  if (l.async_tensor_parallel) a.push_back("--tp-comm-overlap");
  a.push_back(fmt::format("--pipeline-model-parallel-size {}", l.pipeline_parallel));
  if (l.first_stage_less_layers > 0) a.push_back("--account-for-embedding-in-pipeline-split");
  if (l.last_stage_less_layers > 0) a.push_back("--account-for-loss-in-pipeline-split");
  if (l.virtual_stages > 1)
    a.push_back(fmt::format("--num-layers-per-virtual-pipeline-stage {}", layers_per_chunk(sc, l)));
  a.push_back(fmt::format("--context-parallel-size {}", l.context_parallel));
  a.push_back(fmt::format("--micro-batch-size {}", c.job.micro_batch));
  a.push_back(fmt::format("--global-batch-size {}", c.job.global_batch));
  a.push_back(fmt::format("--seq-length {}", c.job.seq_len));
  if (c.spec.shard_optimizer && !fsdp(c)) a.push_back("--use-distributed-optimizer");
  // The main gradients and their reduction in bf16 rather than --bf16's fp32 (arguments.py).
  if (c.spec.main_grad_buffer && c.spec.reduce_dtype == DType::bf16)
    a.push_back("--grad-reduce-in-bf16");
  // A plan that reduces bucket by bucket beside the backward (with_overlap_grad_reduce).
  if (c.spec.main_grad_buffer && c.spec.reduce_bucket_bytes > 0)
    a.push_back("--overlap-grad-reduce");
  if (fsdp(c)) {
    // arguments.py asserts --use-torch-fsdp2 without gradient accumulation fusion.
    a.push_back("--use-torch-fsdp2");
    a.push_back("--no-gradient-accumulation-fusion");
  }
  if (!sc.model.tied_embeddings) a.push_back("--untie-embeddings-and-output-weights");
  if (c.job.precision == Precision::bf16_mixed) a.push_back("--bf16");
  if (c.job.precision == Precision::fp16_mixed) a.push_back("--fp16");
  if (c.job.checkpointing == Checkpointing::full) {
    a.push_back("--recompute-granularity full");
    a.push_back("--recompute-method uniform");
    a.push_back("--recompute-num-layers 1");
  } else if (c.job.checkpointing == Checkpointing::selective_attention) {
    a.push_back("--recompute-granularity selective");
  }
  return a;
}

}  // namespace

const char* framework_name(ParallelFramework f) {
  switch (f) {
  case ParallelFramework::torchtitan:
    return "torchtitan";
  case ParallelFramework::megatron:
    return "Megatron-LM";
  case ParallelFramework::deepspeed:
    return "DeepSpeed";
  }
  return "?";
}

std::optional<ParallelFramework> emitted_framework(const std::string& emit) {
  if (emit == "torchtitan") return ParallelFramework::torchtitan;
  if (emit == "megatron") return ParallelFramework::megatron;
  if (emit == "deepspeed") return ParallelFramework::deepspeed;
  return std::nullopt;
}

std::string cannot_express(ParallelFramework f, const Scenario& sc, const LayoutCandidate& c) {
  switch (f) {
  case ParallelFramework::torchtitan:
    return titan_cannot(sc, c);
  case ParallelFramework::megatron:
    return megatron_cannot(sc, c);
  case ParallelFramework::deepspeed:
    return deepspeed_cannot(sc, c);
  }
  return "";
}

nlohmann::json layout_plan_document(const Scenario& sc, const LayoutCandidate& c) {
  Plan p;
  p.model = sc.model;
  p.hardware = sc.hardware.name;
  p.cluster = sc.cluster;
  if (sc.profile_memory_bytes)
    p.gpu_memory_GiB = sc.hardware.memory_bytes / (1024.0 * 1024.0 * 1024.0);
  p.job = c.job;
  p.spec = c.spec;
  p.parallel = c.layout;
  p.prediction = prediction_from(c.result.step);
  return plan_to_json(p);
}

// 0.3.0's Float8 is a model converter of the config_registry entry
// (components/quantization/float8.py, Float8LinearConverter.Config), not a command-line option.
void titan_float8(Text& t, const TrainingJob& j) {
  if (j.float8 == documents::Float8Recipe::none) return;
  std::vector<std::string> filter;
  for (const auto& f : j.float8_filter) filter.push_back(fmt::format("\"{}\"", f));
  t.line("# Float8: a model converter in 0.3.0, set in the config_registry entry --config names:");
  t.line("#   from torchtitan.components.quantization import Float8LinearConverter");
  t.line("#   model_spec = model_registry(<flavour>, converters=[Float8LinearConverter.Config(");
  t.line("#       recipe_name=\"{}\", filter_fqns=[{}], model_compile_enabled={})])",
         documents::float8_recipe_name(j.float8), fmt::join(filter, ", "),
         j.compile ? "True" : "False");
}

std::string torchtitan_parallel_settings(const Scenario& sc, const LayoutCandidate& c) {
  refuse(ParallelFramework::torchtitan, sc, c);
  Text t;
  t.line("{}", headline(sc, c));
  t.line("");
  titan_toml(t, sc, c);
  t.line("");
  t.line("# ---- torchtitan 0.3.0 command line: tyro options of torchtitan/config/configs.py "
         "(ParallelismConfig, CompileConfig) and trainer.py ----");
  t.line(
      "# --module and --config pick your model's config_registry entry; these options override it");
  auto args = titan_030_args(sc, c);
  args.push_back(fmt::format("activation_checkpoint:{}", titan_checkpointing(c.job)));
  t.line("torchrun --nnodes {} --nproc_per_node {} -m torchtitan.train --module <model> --config "
         "<config> \\",
         sc.cluster.nodes(), std::min(sc.cluster.gpus, sc.cluster.gpus_per_node));
  for (std::size_t i = 0; i < args.size(); ++i)
    t.line("  {}{}", args[i], i + 1 < args.size() ? " \\" : "");
  titan_float8(t, c.job);
  return t.str;
}

std::string torchtitan_options(const Scenario& sc, const LayoutCandidate& c) {
  if (!cannot_express(ParallelFramework::torchtitan, sc, c).empty()) return "";
  return fmt::format("{}", fmt::join(titan_030_args(sc, c), " "));
}

std::string megatron_parallel_arguments(const Scenario& sc, const LayoutCandidate& c) {
  refuse(ParallelFramework::megatron, sc, c);
  Text t;
  t.line("{}", headline(sc, c));
  t.line("# ---- Megatron-LM core_v0.19.0: arguments of megatron/training/arguments.py ----");
  t.line("# the model's own arguments (--num-layers, --hidden-size, --num-attention-heads, "
         "--group-query-attention, ...) are yours to add");
  if (fsdp(c))
    t.line("# FSDP requires CUDA_DEVICE_MAX_CONNECTIONS other than 1 "
           "(megatron/training/arguments.py)");
  t.line("torchrun --nnodes {} --nproc_per_node {} pretrain_gpt.py \\", sc.cluster.nodes(),
         std::min(sc.cluster.gpus, sc.cluster.gpus_per_node));
  const auto args = megatron_args(sc, c);
  for (std::size_t i = 0; i < args.size(); ++i)
    t.line("  {}{}", args[i], i + 1 < args.size() ? " \\" : "");
  return t.str;
}

std::string megatron_arguments(const Scenario& sc, const LayoutCandidate& c) {
  if (!cannot_express(ParallelFramework::megatron, sc, c).empty()) return "";
  return fmt::format("{}", fmt::join(megatron_args(sc, c), " "));
}

// train_batch_size = micro-batch x gradient_accumulation_steps x data-parallel ranks
// (deepspeed/runtime/config.py, _batch_assertion); the pipeline engine runs the accumulation
// steps as its micro-batches.
std::string deepspeed_pipeline_note(const Scenario& sc, const LayoutCandidate& c) {
  if (c.layout.pipeline_parallel == 1) return "";
  return fmt::format(
      "DeepSpeed v0.19.5: build the model as deepspeed.pipe.PipelineModule(layers=..., "
      "num_stages={}, partition_method=\"type:<block class>\") so that each stage "
      "holds {} blocks (deepspeed/runtime/pipe/module.py)",
      c.layout.pipeline_parallel, layers_per_chunk(sc, c.layout));
}

nlohmann::json deepspeed_parallel_config(const Scenario& sc, const LayoutCandidate& c) {
  refuse(ParallelFramework::deepspeed, sc, c);
  const auto& l = c.layout;
  const auto p = c.job.precision;
  nlohmann::json j = {
      {"train_batch_size", c.job.global_batch},
      {"train_micro_batch_size_per_gpu", c.job.micro_batch},
      {"gradient_accumulation_steps", l.micro_batches},
      {"zero_optimization", {{"stage", c.spec.shard_optimizer ? 1 : 0}}},
      {"bf16", {{"enabled", p == Precision::bf16_mixed || p == Precision::bf16}}},
      {"fp16", {{"enabled", p == Precision::fp16_mixed}}},
  };
  if (l.pipeline_parallel > 1)
    // Read by the pipeline engine at start (engine.py): every block checkpointed, or none. The
    // stage count is PipelineModule's num_stages, not a config key.
    j["pipeline"] = {
        {"activation_checkpoint_interval", c.job.checkpointing == Checkpointing::full ? 1 : 0}};
  return j;
}

// The fastest fitting layout the framework runs as costed; the lines that say why faster ones
// were passed over go to `notes`. Throws when none is expressible.
const LayoutCandidate& expressible_layout(ParallelFramework f, const std::string& emit,
                                          const Scenario& sc, const LayoutSearch& found,
                                          std::vector<std::string>& notes) {
  const auto& ranked = found.ranked;
  const std::string fastest_reason = cannot_express(f, sc, ranked.front());
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    if (!cannot_express(f, sc, ranked[i]).empty()) continue;
    if (i > 0)
      notes.push_back(fmt::format("--emit {}: the fastest layout is not expressible ({}); "
                                  "emitting rank {}, the fastest that is",
                                  emit, fastest_reason, i + 1));
    return ranked[i];
  }
  throw InputError("--emit", fmt::format("{}: none of the {} fitting layouts runs in {} as costed; "
                                         "the fastest: {}",
                                         emit, ranked.size(), framework_name(f), fastest_reason));
}

}  // namespace shardplan::planner
