#include "planner/scenario.hpp"

#include <fmt/format.h>

#include "costmodel/json_reader.hpp"

namespace shardplan::planner {

using costmodel::InputError;

void add_scenario_options(CLI::App& app, ScenarioOptions& o) {
  app.add_option("--model", o.model, "preset name or path to a Hugging Face config.json");
  app.add_option("--params", o.params, "a bare parameter count instead of --model (e.g. 7.5e9)");
  app.add_option("--layers", o.layers, "transformer blocks of a bare --params model");
  app.add_option("--hardware", o.hardware, "hardware profile name or path");
  app.add_option("--job", o.job_file, "training-job document (flags override its fields)");
  app.add_option("--gpus", o.gpus, "GPUs in the job");
  app.add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node (default: the profile's)");
  app.add_option("--seq-len", o.seq_len, "tokens per sequence");
  app.add_option("--global-batch", o.global_batch, "sequences per optimizer step, whole job");
  app.add_option("--micro-batch", o.micro_batch, "sequences per GPU per forward/backward");
  app.add_option("--precision", o.precision, "fp32 | bf16-mixed | fp16-mixed | bf16");
  app.add_option("--optimizer", o.optimizer, "adamw | adam | sgd | adafactor");
  app.add_option("--checkpointing", o.checkpointing,
                 "none | full | every:N | selective-attention (alias selective) | selective-op");
  app.add_option("--attention", o.attention, "flash | eager");
  app.add_option("--recipe", o.recipe,
                 "the training code: hf | torchtitan | llm-foundry | megatron | deepspeed | executor "
                 "(default hf: transformers' own model and loss)");
  app.add_option("--loss", o.loss, "upcast | fused | chunked:N | fused-linear | fp32-inplace (default: the recipe's)");
  app.add_option("--headroom", o.headroom, "fraction of GPU memory kept free (default 0.05)");
  app.add_option("--accounting", o.accounting, "framework | zero-paper (2+2+12 bytes/param)");
}

Scenario make_scenario(const ScenarioOptions& o) {
  Scenario sc;
  sc.is_default = o.model.empty() && o.params == 0 && o.hardware.empty() && o.gpus == 0 &&
                  o.job_file.empty();
  if (o.params != 0 && !o.model.empty())
    throw InputError("--params", "give either --model or --params, not both");
  sc.model = o.params != 0 ? costmodel::model_from_param_count(o.params, o.layers)
                           : costmodel::load_model(o.model.empty() ? kDefaultModel : o.model);
  sc.hardware = costmodel::load_hardware(o.hardware.empty() ? kDefaultHardware : o.hardware);
  if (o.gpus < 0) throw InputError("--gpus", fmt::format("must be >= 1, got {}", o.gpus));
  sc.cluster.gpus = o.gpus == 0 ? kDefaultGpus : o.gpus;
  sc.cluster.gpus_per_node = o.gpus_per_node == 0 ? sc.hardware.gpus_per_node : o.gpus_per_node;
  costmodel::validate_cluster(sc.cluster);

  bool& loss_named = sc.loss_named;
  bool& checkpointing_named = sc.checkpointing_named;
  loss_named = !o.loss.empty();
  checkpointing_named = !o.checkpointing.empty();
  if (!o.job_file.empty()) {
    const auto doc = costmodel::read_json_document(o.job_file, [&](const nlohmann::json& d) {
      sc.job = costmodel::job_from_json(d);
      return d;
    });
    loss_named = loss_named || (doc.is_object() && doc.contains("loss"));
    checkpointing_named = checkpointing_named || (doc.is_object() && doc.contains("checkpointing"));
  } else {
    sc.job.seq_len = kDefaultSeqLen;
    sc.job.global_batch = kDefaultSequencesPerGpu * sc.cluster.gpus;
  }
  auto positive = [](auto v, const char* flag) {
    if (v < 0) throw InputError(flag, fmt::format("must be > 0, got {}", v));
    return v;
  };
  if (positive(o.seq_len, "--seq-len") > 0) sc.job.seq_len = o.seq_len;
  if (positive(o.global_batch, "--global-batch") > 0) sc.job.global_batch = o.global_batch;
  if (positive(o.micro_batch, "--micro-batch") > 0) sc.job.micro_batch = o.micro_batch;
  if (sc.job.seq_len > 100'000'000)
    throw InputError("--seq-len", fmt::format("must be <= 100000000, got {}", sc.job.seq_len));
  if (!o.precision.empty()) sc.job.precision = costmodel::precision_from_name(o.precision, "--precision");
  if (!o.optimizer.empty()) sc.job.optimizer = costmodel::optimizer_from_name(o.optimizer, "--optimizer");
  if (!o.checkpointing.empty()) costmodel::set_checkpointing(sc.job, o.checkpointing, "--checkpointing");
  if (!o.attention.empty()) sc.job.attention = costmodel::attention_from_name(o.attention, "--attention");
  if (!o.recipe.empty()) {  // the recipe's loss and checkpointing unless the user names them
    sc.job.recipe = costmodel::recipe_from_name(o.recipe, "--recipe");
    if (!loss_named) sc.job.loss = costmodel::default_loss(sc.job.recipe);
    if (!checkpointing_named) sc.job.checkpointing = costmodel::default_checkpointing(sc.job.recipe);
  }
  if (!o.loss.empty()) costmodel::set_loss(sc.job, o.loss, "--loss");
  if (sc.job.checkpointing == costmodel::Checkpointing::every) {  // as the recipe's code counts
    bool any = false;
    for (std::int64_t b = 0; b < sc.model.layers && !any; ++b) any = sc.job.block_checkpointed(b);
    if (!any)
      throw InputError("--checkpointing", fmt::format("every:{} checkpoints no block of a {}-layer model under recipe {}",
                                                      sc.job.checkpoint_every, sc.model.layers,
                                                      costmodel::recipe_name(sc.job.recipe)));
  }
  costmodel::validate_job(sc.job, sc.cluster);
  if (!(o.headroom >= 0 && o.headroom < 1))
    throw InputError("--headroom", fmt::format("must be in [0, 1), got {}", o.headroom));
  sc.headroom = o.headroom;
  if (o.accounting == "framework") sc.accounting = costmodel::Accounting::framework;
  else if (o.accounting == "zero-paper") sc.accounting = costmodel::Accounting::zero_paper;
  else
    throw InputError("--accounting",
                     fmt::format("must be framework or zero-paper, got \"{}\"", o.accounting));
  return sc;
}

void add_plan_options(CLI::App& app, PlanOptions& o, bool strategy_required) {
  auto* s = app.add_option("--strategy", o.strategy,
                           "ddp | zero1 | zero2 | zero3 | fsdp-full | fsdp-grad-op | hsdp");
  if (strategy_required) s->required();
  app.add_option("--flavour", o.flavour, "ddp | fsdp1 | fsdp2 | deepspeed (default by strategy)");
  app.add_option("--shard-group-size", o.shard_group_size, "HSDP shard group (default: GPUs per node)");
  app.add_option("--offload", o.offload, "none | optimizer | params");
}

costmodel::ShardingSpec make_plan_spec(const PlanOptions& o, const std::string& strategy,
                                       const Scenario& sc) {
  std::optional<costmodel::Flavour> flavour;
  if (!o.flavour.empty()) flavour = costmodel::flavour_from_name(o.flavour, "--flavour");
  std::optional<int> group;
  if (o.shard_group_size != 0) group = o.shard_group_size;
  auto spec = costmodel::make_spec(strategy, flavour, sc.cluster.gpus_per_node, group);
  spec.offload = costmodel::offload_from_name(o.offload, "--offload");
  if (spec.shard_group_size > 0 && sc.cluster.gpus % spec.shard_group_size != 0)
    throw InputError("--shard-group-size",
                     fmt::format("{} does not divide {} GPUs", spec.shard_group_size, sc.cluster.gpus));
  return spec;
}

}  // namespace shardplan::planner
