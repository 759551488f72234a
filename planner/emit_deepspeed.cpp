#include "planner/emit_deepspeed.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "core/whole_count.hpp"
#include "planner/loss_requirement.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;
using namespace core;

namespace {

nlohmann::json elements(double bytes, DType dtype) {
  return count_json(bytes / dtype_bytes(dtype));
}

int zero_stage(const ShardingSpec& s) {
  if (s.flavour != Flavour::deepspeed && s.strategy.rfind("zero", 0) != 0 && s.strategy != "ddp")
    throw InputError("--emit",
                     fmt::format("{} is a PyTorch FSDP plan; use --emit fsdp", s.strategy));
  if (s.flavour != Flavour::deepspeed)
    throw InputError("--emit", fmt::format("the {} plan runs {}, not DeepSpeed's engine; plan it "
                                           "with --flavour deepspeed (stage 0 for ddp)",
                                           s.strategy, flavour_name(s.flavour)));
  if (s.strategy == "ddp") return 0;
  if (s.strategy == "zero1") return 1;
  if (s.strategy == "zero2") return 2;
  if (s.strategy == "zero3") return 3;
  throw InputError("--emit", fmt::format("{} is a PyTorch FSDP plan; use --emit fsdp", s.strategy));
}

// "fp16" section (deepspeed/runtime/precision_config.py, DeepSpeedFP16Config): loss_scale 0 means
// dynamic loss scaling, starting at 2^initial_scale_power; the other values are DeepSpeed's
// defaults, written out so the user sees what runs.
nlohmann::json fp16_section(bool enabled) {
  if (!enabled) return {{"enabled", false}};
  return {{"enabled", true},           {"loss_scale", 0}, {"initial_scale_power", 16},
          {"loss_scale_window", 1000}, {"hysteresis", 2}, {"min_loss_scale", 1}};
}

// "bf16" section (DeepSpeedBF16Config): pure bf16 keeps master weights, gradients and optimizer
// states in bf16 (bf16_master_weights_and_grads + bf16_optimizer_states, ZeRO stages 1-3 only).
nlohmann::json bf16_section(Precision p) {
  nlohmann::json out = {{"enabled", p == Precision::bf16_mixed || p == Precision::bf16}};
  if (p == Precision::bf16) {
    out["bf16_master_weights_and_grads"] = true;
    out["bf16_optimizer_states"] = true;
  }
  return out;
}

// "zero_optimization" (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig). Bucket sizes are
// element counts: the reduce bucket holds gradients in the communication dtype, the all-gather
// bucket holds parameters in the compute dtype.
// "optimizer" (config.py, {"type", "params"}): DeepSpeed's FusedAdam for an Adam plan that
// assumes it (ShardingSpec::torch_optimizer false), built by the engine from the section
// (engine.py, _configure_basic_optimizer; DeepSpeedCPUAdam under offload_optimizer); null where
// the training script passes its own.
nlohmann::json optimizer_section(const Evaluation& e) {
  const bool adam = e.job.optimizer == Optimizer::adam || e.job.optimizer == Optimizer::adamw;
  if (!adam || e.spec.torch_optimizer) return nullptr;
  return {{"type", e.job.optimizer == Optimizer::adamw ? "AdamW" : "Adam"}};
}

nlohmann::json zero_section(const Scenario& sc, const Evaluation& e, int stage) {
  const auto& s = e.spec;
  nlohmann::json z = {{"stage", stage}};
  if (stage == 0) return z;
  z["contiguous_gradients"] = s.contiguous_grad_bucket;
  // DeepSpeed's default, which is what the plan's timeline assumes: the reduction overlaps the
  // backward at stage 3 only (zero/config.py, overlap_comm_valid); one reduce bucket either way.
  z["overlap_comm"] = stage == 3;
  z["reduce_scatter"] = true;
  // Stages 1/2: how the plan's gradient traffic was counted (an all-reduce of each bucket, or one
  // reduce per rank's partition).
  if (stage < 3) z["use_multi_rank_bucket_allreduce"] = s.all_reduce_partitions;
  z["reduce_bucket_size"] = elements(s.reduce_bucket_bytes, s.reduce_dtype);
  if (stage < 3) {
    z["allgather_partitions"] = true;
    z["allgather_bucket_size"] = elements(s.allgather_bucket_bytes, compute_dtype(e.job.precision));
  } else {
    z["stage3_prefetch_bucket_size"] = count_json(s.prefetch_bucket_elems);
    z["stage3_param_persistence_threshold"] = s.persistence_threshold;
    // DeepSpeed's default (1e9) does not bind for one block of a dense model; a plan limited to
    // fewer gathered units says so in parameters.
    const auto block = sc.model.block.params();
    z["stage3_max_live_parameters"] = s.max_inflight_allgathers >= 2
                                          ? std::int64_t{1'000'000'000}
                                          : s.max_inflight_allgathers * block;
  }
  // offload_optimizer / offload_param (zero/offload_config.py): device cpu, pinned host memory
  // so the host-link transfers run at full rate.
  const nlohmann::json cpu = {{"device", "cpu"}, {"pin_memory", true}};
  if (s.offload != Offload::none) z["offload_optimizer"] = cpu;
  if (s.offload == Offload::params) z["offload_param"] = cpu;
  return z;
}

std::string comment_for(const Scenario& sc, const Evaluation& e) {
  const auto& r = e.result;
  // What the plan asks of the training code comes first.
  const std::string needs = loss_requirement(e.job);
  std::string c = needs.empty() ? "" : "NOTE: " + needs + ". ";
  c += fmt::format(
      "shardplan plan for {}: {} ({}), micro-batch {}, checkpointing {}, offload {}; predicted "
      "peak "
      "{} of {} usable per GPU{}, step {}.",
      scenario_line(sc), e.spec.strategy, flavour_name(e.spec.flavour), e.job.micro_batch,
      checkpointing_label(e.job), offload_name(e.spec.offload), gib(r.peak_bytes),
      gib(sc.usable_bytes()), e.fits ? "" : " (DOES NOT FIT)", seconds(r.step_s));
  switch (e.job.checkpointing) {
  case Checkpointing::none:
    break;
  case Checkpointing::full:
    c += " Activation checkpointing is switched on in the model, not by this file: Hugging Face "
         "models with model.gradient_checkpointing_enable() (or TrainingArguments("
         "gradient_checkpointing=True)); the activation_checkpointing section configures "
         "deepspeed.checkpointing for models that call it (Megatron-DeepSpeed).";
    break;
  case Checkpointing::every:
    c += fmt::format(" Checkpointing one block in {} is switched on in the model, not by this "
                     "file (wrap those blocks with torch.utils.checkpoint or "
                     "deepspeed.checkpointing.checkpoint).",
                     e.job.checkpoint_every);
    break;
  case Checkpointing::selective_attention:
    c += " Selective activation checkpointing (the attention core recomputed) has no DeepSpeed "
         "switch: enable it in the model (e.g. Megatron --recompute-granularity selective).";
    break;
  case Checkpointing::selective_op:
    c += " Op-level selective checkpointing has no DeepSpeed switch: apply it in the model "
         "(torch.utils.checkpoint with create_selective_checkpoint_contexts, as torchtitan's "
         "SelectiveAC).";
    break;
  }
  if (optimizer_section(e).is_null())
    c += fmt::format(" No optimizer section: DeepSpeed uses the optimizer the training script "
                     "passes ({}{}), so the learning rate stays the script's.",
                     e.spec.torch_optimizer ? "torch.optim's " : "",
                     optimizer_name(e.job.optimizer));
  else
    c += fmt::format(" The optimizer section makes DeepSpeed build its FusedAdam, whose in-place "
                     "step the plan assumes (a torch.optim {} passed by the script writes an "
                     "intermediate per tensor{}): put the training's lr, betas and weight_decay "
                     "in its params, else FusedAdam's defaults apply (lr 1e-3, weight_decay 0).",
                     optimizer_name(e.job.optimizer),
                     zero_stage(e.spec) == 0 && e.job.precision == Precision::bf16_mixed
                         ? ", and bf16 at stage 0 then keeps an fp32 master per parameter"
                         : "");
  if (e.spec.offload != Offload::none)
    c += optimizer_section(e).is_null()
             ? " With offload_optimizer, pass deepspeed.ops.adam.DeepSpeedCPUAdam (DeepSpeed "
               "refuses other client optimizers under ZeRO-Offload unless "
               "zero_force_ds_cpu_optimizer is false)."
             : " With offload_optimizer, DeepSpeed builds DeepSpeedCPUAdam from the section.";
  return c;
}

}  // namespace

nlohmann::json deepspeed_config(const Scenario& sc, const Evaluation& e) {
  const int stage = zero_stage(e.spec);
  if (!e.result.valid)
    throw InputError(
        "--emit", fmt::format("the {} plan is not runnable: {}", e.spec.strategy, e.result.reason));
  const auto& job = e.job;
  if (job.micro_batch < 1 || job.global_batch % (job.micro_batch * sc.cluster.gpus) != 0)
    throw InputError("--emit",
                     fmt::format("micro-batch {} does not divide global batch {} over {} GPUs",
                                 job.micro_batch, job.global_batch, sc.cluster.gpus));
  if (job.precision == Precision::bf16 && stage == 0)
    throw InputError("--emit",
                     "pure bf16 (bf16_master_weights_and_grads) needs ZeRO stage 1, 2 or 3 "
                     "in DeepSpeed; plan zero1 or use --precision bf16-mixed");

  nlohmann::json ds;
  ds["comment"] = comment_for(sc, e);
  // Batch keys (deepspeed/runtime/config.py, _configure_train_batch_size): DeepSpeed checks
  // train_batch_size = micro × accumulation × data-parallel ranks.
  ds["train_batch_size"] = job.global_batch;
  ds["train_micro_batch_size_per_gpu"] = job.micro_batch;
  ds["gradient_accumulation_steps"] = job.global_batch / (job.micro_batch * sc.cluster.gpus);
  // A training hyperparameter, not part of the plan: 1.0, the usual value (and torchtitan's
  // training.max_norm default). One norm reduction per step either way.
  ds["gradient_clipping"] = 1.0;
  ds["bf16"] = bf16_section(job.precision);
  ds["fp16"] = fp16_section(job.precision == Precision::fp16_mixed);
  // Top-level "communication_data_type" (fp32 | fp16 | bf16): the dtype gradients are reduced in,
  // stated explicitly because the plan's communication volume depends on it.
  ds["communication_data_type"] = dtype_name(e.spec.reduce_dtype);
  ds["zero_optimization"] = zero_section(sc, e, stage);
  if (auto o = optimizer_section(e); !o.is_null()) ds["optimizer"] = std::move(o);
  // data_types.grad_accum_dtype (config.py): the plan's BF16_Optimizer accumulation dtype.
  if (e.spec.grad_accum_dtype)
    ds["data_types"] = {{"grad_accum_dtype", dtype_name(*e.spec.grad_accum_dtype)}};
  if (job.checkpointing == Checkpointing::full || job.checkpointing == Checkpointing::every)
    // deepspeed/runtime/activation_checkpointing/config.py: everything off except what the
    // plan assumes (block inputs kept on the GPU, nothing partitioned: no tensor parallelism).
    ds["activation_checkpointing"] = {{"partition_activations", false},
                                      {"cpu_checkpointing", false},
                                      {"contiguous_memory_optimization", false},
                                      {"synchronize_checkpoint_boundary", false}};
  ds["steps_per_print"] = 100;
  ds["wall_clock_breakdown"] = false;
  return ds;
}

}  // namespace shardplan::planner
