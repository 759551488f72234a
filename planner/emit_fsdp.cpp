#include "planner/emit_fsdp.hpp"

#include <string>

#include <fmt/format.h>

#include "costmodel/input_error.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using namespace costmodel;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

const char* torch_dtype(DType d) {
  switch (d) {
  case DType::bf16: return "torch.bfloat16";
  case DType::fp16: return "torch.float16";
  case DType::fp32:
  case DType::tf32: return "torch.float32";
  }
  return "torch.float32";
}

const char* py_bool(bool b) {
  return b ? "True" : "False";
}

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

// Activation checkpointing applied to model.layers before the wrapper, one form per mode: full and
// every:N wrap blocks with torch's checkpoint_wrapper (what torchtitan's FullAC and 0.2.x's
// selective_ac_option = "N" do); selective-op applies torchtitan 0.3.0's SelectiveAC
// (torchtitan/distributed/activation_checkpoint.py: keeps the outputs of attention and of every
// second matmul, recomputes the rest).
void checkpointing_lines(Text& t, const TrainingJob& j) {
  switch (j.checkpointing) {
  case Checkpointing::none: return;
  case Checkpointing::selective_attention:
    t.line("# selective-attention (Megatron's selective recompute) reruns the attention core only;");
    t.line("# {}", j.attention == AttentionImpl::flash
                       ? "with flash attention nothing is kept to drop, so no wrapper is needed"
                       : "torch has no wrapper for it: recompute the scores inside the attention module");
    return;
  case Checkpointing::selective_op:
    t.line("from torchtitan.distributed.activation_checkpoint import SelectiveAC  # torchtitan 0.3.0");
    t.line("SelectiveAC(SelectiveAC.Config()).apply(model)  # selective-op: keep attention and every "
           "second matmul, recompute the rest");
    return;
  case Checkpointing::full:
  case Checkpointing::every:
    if (j.recipe != Recipe::torchtitan && j.recipe != Recipe::executor) {
      // transformers 5.23 (modeling_utils.py): layers 0, N, 2N, ... as the plan counted them.
      t.line("model.activation_checkpointing_enable(activation_checkpointing_kwargs={{\"use_reentrant\": False}}, "
             "every_n_layers={})  # transformers; checkpointing {}",
             j.checkpointing == Checkpointing::every ? j.checkpoint_every : 1, checkpointing_label(j));
      return;
    }
    t.line("from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper");
    t.line("for name, block in list(model.layers.named_children()):");
    if (j.checkpointing == Checkpointing::every) {
      t.line("    if (int(name) + 1) % {} == 0:  # every:{}: one block in {} recomputes its forward",
             j.checkpoint_every, j.checkpoint_every, j.checkpoint_every);
      t.line("        model.layers.register_module(name, checkpoint_wrapper(block))");
    } else {
      t.line("    model.layers.register_module(name, checkpoint_wrapper(block))  # full: every block");
    }
    return;
  }
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
  checkpointing_lines(t, e.job);
  t.line("{}", mesh_line(l));
  if (p == Precision::bf16)
    t.line(
        "model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states in bf16");
  t.line("mp_policy = MixedPrecisionPolicy(param_dtype={}, reduce_dtype={})",
         torch_dtype(compute_dtype(p)), torch_dtype(s.reduce_dtype));
  t.line("offload_policy = {}", offload ? "CPUOffloadPolicy(pin_memory=True)  # params, grads and "
                                          "optimizer step on the host"
                                        : "OffloadPolicy()  # no offload");
  const std::string args = fmt::format(
      "mesh=mesh, reshard_after_forward={}, mp_policy=mp_policy, offload_policy=offload_policy",
      py_bool(s.reshard_after_forward));
  t.line("for block in model.layers.children():  # one unit per transformer block");
  t.line("    fully_shard(block, {})", args);
  t.line("fully_shard(model, {})  # root: embeddings and head", args);
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
  t.line("");
  checkpointing_lines(t, e.job);
  t.line("{}", mesh_line(l));
  if (e.job.precision == Precision::bf16)
    t.line(
        "model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states in bf16");
  t.line("model = FSDP(");
  t.line("    model,");
  t.line("    device_mesh=mesh,");
  t.line("    sharding_strategy=ShardingStrategy.{},  # reshard_after_forward={}", strategy,
         py_bool(s.reshard_after_forward));
  t.line("    auto_wrap_policy=ModuleWrapPolicy({{TransformerBlock}}),  # the model's block class");
  t.line("    mixed_precision=MixedPrecision(param_dtype={}, reduce_dtype={}),",
         torch_dtype(compute_dtype(e.job.precision)), torch_dtype(s.reduce_dtype));
  t.line("    cpu_offload=CPUOffload(offload_params={}),", py_bool(offload));
  t.line("    backward_prefetch=BackwardPrefetch.BACKWARD_PRE,");
  t.line("    limit_all_gathers=True,");
  t.line(")");
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
  checkpointing_lines(t, e.job);
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

// torchtitan job config (torchtitan/config/job_config.py; docs: torchtitan/docs/fsdp.md):
// [training] local_batch_size, global_batch_size, seq_len, mixed_precision_param ("bfloat16" |
// "float32"), mixed_precision_reduce ("float32" only), enable_cpu_offload; [parallelism]
// data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward
// ("default" | "always" | "never"); [activation_checkpoint] mode ("none" | "selective" | "full"),
// selective_ac_option ("op" or every n-th layer). Accumulation = global / (local × DP degree).
// These are torchtitan 0.2.x's keys; 0.3.0 takes command-line options and has no layer-level mode.
void torchtitan_toml(Text& t, const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  const Layout l = layout_of(sc, s);
  const bool fsdp = s.shard_optimizer;
  const auto p = e.job.precision;
  t.line("# ---- torchtitan 0.2.x job config (TOML; keys of torchtitan/config/job_config.py) ----");
  if (s.flavour == Flavour::fsdp1)
    t.line(
        "# torchtitan shards with FSDP2 (fully_shard); this plan was costed with fsdp1's buffers");
  t.line("[training]");
  t.line("local_batch_size = {}", e.job.micro_batch);
  t.line("global_batch_size = {}", e.job.global_batch);
  t.line("seq_len = {}", e.job.seq_len);
  if (p == Precision::bf16_mixed)
    t.line("mixed_precision_param = \"bfloat16\"");
  else if (p == Precision::fp32)
    t.line("mixed_precision_param = \"float32\"");
  else
    t.line("# mixed_precision_param: torchtitan offers \"bfloat16\" (fp32 master) or \"float32\"; "
           "this {} plan needs the snippet above",
           precision_name(p));
  if (fsdp) {
    if (s.reduce_dtype == DType::fp32)
      t.line("mixed_precision_reduce = \"float32\"");
    else
      t.line("# mixed_precision_reduce = \"float32\" is torchtitan's only choice; this plan "
             "reduces in "
             "{} (half the reduce-scatter bytes): use the snippet above, or expect twice the "
             "gradient traffic",
             dtype_name(s.reduce_dtype));
    t.line("enable_cpu_offload = {}", s.offload == Offload::params ? "true" : "false");
  }
  t.line("");
  t.line("[parallelism]");
  t.line("data_parallel_replicate_degree = {}", l.replicate);
  t.line("data_parallel_shard_degree = {}", l.shard);
  if (fsdp)
    // "default" reshards every block but the last after forward (backward needs it at once),
    // which is what FSDP2 does for the root; "never" is SHARD_GRAD_OP.
    t.line("fsdp_reshard_after_forward = \"{}\"", s.reshard_after_forward ? "default" : "never");
  t.line("");
  t.line("[activation_checkpoint]");
  switch (e.job.checkpointing) {
  case Checkpointing::none: t.line("mode = \"none\""); break;
  case Checkpointing::full: t.line("mode = \"full\""); break;
  case Checkpointing::every:
    t.line("mode = \"selective\"");
    t.line("selective_ac_option = \"{}\"  # one block in {} fully checkpointed", e.job.checkpoint_every,
           e.job.checkpoint_every);
    break;
  case Checkpointing::selective_op:
    t.line("mode = \"selective\"");
    t.line("selective_ac_option = \"op\"  # keep attention and every second matmul, recompute the rest");
    break;
  case Checkpointing::selective_attention:
    t.line("mode = \"none\"  # torchtitan has no attention-only recompute; {}",
           e.job.attention == AttentionImpl::flash ? "with flash attention it equals none"
                                                   : "this plan's eager scores are kept");
    break;
  }
}

}  // namespace

