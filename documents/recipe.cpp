#include "documents/recipe.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

namespace shardplan::documents {

namespace {

using enum Flavour;

// In the order a strategy picks its engine when none is named (RecipeTraits::flavour_for).
const std::vector<Flavour> kAllFlavours = {ddp, fsdp2, fsdp1, deepspeed};
const std::vector<PipelineSchedule> kAllSchedules = {
    PipelineSchedule::one_f_one_b, PipelineSchedule::interleaved_1f1b, PipelineSchedule::gpipe};

// One row per Recipe, in its order. Each value is what the named code does (the cost model's
// comments cite the source line by line).
// Left whole: one table, a row per recipe; splitting it would scatter the rows.
const std::array<RecipeTraits, kRecipes>& recipes() {
  static const std::array<RecipeTraits, kRecipes> rows = {{
      {
          .recipe = Recipe::hf,
          .name = "hf",
          .description = "transformers' model code",
          .loss = LossImpl::upcast,  // ForCausalLMLoss
          .checkpointing = Checkpointing::none,
          .framework = true,
          .saved = SavedTensors::per_op,
          .rmsnorm = RmsNormCode::upcast,
          .transformers_code = true,
          .fused_qkv_complex_rope = false,
          .linears = BlockLinears::model,
          .checkpoint_early_stop = true,
          .every_n_from_one = false,
          // transformers 5.23's DistributedConfig: tp_size runs the model's tp_plan; its
          // enable_sequence_parallel is "reserved ... not wired up yet"; its pp_size splits the
          // blocks for a forward that sends the hidden states on outside autograd
          // (distributed/pipeline_parallel.py, "naive"), a generation path the Trainer does not
          // train through; the Trainer's context parallelism is accelerate's ParallelismConfig
          // cp_size, torch's context_parallel (trainer.py, _prepare_context_parallel_inputs).
          .offers_tensor_parallel = true,
          .offers_sequence_parallel = false,
          .offers_context_parallel = true,
          .tensor_parallel = TensorParallelCode::torch_styles,  // the model's tp_plan
          .tp_embedding = TpEmbedding::unplanned,
          .tp_loss = TpLoss::gathered,  // lm_head "colwise_rep"
          .async_tp = AsyncTp::none,    // transformers' tp_plan runs eager DTensor collectives
          .pipeline = PipelineRunner::none,
          .schedules = {},
          .pipeline_less_layers = 0,
          .pipeline_even_split = false,
          .fsdp2_groups =
              Fsdp2Groups::ends,  // accelerate 1.16 fsdp2_prepare_model (utils/fsdp_utils.py)
          .runs_mpt = false,
          .ring = RingCode::torch_all_gather,  // torch's context_parallel over sdpa
          .flavours = kAllFlavours,
          .offers_every_n = true,
          .offers_selective_op = false,
          .offers_selective_attention = true,
          .compiles_blocks = false,
          .offers_float8 = false,
          .reduces_in_fp32_only = false,
          // accelerate's FullyShardedDataParallelPlugin.set_mixed_precision (1.x): param_dtype and
          // reduce_dtype the mixed precision's dtype; Accelerator.prepare_model wraps the forward
          // in autocast (native_amp), and a mixed_precision_policy of "fp32" or a dict sets FULL.
          .fsdp1_backward_prefetch = false,
          .fsdp_mixed_precision = FsdpMixedPrecision::pure,
          .autocast_with_fsdp = true,
          // Its layouts are accelerate's ParallelismConfig (and transformers' DistributedConfig),
          // which no emitter writes yet.
          .layout_emit = "",
          .blocks_at = "",
          .block_class = "",
      },
      {
          .recipe = Recipe::torchtitan,
          .name = "torchtitan",
          .description = "torchtitan's Llama",
          .loss = LossImpl::upcast,  // cross_entropy_loss
          // torchtitan 0.3.0's Trainer defaults to its op-level SelectiveAC (torchtitan/trainer.py)
          .checkpointing = Checkpointing::selective_op,
          .framework = true,
          .saved = SavedTensors::per_op,
          .rmsnorm = RmsNormCode::torch,
          .transformers_code = false,
          .fused_qkv_complex_rope = true,
          .linears = BlockLinears::torchtitan,
          .checkpoint_early_stop = false,
          .every_n_from_one = true,
          .offers_tensor_parallel = true,
          .offers_sequence_parallel = true,
          .offers_context_parallel = true,
          .tensor_parallel = TensorParallelCode::torch_styles,  // its parallelize's apply_tp
          .tp_embedding = TpEmbedding::rowwise,
          .tp_loss = TpLoss::loss_parallel,
          .async_tp = AsyncTp::symmetric_memory,
          .pipeline = PipelineRunner::torch_pipelining,
          .schedules = kAllSchedules,  // pipeline_parallel_schedule: 1F1B, Interleaved1F1B, GPipe
          .pipeline_less_layers = 1,
          .pipeline_even_split = false,
          .fsdp2_groups = Fsdp2Groups::ends,  // torchtitan/distributed/fsdp.py, apply_fsdp
          .runs_mpt = false,
          .ring = RingCode::torch_all_gather,
          .flavours = {fsdp2, ddp},
          .offers_every_n = true,
          .offers_selective_op = true,
          .offers_selective_attention = true,
          .compiles_blocks = true,  // torchtitan/distributed/compile.py, apply_compile
          .offers_float8 = true,    // components/quantization/float8.py, Float8LinearConverter
          .reduces_in_fp32_only = true,
          // MixedPrecisionPolicy(mixed_precision_param, mixed_precision_reduce): bfloat16 and
          // float32 by default, float32 the only reduction; autocast only without FSDP, under DDP
          // or on one device (0.3.0's torchtitan/config/configs.py, mixed_precision_param).
          .fsdp1_backward_prefetch = true,
          .fsdp_mixed_precision = FsdpMixedPrecision::default_mode,
          .autocast_with_fsdp = false,
          // (torchtitan/models/common/decoder.py, torchtitan/models/llama3/model.py)
          .layout_emit = "torchtitan",
          .blocks_at = "model.layers",
          .block_class = "torchtitan.models.llama3.model:Llama3TransformerBlock",
      },
      {
          .recipe = Recipe::llm_foundry,
          .name = "llm-foundry",
          .description = "its MPT (an MPT config.json) or transformers' block (hf_causal_lm), "
                         "flash-attn's cross-entropy by default",
          .loss = LossImpl::fused,  // loss_fn: fused_crossentropy (flash-attn)
          .checkpointing = Checkpointing::none,
          .framework = true,
          .saved = SavedTensors::per_op,
          .rmsnorm = RmsNormCode::upcast,
          .transformers_code = true,  // its hf_causal_lm wraps transformers' model
          .fused_qkv_complex_rope = false,
          .linears = BlockLinears::model,
          .checkpoint_early_stop = true,
          .every_n_from_one = false,
          // llm-foundry 0.22.0 hands Composer a parallelism_config of fsdp and tp only
          // (command_utils/train.py): no pipeline, no context parallelism; its one tp_config
          // strategy, "ffn" (llmfoundry/tp/ffn_tp_strategy.py), splits only the MLP's up and
          // down projections over inputs gathered along the batch, which no table here counts.
          .offers_tensor_parallel = false,
          .offers_sequence_parallel = false,
          .offers_context_parallel = false,
          .tensor_parallel = TensorParallelCode::megatron_core,
          .tp_embedding = TpEmbedding::unplanned,
          .tp_loss = TpLoss::gathered,
          .async_tp = AsyncTp::none,
          .pipeline = PipelineRunner::none,
          .schedules = {},
          .pipeline_less_layers = 0,
          .pipeline_even_split = false,
          .fsdp2_groups = Fsdp2Groups::root,
          .runs_mpt = true,
          .ring = RingCode::none,
          .flavours = kAllFlavours,
          .offers_every_n = true,
          .offers_selective_op = false,
          .offers_selective_attention = true,
          .compiles_blocks = false,
          .offers_float8 = false,
          .reduces_in_fp32_only = false,
          // Composer's fsdp_config.mixed_precision, DEFAULT unless set
          // (composer/distributed/mosaic_parallelism.py, get_mixed_precision), under Composer's
          // autocast for amp_bf16 / amp_fp16 (composer/core/precision.py, get_precision_context).
          .fsdp1_backward_prefetch = true,
          .fsdp_mixed_precision = FsdpMixedPrecision::default_mode,
          .autocast_with_fsdp = true,
          .layout_emit = "",
          .blocks_at = "",
          .block_class = "",
      },
      {
          .recipe = Recipe::megatron,
          .name = "megatron",
          .description = "Megatron-core's GPT, Korthikanti et al.'s tensors",
          .loss = LossImpl::fp32_inplace,
          .checkpointing = Checkpointing::none,
          .framework = true,
          .saved = SavedTensors::korthikanti,
          .rmsnorm = RmsNormCode::fused,
          .transformers_code = false,
          .fused_qkv_complex_rope = false,
          .linears = BlockLinears::megatron_core,
          .checkpoint_early_stop = true,
          .every_n_from_one = false,
          .offers_tensor_parallel = true,
          .offers_sequence_parallel = true,
          .offers_context_parallel = true,
          .tensor_parallel = TensorParallelCode::megatron_core,
          .tp_embedding = TpEmbedding::unplanned,
          .tp_loss = TpLoss::gathered,
          .async_tp = AsyncTp::userbuffers,  // --tp-comm-overlap
          .pipeline = PipelineRunner::megatron,
          .schedules = {PipelineSchedule::one_f_one_b, PipelineSchedule::interleaved_1f1b},
          .pipeline_less_layers = 0,
          .pipeline_even_split = true,  // get_num_layers_to_build
          .fsdp2_groups = Fsdp2Groups::root,
          .runs_mpt = false,
          .ring = RingCode::te_p2p,
          .flavours = {megatron, fsdp2, deepspeed},  // its DDP and distributed optimizer first;
                                                     // --use-torch-fsdp2; Megatron-DeepSpeed's ZeRO
          .offers_every_n = false,                   // --recompute-granularity full or selective
          .offers_selective_op = false,
          .offers_selective_attention = true,
          .compiles_blocks = false,
          .offers_float8 = false,
          .reduces_in_fp32_only = false,
          // --use-torch-fsdp2: its MixedPrecisionPolicy of the training dtype, no autocast.
          .fsdp1_backward_prefetch = true,
          .fsdp_mixed_precision = FsdpMixedPrecision::pure,
          .autocast_with_fsdp = false,
          .layout_emit = "megatron",
          .blocks_at = "",
          .block_class = "",
      },
      {
          .recipe = Recipe::deepspeed,
          .name = "deepspeed",
          .description = "a transformers model under the DeepSpeed engine",
          .loss = LossImpl::upcast,
          .checkpointing = Checkpointing::none,
          .framework = true,
          .saved = SavedTensors::per_op,
          .rmsnorm = RmsNormCode::upcast,
          .transformers_code = true,
          .fused_qkv_complex_rope = false,
          .linears = BlockLinears::model,
          .checkpoint_early_stop = true,
          .every_n_from_one = false,
          // DeepSpeed 0.19.8: AutoTP's column and row linears (tensor_parallel.autotp_size;
          // module_inject/layers.py) keep the residual stream whole on every rank; its sequence
          // parallelism is Ulysses' all-to-all over heads (deepspeed/sequence/layer.py), neither
          // Megatron's token split nor a ring.
          .offers_tensor_parallel = true,
          .offers_sequence_parallel = false,
          .offers_context_parallel = false,
          .tensor_parallel = TensorParallelCode::megatron_core,
          .tp_embedding = TpEmbedding::unplanned,
          .tp_loss = TpLoss::gathered,
          .async_tp = AsyncTp::none,  // AutoTP
          .pipeline = PipelineRunner::deepspeed,
          .schedules = {PipelineSchedule::one_f_one_b},  // TrainSchedule only
          .pipeline_less_layers = 0,
          .pipeline_even_split = false,
          .fsdp2_groups = Fsdp2Groups::root,
          .runs_mpt = false,
          .ring = RingCode::none,
          .flavours = {deepspeed},
          .offers_every_n = true,
          .offers_selective_op = false,
          .offers_selective_attention = true,
          .compiles_blocks = false,
          .offers_float8 = false,
          .reduces_in_fp32_only = false,
          .fsdp1_backward_prefetch = true,
          .fsdp_mixed_precision = FsdpMixedPrecision::pure,
          .autocast_with_fsdp = false,
          .layout_emit = "deepspeed",
          .blocks_at = "",
          .block_class = "",
      },
      {
          .recipe = Recipe::executor,
          .name = "executor",
          .description = "this project's executor",
          .loss = LossImpl::upcast,
          .checkpointing = Checkpointing::none,
          .framework = false,
          .saved = SavedTensors::korthikanti,
          .rmsnorm = RmsNormCode::upcast,
          .transformers_code = false,
          .fused_qkv_complex_rope = false,
          .linears = BlockLinears::model,
          .checkpoint_early_stop = true,
          .every_n_from_one = false,
          .offers_tensor_parallel = true,
          .offers_sequence_parallel = true,
          .offers_context_parallel = true,
          .tensor_parallel = TensorParallelCode::megatron_core,
          .tp_embedding = TpEmbedding::unplanned,
          .tp_loss = TpLoss::gathered,
          .async_tp = AsyncTp::none,
          .pipeline = PipelineRunner::executor,
          .schedules = kAllSchedules,  // executor/pipeline.cpp
          .pipeline_less_layers = 0,
          .pipeline_even_split = false,
          .fsdp2_groups = Fsdp2Groups::root,
          .runs_mpt = false,
          .ring = RingCode::executor,
          .flavours = kAllFlavours,
          .offers_every_n = false,  // it checkpoints every block or none
          .offers_selective_op = false,
          .offers_selective_attention = false,
          .compiles_blocks = false,
          .offers_float8 = false,
          .reduces_in_fp32_only = false,
          .fsdp1_backward_prefetch = true,
          .fsdp_mixed_precision = FsdpMixedPrecision::pure,  // its own engine gathers 16-bit
          .autocast_with_fsdp = false,
          .layout_emit = "",
          .blocks_at = "",
          .block_class = "",
      },
  }};
  return rows;
}

}  // namespace

bool RecipeTraits::runs_under(Flavour f) const {
  return std::find(flavours.begin(), flavours.end(), f) != flavours.end();
}

Flavour RecipeTraits::flavour_for(const std::string& strategy) const {
  for (Flavour f : flavours) {
    const auto implements = flavours_for(strategy);
    if (std::find(implements.begin(), implements.end(), f) != implements.end()) return f;
  }
  return default_flavour(strategy);
}

std::string RecipeTraits::flavour_list() const {
  std::vector<std::string> names;
  names.reserve(flavours.size());
  for (auto f : flavours) names.emplace_back(flavour_name(f));
  return fmt::format("{}", fmt::join(names, " or "));
}

std::string RecipeTraits::model_parallel_dimensions() const {
  std::vector<std::string> dims;
  if (offers_tensor_parallel) dims.emplace_back("tensor");
  if (!schedules.empty()) dims.emplace_back("pipeline");
  if (offers_context_parallel) dims.emplace_back("context");
  if (dims.empty()) return "";
  const std::string last = dims.back();
  dims.pop_back();
  return dims.empty() ? last + " parallelism"
                      : fmt::format("{} and {} parallelism", fmt::join(dims, ", "), last);
}

const RecipeTraits& recipe_traits(Recipe r) { return recipes()[static_cast<std::size_t>(r)]; }

}  // namespace shardplan::documents
