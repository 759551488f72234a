#include "planner/emit_fsdp.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/recipe.hpp"
#include "planner/loss_requirement.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;
using namespace core;

namespace {

const char* torch_dtype(DType d) {
  switch (d) {
  case DType::bf16:
    return "torch.bfloat16";
  case DType::fp16:
    return "torch.float16";
  case DType::fp32:
  case DType::tf32:
    return "torch.float32";
  }
  return "torch.float32";
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

struct Layout {
  int shard = 1;      // ranks that share one copy of the sharded state
  int replicate = 1;  // copies
};

Layout layout_of(const Scenario& sc, const ShardingSpec& s) {
  const int world = sc.cluster.gpus;
  if (!s.shard_optimizer) return {1, world};  // ddp: every rank a replica
  const int shard = s.group(world);
  return {shard, world / shard};
}

std::string mesh_line(const Layout& l) {
  if (l.replicate > 1)
    return fmt::format(
        "mesh = init_device_mesh(\"cuda\", ({}, {}), mesh_dim_names=(\"dp_replicate\", "
        "\"dp_shard\"))  # HSDP: replicate across groups, shard within",
        l.replicate, l.shard);
  return fmt::format("mesh = init_device_mesh(\"cuda\", ({},), mesh_dim_names=(\"dp_shard\",))",
                     l.shard);
}

void batch_lines(Text& t, const Scenario& sc, const Evaluation& e, bool sync_each_micro_batch) {
  const auto accumulation = e.job.global_batch / (e.job.micro_batch * sc.cluster.gpus);
  t.line("# batch: {} sequence{} of {} tokens per GPU per micro-batch, {} accumulation step{}, "
         "global batch {}",
         e.job.micro_batch, e.job.micro_batch == 1 ? "" : "s", e.job.seq_len, accumulation,
         accumulation == 1 ? "" : "s", e.job.global_batch);
  if (accumulation > 1) {
    if (sync_each_micro_batch)
      t.line("# gradients are reduce-scattered after every micro-batch (as costed); do not skip "
             "the sync");
    else
      t.line("# run all but the last micro-batch under `with model.no_sync():` (all-reduce once "
             "per step, as costed)");
  }
}

// The job's transformer blocks as its model code holds them, for the wrapping: transformers 5.23's
// ForCausalLM classes per architecture (LlamaForCausalLM keeps LlamaDecoderLayer blocks in
// model.model.layers, GPT2LMHeadModel GPT2Block in transformer.h, GPTNeoXForCausalLM GPTNeoXLayer
// in gpt_neox.layers: transformers/models/*/modeling_*.py), or the recipe's own (RecipeTraits::
// blocks_at, block_class). Unknown (a model given by its parameter count, or model code that is
// not a PyTorch module of the user's) when neither names them: the snippet then says what to fill.
struct Blocks {
  std::string at;      // a Python expression on `model`: "model.model.layers"
  std::string module;  // where the class is: "transformers.models.llama.modeling_llama"
  std::string cls;     // "LlamaDecoderLayer"
  bool known() const { return !at.empty(); }
};

// The modules FSDP2's "ends" groups hold (documents::Fsdp2Groups): the token embedding, and the
// final norm with the head, as accelerate's fsdp2_prepare_model and torchtitan's apply_fsdp find
// them; a tied table goes with the head (accelerate groups [wte, ln_f, lm_head]). Empty: unknown.
struct Ends {
  std::string embedding;          // "model.model.embed_tokens" ("" when tied: it is in `tail`)
  std::vector<std::string> tail;  // {"model.model.norm", "model.lm_head"}
  bool known() const { return !tail.empty(); }
};

Ends ends_of(const Scenario& sc, const TrainingJob& j) {
  const bool tied = sc.model.tied_embeddings;
  auto ends = [&](std::string embedding, std::string norm, std::string head) {
    if (tied) return Ends{"", {embedding, norm, head}};
    return Ends{embedding, {norm, head}};
  };
  if (!recipe_traits(j.recipe).transformers_code)
    return *recipe_traits(j.recipe).blocks_at == '\0'
               ? Ends{}
               : ends("model.tok_embeddings", "model.norm", "model.output");  // torchtitan
  switch (sc.model.architecture) {
  case Architecture::llama:
  case Architecture::mistral:
  case Architecture::qwen2:
  case Architecture::mixtral:
  case Architecture::qwen2_moe:
  case Architecture::qwen3_moe:
  case Architecture::olmoe:
    return ends("model.model.embed_tokens", "model.model.norm", "model.lm_head");
  case Architecture::gpt2:
    return ends("model.transformer.wte", "model.transformer.ln_f", "model.lm_head");
  case Architecture::gpt_neox:
    return ends("model.gpt_neox.embed_in", "model.gpt_neox.final_layer_norm", "model.embed_out");
  case Architecture::mpt:
    return ends("model.transformer.wte", "model.transformer.norm_f", "model.lm_head");
  case Architecture::uniform:
    break;
  }
  return {};
}

Blocks blocks_of(const Scenario& sc, const TrainingJob& j) {
  const RecipeTraits& r = recipe_traits(j.recipe);
  if (r.transformers_code) {
    switch (sc.model.architecture) {
    case Architecture::llama:
      return {"model.model.layers", "transformers.models.llama.modeling_llama",
              "LlamaDecoderLayer"};
    case Architecture::mistral:
      return {"model.model.layers", "transformers.models.mistral.modeling_mistral",
              "MistralDecoderLayer"};
    case Architecture::qwen2:
      return {"model.model.layers", "transformers.models.qwen2.modeling_qwen2",
              "Qwen2DecoderLayer"};
    case Architecture::gpt2:
      return {"model.transformer.h", "transformers.models.gpt2.modeling_gpt2", "GPT2Block"};
    case Architecture::gpt_neox:
      return {"model.gpt_neox.layers", "transformers.models.gpt_neox.modeling_gpt_neox",
              "GPTNeoXLayer"};
    case Architecture::mixtral:
      return {"model.model.layers", "transformers.models.mixtral.modeling_mixtral",
              "MixtralDecoderLayer"};
    case Architecture::qwen2_moe:
      return {"model.model.layers", "transformers.models.qwen2_moe.modeling_qwen2_moe",
              "Qwen2MoeDecoderLayer"};
    case Architecture::qwen3_moe:
      return {"model.model.layers", "transformers.models.qwen3_moe.modeling_qwen3_moe",
              "Qwen3MoeDecoderLayer"};
    case Architecture::olmoe:
      return {"model.model.layers", "transformers.models.olmoe.modeling_olmoe",
              "OlmoeDecoderLayer"};
    case Architecture::mpt:  // llm-foundry 0.22.0: MPTModel.blocks, a ModuleList of MPTBlock
      return {"model.transformer.blocks", "llmfoundry.models.layers.blocks", "MPTBlock"};
    case Architecture::uniform:
      return {};
    }
  }
  const std::string cls = r.block_class;
  const auto colon = cls.find(':');
  if (*r.blocks_at == '\0' || colon == std::string::npos) return {};
  return {r.blocks_at, cls.substr(0, colon), cls.substr(colon + 1)};
}

// The blocks' container in the snippet: the known one, or a name to replace.
std::string blocks_expression(const Blocks& b) { return b.known() ? b.at : "model.layers"; }

// Activation checkpointing applied to the blocks before the wrapper, one form per mode: full and
// every:N wrap blocks with torch's checkpoint_wrapper (what torchtitan's FullAC and 0.2.x's
// selective_ac_option = "N" do); selective-op applies torchtitan 0.3.0's SelectiveAC
// (torchtitan/distributed/activation_checkpoint.py: keeps the outputs of attention and of every
// second matmul, recomputes the rest).
void checkpointing_lines(Text& t, const TrainingJob& j, const Blocks& blocks) {
  switch (j.checkpointing) {
  case Checkpointing::none:
    return;
  case Checkpointing::selective_attention:
    t.line(
        "# selective-attention (Megatron's selective recompute) reruns the attention core only;");
    t.line("# {}",
           j.attention == AttentionImpl::flash
               ? "with flash attention nothing is kept to drop, so no wrapper is needed"
               : "torch has no wrapper for it: recompute the scores inside the attention module");
    return;
  case Checkpointing::selective_op:
    t.line(
        "from torchtitan.distributed.activation_checkpoint import SelectiveAC  # torchtitan 0.3.0");
    t.line(
        "SelectiveAC(SelectiveAC.Config()).apply(model)  # selective-op: keep attention and every "
        "second matmul, recompute the rest");
    return;
  case Checkpointing::full:
  case Checkpointing::every:
    if (recipe_traits(j.recipe).transformers_code) {
      // transformers 5.23 (modeling_utils.py): layers 0, N, 2N, ... as the plan counted them.
      t.line("model.activation_checkpointing_enable(activation_checkpointing_kwargs={{\"use_"
             "reentrant\": False}}, "
             "every_n_layers={})  # transformers; checkpointing {}",
             j.checkpointing == Checkpointing::every ? j.checkpoint_every : 1,
             checkpointing_label(j));
      return;
    }
    t.line("from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import "
           "checkpoint_wrapper");
    const std::string at = blocks_expression(blocks);
    if (!blocks.known()) t.line("# model.layers: where your model keeps its transformer blocks");
    t.line("for name, block in list({}.named_children()):", at);
    if (j.checkpointing == Checkpointing::every) {
      t.line(
          "    if (int(name) + 1) % {} == 0:  # every:{}: one block in {} recomputes its forward",
          j.checkpoint_every, j.checkpoint_every, j.checkpoint_every);
      t.line("        {}.register_module(name, checkpoint_wrapper(block))", at);
    } else {
      t.line("    {}.register_module(name, checkpoint_wrapper(block))  # full: every block", at);
    }
    return;
  }
}

// --compile, as torchtitan's apply_compile runs it (torchtitan/distributed/compile.py): after the
// checkpoint wrappers, each block compiled on its own, whole-graph; the loss compiled too.
void compile_lines(Text& t, const TrainingJob& j, const Blocks& blocks) {
  if (!j.compile) return;
  t.line("for block in {}.children():  # --compile: each block, as torchtitan's apply_compile",
         blocks_expression(blocks));
  t.line("    block.compile(backend=\"inductor\", fullgraph=True)");
  t.line("# and the loss: loss_fn = torch.compile(loss_fn) (CompileConfig's components: model, "
         "loss; the plan costed the compiled loss)");
}

// The dtype FSDP gathers the parameters in: the compute dtype, or under Composer's FULL mode
// (ShardingSpec::fp32_gathered) the parameters' fp32, autocast computing in 16 bits.
std::string param_dtype(const Evaluation& e) {
  return e.spec.fp32_gathered ? "torch.float32" : torch_dtype(compute_dtype(e.job.precision));
}
void autocast_line(Text& t, const Evaluation& e) {
  if (e.spec.fp32_gathered)
    t.line("# forward and loss under torch.autocast(\"cuda\", dtype={}): FSDP gathers fp32 "
           "parameters (Composer's FULL)",
           torch_dtype(compute_dtype(e.job.precision)));
}

// FSDP2 (torch/distributed/fsdp/_fully_shard/_fully_shard.py): fully_shard(module, mesh=...,
// reshard_after_forward=..., mp_policy=MixedPrecisionPolicy(param_dtype, reduce_dtype),
// offload_policy=OffloadPolicy() | CPUOffloadPolicy(pin_memory=True)); a 2-D mesh is HSDP with
// dim 0 replicating and dim 1 sharding. Applied per block, then to the root.
void fsdp2_snippet(Text& t, const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  const Layout l = layout_of(sc, s);
  const bool offload = s.offload == Offload::params;
  const auto p = e.job.precision;
  t.line("# ---- PyTorch FSDP2 (fully_shard) ----");
  t.line("import torch");
  t.line("from torch.distributed.device_mesh import init_device_mesh");
  t.line("from torch.distributed.fsdp import {}, MixedPrecisionPolicy, fully_shard",
         offload ? "CPUOffloadPolicy" : "OffloadPolicy");
  t.line("");
  const Blocks blocks = blocks_of(sc, e.job);
  checkpointing_lines(t, e.job, blocks);
  compile_lines(t, e.job, blocks);
  t.line("{}", mesh_line(l));
  if (p == Precision::bf16)
    t.line(
        "model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states in bf16");
  t.line("mp_policy = MixedPrecisionPolicy(param_dtype={}, reduce_dtype={})", param_dtype(e),
         torch_dtype(s.reduce_dtype));
  autocast_line(t, e);
  t.line("offload_policy = {}", offload ? "CPUOffloadPolicy(pin_memory=True)  # params, grads and "
                                          "optimizer step on the host"
                                        : "OffloadPolicy()  # no offload");
  const std::string args = fmt::format(
      "mesh=mesh, reshard_after_forward={}, mp_policy=mp_policy, offload_policy=offload_policy",
      py_bool(s.reshard_after_forward));
  if (!blocks.known()) t.line("# model.layers: where your model keeps its transformer blocks");
  t.line("for block in {}.children():  # one unit per transformer block",
         blocks_expression(blocks));
  t.line("    fully_shard(block, {})", args);
  const auto groups = e.job.fsdp2_groups.value_or(recipe_traits(e.job.recipe).fsdp2_groups);
  if (groups == Fsdp2Groups::ends) {
    Ends ends = ends_of(sc, e.job);
    if (!ends.known()) {
      t.line("# the token embedding and the final norm with the head: where your model keeps them");
      ends = {"model.tok_embeddings", {"model.norm", "model.output"}};
    }
    if (!ends.embedding.empty())
      t.line("fully_shard({}, {})  # the embedding, a group of its own", ends.embedding, args);
    t.line("fully_shard([{}], mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy, "
           "offload_policy=offload_policy)  # the final norm with the head, gathered until "
           "backward",
           fmt::join(ends.tail, ", "));
    t.line("fully_shard(model, {})  # root: what is left (--fsdp2-groups ends)", args);
  } else {
    t.line("fully_shard(model, {})  # root: embeddings and head (--fsdp2-groups root)", args);
  }
  if (offload) t.line("# the optimizer then steps on the host: build it after fully_shard");
  batch_lines(t, sc, e, true);
}

// FSDP1 (torch/distributed/fsdp/fully_sharded_data_parallel.py): one FlatParameter per wrapped
// block; limit_all_gathers=True (the rate limiter of 2) and BACKWARD_PRE prefetch are its defaults.
void fsdp1_snippet(Text& t, const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  const Layout l = layout_of(sc, s);
  const bool offload = s.offload == Offload::params;
  const char* strategy = l.replicate > 1           ? "HYBRID_SHARD"
                         : s.reshard_after_forward ? "FULL_SHARD"
                                                   : "SHARD_GRAD_OP";
  t.line("# ---- PyTorch FSDP1 (FullyShardedDataParallel) ----");
  t.line("import torch");
  t.line("from torch.distributed.device_mesh import init_device_mesh");
  t.line("from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, "
         "ShardingStrategy");
  t.line("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP");
  t.line("from torch.distributed.fsdp.wrap import ModuleWrapPolicy");
  const Blocks blocks = blocks_of(sc, e.job);
  if (blocks.known()) t.line("from {} import {}", blocks.module, blocks.cls);
  t.line("");
  checkpointing_lines(t, e.job, blocks);
  compile_lines(t, e.job, blocks);
  t.line("{}", mesh_line(l));
  if (e.job.precision == Precision::bf16)
    t.line(
        "model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states in bf16");
  t.line("model = FSDP(");
  t.line("    model,");
  t.line("    device_mesh=mesh,");
  t.line("    sharding_strategy=ShardingStrategy.{},  # reshard_after_forward={}", strategy,
         py_bool(s.reshard_after_forward));
  if (blocks.known())
    t.line("    auto_wrap_policy=ModuleWrapPolicy({{{}}}),  # one unit per transformer block",
           blocks.cls);
  else
    t.line("    auto_wrap_policy=ModuleWrapPolicy({{TransformerBlock}}),  # TransformerBlock: your "
           "model's block class");
  t.line("    mixed_precision=MixedPrecision(param_dtype={}, reduce_dtype={}),", param_dtype(e),
         torch_dtype(s.reduce_dtype));
  t.line("    cpu_offload=CPUOffload(offload_params={}),", py_bool(offload));
  // The plan's: BACKWARD_PRE, or None (transformers' Trainer's NO_PREFETCH, the hf recipe's).
  t.line("    backward_prefetch={},",
         s.backward_prefetch > 0 ? "BackwardPrefetch.BACKWARD_PRE" : "None");
  t.line("    limit_all_gathers=True,");
  t.line(")");
  autocast_line(t, e);
  batch_lines(t, sc, e, true);
}

// torch.nn.parallel.DistributedDataParallel (torch/nn/parallel/distributed.py): bucket_cap_mb,
// gradient_as_bucket_view; mixed precision through torch.autocast with fp32 parameters.
void ddp_snippet(Text& t, const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  const auto p = e.job.precision;
  t.line("# ---- PyTorch DDP (DistributedDataParallel) ----");
  t.line("import torch");
  t.line("from torch.nn.parallel import DistributedDataParallel as DDP");
  t.line("");
  checkpointing_lines(t, e.job, blocks_of(sc, e.job));
  compile_lines(t, e.job, blocks_of(sc, e.job));
  if (p == Precision::bf16)
    t.line(
        "model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states in bf16");
  t.line(
      "model = DDP(model, device_ids=[local_rank], bucket_cap_mb={:g}, gradient_as_bucket_view={})",
      s.reduce_bucket_bytes / kMiB, py_bool(!s.grad_bucket_copy));
  if (p == Precision::bf16_mixed || p == Precision::fp16_mixed)
    t.line("# forward and loss under torch.autocast(\"cuda\", dtype={}){}",
           torch_dtype(compute_dtype(p)),
           p == Precision::fp16_mixed ? ", with torch.amp.GradScaler for the loss" : "");
  batch_lines(t, sc, e, false);
}

// torchtitan's options: the same names in 0.2.x (0.2.0-0.2.2: a TOML job config read with
// --job.config_file, keys of torchtitan/config/job_config.py) and 0.3.0 (command-line options only,
// parsed by tyro over torchtitan/config/configs.py and trainer.py). [training] local_batch_size,
// global_batch_size, seq_len, dtype ("bfloat16": pure bf16), mixed_precision_param ("bfloat16" |
// "float32"), mixed_precision_reduce ("float32" only), enable_cpu_offload; [parallelism]
// data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward
// ("default" | "always" | "never"). Accumulation = global / (local × DP degree). Activation
// checkpointing: 0.2.x's [activation_checkpoint] mode ("none" | "selective" | "full") and
// selective_ac_option ("op" or every n-th layer); 0.3.0's subcommand activation_checkpoint:none |
// selective (per op) | full (torchtitan/distributed/activation_checkpoint.py), no every-n-th form.
struct TitanEntry {
  std::string section, key;
  std::string value;    // a TOML literal; "" for a comment
  std::string comment;  // after the value, or the whole line
  bool boolean = false;
};

std::vector<TitanEntry> titan_entries(const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  const Layout l = layout_of(sc, s);
  const bool fsdp = s.shard_optimizer;
  const auto p = e.job.precision;
  std::vector<TitanEntry> out;
  auto add = [&](const char* section, const char* key, std::string value,
                 std::string comment = "") {
    out.push_back({section, key, std::move(value), std::move(comment), false});
  };
  auto note = [&](const char* section, std::string comment) {
    out.push_back({section, "", "", std::move(comment)});
  };
  if (s.flavour == Flavour::fsdp1)
    note("training",
         "torchtitan shards with FSDP2 (fully_shard); this plan was costed with fsdp1's buffers");
  add("training", "local_batch_size", std::to_string(e.job.micro_batch));
  add("training", "global_batch_size", std::to_string(e.job.global_batch));
  add("training", "seq_len", std::to_string(e.job.seq_len));
  if (s.fp32_gathered) {
    note("training", "mixed_precision_param: torchtitan runs no autocast under FSDP; this plan "
                     "gathers fp32 parameters under autocast (Composer's FULL): use the snippet "
                     "above");
  } else if (p == Precision::bf16_mixed) {
    add("training", "mixed_precision_param", "\"bfloat16\"");
  } else if (p == Precision::fp32) {
    add("training", "mixed_precision_param", "\"float32\"");
  } else if (p == Precision::bf16) {
    add("training", "dtype", "\"bfloat16\"",
        "pure bf16: parameters, gradients and optimizer states");
  } else {
    note("training",
         fmt::format("mixed_precision_param: torchtitan offers \"bfloat16\" (fp32 master) or "
                     "\"float32\"; this {} plan needs the snippet above",
                     precision_name(p)));
  }
  if (fsdp) {
    if (s.reduce_dtype == DType::fp32)
      add("training", "mixed_precision_reduce", "\"float32\"");
    else
      note(
          "training",
          fmt::format("mixed_precision_reduce = \"float32\" is torchtitan's only choice; this plan "
                      "reduces in {} (half the reduce-scatter bytes): use the snippet above, or "
                      "expect twice the gradient traffic",
                      dtype_name(s.reduce_dtype)));
    out.push_back({"training", "enable_cpu_offload",
                   s.offload == Offload::params ? "true" : "false", "", true});
  }
  add("parallelism", "data_parallel_replicate_degree", std::to_string(l.replicate));
  add("parallelism", "data_parallel_shard_degree", std::to_string(l.shard));
  if (fsdp)
    // "default" reshards every block but the last after forward (backward needs it at once),
    // which is what FSDP2 does for the root; "never" is SHARD_GRAD_OP.
    add("parallelism", "fsdp_reshard_after_forward",
        s.reshard_after_forward ? "\"default\"" : "\"never\"");
  // --compile: CompileConfig's default components compile each block and the loss.
  if (e.job.compile) out.push_back({"compile", "enable", "true", "", true});
  return out;
}

// [activation_checkpoint] of torchtitan 0.2.x for the plan's checkpointing.
std::vector<TitanEntry> titan_checkpoint_entries(const TrainingJob& j) {
  const char* section = "activation_checkpoint";
  switch (j.checkpointing) {
  case Checkpointing::none:
    return {{section, "mode", "\"none\"", ""}};
  case Checkpointing::full:
    return {{section, "mode", "\"full\"", ""}};
  case Checkpointing::every:
    return {{section, "mode", "\"selective\"", ""},
            {section, "selective_ac_option", fmt::format("\"{}\"", j.checkpoint_every),
             fmt::format("one block in {} fully checkpointed", j.checkpoint_every)}};
  case Checkpointing::selective_op:
    return {{section, "mode", "\"selective\"", ""},
            {section, "selective_ac_option", "\"op\"",
             "keep attention and every second matmul, recompute the rest"}};
  case Checkpointing::selective_attention:
    return {
        {section, "mode", "\"none\"",
         fmt::format("torchtitan has no attention-only recompute; {}",
                     j.attention == AttentionImpl::flash ? "with flash attention it equals none"
                                                         : "this plan's eager scores are kept")}};
  }
  return {};
}

// Every torchtitan 0.2.x entry of the plan, section by section.
std::vector<TitanEntry> titan_config(const Scenario& sc, const Evaluation& e) {
  auto entries = titan_entries(sc, e);
  for (auto& x : titan_checkpoint_entries(e.job)) entries.push_back(std::move(x));
  return entries;
}

void torchtitan_toml(Text& t, const Scenario& sc, const Evaluation& e) {
  t.line("# ---- torchtitan 0.2.x (0.2.0-0.2.2) job config: TOML for --job.config_file, keys of "
         "torchtitan/config/job_config.py ----");
  std::string section;
  for (const auto& x : titan_config(sc, e)) {
    if (x.section != section) {
      if (!section.empty()) t.line("");
      t.line("[{}]", x.section);
      section = x.section;
    }
    if (x.key.empty())
      t.line("# {}", x.comment);
    else if (x.comment.empty())
      t.line("{} = {}", x.key, x.value);
    else
      t.line("{} = {}  # {}", x.key, x.value, x.comment);
  }
}

// The TOML entries as JSON: {section: {key: value}}, values typed (a quoted literal a string,
// true/false a boolean, else an integer); the comments without a key in "notes".
nlohmann::json torchtitan_json(const Scenario& sc, const Evaluation& e) {
  nlohmann::json out = nlohmann::json::object();
  out["notes"] = nlohmann::json::array();
  for (const auto& x : titan_config(sc, e)) {
    if (x.key.empty()) {
      out["notes"].push_back(x.comment);
      continue;
    }
    nlohmann::json value;
    if (x.value.size() >= 2 && x.value.front() == '"')
      value = x.value.substr(1, x.value.size() - 2);
    else if (x.value == "true" || x.value == "false")
      value = x.value == "true";
    else
      value = std::stoll(x.value);
    out[x.section][x.key] = value;
  }
  return out;
}

// FSDP2's fully_shard keyword arguments as data (the snippet's values): the mesh's shape and
// dimension names, reshard_after_forward, MixedPrecisionPolicy's dtypes (torch dtype names without
// "torch."), the offload policy, and the dtype the whole model is cast to first (pure bf16) or
// null.
nlohmann::json fully_shard_json(const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  const Layout l = layout_of(sc, s);
  auto dtype = [](DType d) { return std::string(torch_dtype(d)).substr(6); };  // "torch." cut
  nlohmann::json mesh =
      l.replicate > 1 ? nlohmann::json{{"shape", {l.replicate, l.shard}},
                                       {"mesh_dim_names", {"dp_replicate", "dp_shard"}}}
                      : nlohmann::json{{"shape", {l.shard}}, {"mesh_dim_names", {"dp_shard"}}};
  const bool offload = s.offload == Offload::params;
  return {{"mesh", mesh},
          {"reshard_after_forward", s.reshard_after_forward},
          {"mp_policy",
           {{"param_dtype", dtype(compute_dtype(e.job.precision))},
            {"reduce_dtype", dtype(s.reduce_dtype)}}},
          {"offload_policy",
           offload ? nlohmann::json{{"type", "CPUOffloadPolicy"}, {"pin_memory", true}}
                   : nlohmann::json{{"type", "OffloadPolicy"}}},
          {"model_dtype",
           e.job.precision == Precision::bf16 ? nlohmann::json("bfloat16") : nlohmann::json()}};
}

// torchtitan 0.3.0: `torchrun ... -m torchtitan.train --module <model> --config <registry entry>`
// then overrides as --section.key value (run_train.sh); booleans are flags (--training.
// enable_cpu_offload / --training.no_enable_cpu_offload), activation checkpointing a subcommand.
// torchtitan 0.3.0's command line for the plan: its options (each as the argv words torchrun
// passes) and the comments about what it cannot say.
struct TitanCommandLine {
  std::vector<std::vector<std::string>> args;  // {"--training.local_batch_size", "1"}, ...
  std::vector<std::string> notes;
};

TitanCommandLine titan_command_line(const Scenario& sc, const Evaluation& e) {
  TitanCommandLine out;
  for (const auto& x : titan_entries(sc, e)) {
    if (x.key.empty()) {
      out.notes.push_back(x.comment);
      continue;
    }
    std::string value = x.value;
    if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
    if (x.boolean)
      out.args.push_back(
          {fmt::format("--{}.{}{}", x.section, value == "true" ? "" : "no_", x.key)});
    else
      out.args.push_back({fmt::format("--{}.{}", x.section, x.key), value});
  }
  const char* ac = "none";
  switch (e.job.checkpointing) {
  case Checkpointing::none:
    break;
  case Checkpointing::full:
    ac = "full";
    break;
  case Checkpointing::selective_op:
    ac = "selective";
    break;
  case Checkpointing::every:
    ac = "full";
    out.notes.push_back(
        fmt::format("every:{}: 0.3.0 has no every-n-th-block option; full checkpoints every block "
                    "(less memory, more recompute than costed)",
                    e.job.checkpoint_every));
    break;
  case Checkpointing::selective_attention:
    out.notes.push_back(fmt::format("torchtitan has no attention-only recompute; {}",
                                    e.job.attention == AttentionImpl::flash
                                        ? "with flash attention it equals none"
                                        : "this plan's eager scores are kept"));
    break;
  }
  out.args.push_back({fmt::format("activation_checkpoint:{}", ac)});
  return out;
}

void torchtitan_command_line(Text& t, const Scenario& sc, const Evaluation& e) {
  t.line("# ---- torchtitan 0.3.0 command line: tyro options of torchtitan/config/configs.py and "
         "trainer.py ----");
  t.line(
      "# --module and --config pick your model's config_registry entry; these options override it");
  const auto cli = titan_command_line(sc, e);
  for (const auto& n : cli.notes) t.line("# {}", n);
  t.line("torchrun --nnodes {} --nproc_per_node {} -m torchtitan.train --module <model> --config "
         "<config> \\",
         sc.cluster.nodes(), std::min(sc.cluster.gpus, sc.cluster.gpus_per_node));
  for (std::size_t i = 0; i < cli.args.size(); ++i)
    t.line("  {}{}", fmt::format("{}", fmt::join(cli.args[i], " ")),
           i + 1 < cli.args.size() ? " \\" : "");
}

// The same as data: {"args": [argv words], "notes": [...]}.
nlohmann::json torchtitan_command_line_json(const Scenario& sc, const Evaluation& e) {
  const auto cli = titan_command_line(sc, e);
  nlohmann::json args = nlohmann::json::array();
  for (const auto& words : cli.args)
    for (const auto& w : words) args.push_back(w);
  return {{"args", args}, {"notes", cli.notes}};
}

}  // namespace

namespace {

// What fsdp_settings and fsdp_settings_json refuse.
void check_fsdp_plan(const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  if (s.flavour == Flavour::deepspeed || s.strategy.rfind("zero", 0) == 0)
    throw InputError("--emit",
                     fmt::format("{} is a DeepSpeed plan; use --emit deepspeed", s.strategy));
  if (s.flavour == Flavour::megatron)
    throw InputError("--emit", fmt::format("{} (megatron) is Megatron-core's engine; use --emit "
                                           "megatron",
                                           s.strategy));
  if (!e.result.valid)
    throw InputError("--emit",
                     fmt::format("the {} plan is not runnable: {}", s.strategy, e.result.reason));
  if (e.job.micro_batch < 1 || e.job.global_batch % (e.job.micro_batch * sc.cluster.gpus) != 0)
    throw InputError("--emit",
                     fmt::format("micro-batch {} does not divide global batch {} over {} GPUs",
                                 e.job.micro_batch, e.job.global_batch, sc.cluster.gpus));
}

}  // namespace

std::string fsdp_settings(const Scenario& sc, const Evaluation& e) {
  check_fsdp_plan(sc, e);
  const auto& s = e.spec;
  const auto& r = e.result;
  Text t;
  for (const auto& needs : plan_requirements(s, e.job)) t.line("# NOTE: {}", needs);
  t.line("# shardplan: {} ({}) for {}", s.strategy, flavour_name(s.flavour), scenario_line(sc));
  t.line(
      "# micro-batch {}, checkpointing {}, offload {}; predicted peak {} of {} usable per GPU{}, "
      "step {}",
      e.job.micro_batch, checkpointing_label(e.job), offload_name(s.offload), gib(r.peak_bytes),
      gib(sc.usable_bytes()), e.fits ? "" : " (DOES NOT FIT)", seconds(r.step_s));
  t.line("");
  switch (s.flavour) {
  case Flavour::fsdp2:
    fsdp2_snippet(t, sc, e);
    break;
  case Flavour::fsdp1:
    fsdp1_snippet(t, sc, e);
    break;
  case Flavour::ddp:
    ddp_snippet(t, sc, e);
    break;
  case Flavour::deepspeed:
  case Flavour::megatron:
    break;  // rejected above
  }
  t.line("");
  if (sc.model.moe.experts > 0) {
    // torchtitan trains its own models; its mixtures of experts run its own MoE code, not the
    // transformers sparse block this plan counts.
    t.line("# torchtitan's options are not written: its mixtures of experts run torchtitan's MoE "
           "code, not the transformers block this plan counts");
    return t.str;
  }
  torchtitan_toml(t, sc, e);
  t.line("");
  torchtitan_command_line(t, sc, e);
  return t.str;
}

nlohmann::json fsdp_settings_json(const Scenario& sc, const Evaluation& e) {
  check_fsdp_plan(sc, e);
  const bool titan = sc.model.moe.experts == 0;  // as fsdp_settings: not for an MoE plan
  nlohmann::json out = {{"strategy", e.spec.strategy},
                        {"flavour", flavour_name(e.spec.flavour)},
                        {"torchtitan", titan ? torchtitan_json(sc, e) : nlohmann::json(nullptr)},
                        {"torchtitan_command_line",
                         titan ? torchtitan_command_line_json(sc, e) : nlohmann::json(nullptr)},
                        {"text", fsdp_settings(sc, e)}};
  if (e.spec.flavour == Flavour::fsdp2) out["fully_shard"] = fully_shard_json(sc, e);
  return out;
}

}  // namespace shardplan::planner