std::string fsdp_settings(const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  if (s.flavour == Flavour::deepspeed || s.strategy.rfind("zero", 0) == 0)
    throw InputError("--emit",
                     fmt::format("{} is a DeepSpeed plan; use --emit deepspeed", s.strategy));
  if (!e.result.valid)
    throw InputError("--emit",
                     fmt::format("the {} plan is not runnable: {}", s.strategy, e.result.reason));
  if (e.job.micro_batch < 1 || e.job.global_batch % (e.job.micro_batch * sc.cluster.gpus) != 0)
    throw InputError("--emit",
                     fmt::format("micro-batch {} does not divide global batch {} over {} GPUs",
                                 e.job.micro_batch, e.job.global_batch, sc.cluster.gpus));
  const auto& r = e.result;
  Text t;
  t.line("# shardplan: {} ({}) for {}", s.strategy, flavour_name(s.flavour), scenario_line(sc));
  t.line(
      "# micro-batch {}, checkpointing {}, offload {}; predicted peak {} of {} usable per GPU{}, "
      "step {}",
      e.job.micro_batch, checkpointing_label(e.job), offload_name(s.offload),
      gib(r.peak_bytes), gib(sc.usable_bytes()), e.fits ? "" : " (DOES NOT FIT)",
      seconds(r.step_s));
  t.line("");
  switch (s.flavour) {
  case Flavour::fsdp2: fsdp2_snippet(t, sc, e); break;
  case Flavour::fsdp1: fsdp1_snippet(t, sc, e); break;
  case Flavour::ddp: ddp_snippet(t, sc, e); break;
  case Flavour::deepspeed: break;  // rejected above
  }
  t.line("");
  torchtitan_toml(t, sc, e);
  return t.str;
}

}  // namespace shardplan::planner
