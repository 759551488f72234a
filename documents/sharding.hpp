// ShardingSpec: one point in the space that DDP, ZeRO-1/2/3, FSDP's strategies and HSDP all live
// in: a strategy is a configuration of what is sharded and how it is scheduled. The cost model and
// the executor take this one struct; a named strategy is only a preset of it, and a framework
// flavour fills in its defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "documents/hardware.hpp"
#include "documents/job.hpp"

namespace shardplan::documents {

enum class Flavour { ddp, fsdp1, fsdp2, deepspeed, megatron };
enum class Offload { none, optimizer, params };  // params implies optimizer too

const char* flavour_name(Flavour f);
Flavour flavour_from_name(const std::string& s, const std::string& where);
const char* offload_name(Offload o);
Offload offload_from_name(const std::string& s, const std::string& where);
const std::vector<std::string>&
strategy_names();  // ddp zero1 zero2 zero3 fsdp-full fsdp-grad-op hsdp
// "none": one GPU without a data-parallel wrapper. Not searched nor written into plans (the
// strategies above are); estimate and compare take it for a job that runs on one GPU.
inline constexpr const char* kNoWrapper = "none";
bool is_strategy(const std::string& s);  // one of strategy_names() or kNoWrapper
const std::vector<std::string>& flavour_names();
const std::vector<std::string>& offload_names();

struct ShardingSpec {
  std::string strategy = "ddp";  // the preset it came from (for display and emitted configs)
  Flavour flavour = Flavour::ddp;

  // What is sharded over the shard group (the rest is replicated).
  bool shard_optimizer = false;
  bool shard_gradients = false;
  bool shard_parameters = false;
  int shard_group_size = 0;            // ranks sharing one copy of the sharded state; 0 = all ranks
                                       // (HSDP: the ranks of a node; replicas are all-reduced)
  bool reshard_after_forward = false;  // free gathered parameters after a unit's forward
  bool keep_root_unsharded = false;    // FSDP1: the root unit (embeddings, head) stays gathered
  // FSDP (1 and 2) as transformers, accelerate and torchtitan wrap a model: each block its own
  // unit, the root module the rest, so the embeddings, final norm and head are one unit gathered
  // at the start of forward and not resharded before backward (FSDP2 sets the root's
  // reshard_after_forward to False); its gradients are reduced after the embeddings' backward.
  // Follows from the flavour; not part of the plan document.
  bool root_unit = false;
  // FSDP2's foreach_reduce copies a unit's unsharded gradients into one flat reduce-scatter input
  // in the reduce dtype and frees them; the input lives until the reduce-scatter is done.
  // Follows from the flavour; not part of the plan document.
  bool reduce_copy_in = false;

  // Scheduling knobs (units are one transformer block; embeddings and head are units too).
  int forward_prefetch = 1;          // units whose all-gather is issued ahead of their forward
  int backward_prefetch = 1;         // same in backward
  int max_inflight_allgathers = 2;   // gathered units issued ahead of use at once (rate limiter)
  double prefetch_bucket_elems = 0;  // DeepSpeed: prefetch ahead up to this many elements
                                     // (at least one unit); 0 = forward_prefetch units
  double reduce_bucket_bytes = 0;    // gradient bucket; 0 = one bucket per unit
  // ZeRO-1/2 as DeepSpeed runs them: each gradient bucket is all-reduced whole and every rank
  // keeps its partition of the sum (use_multi_rank_bucket_allreduce, default true, and
  // reduce_scatter false), where false reduce-scatters it. DeepSpeed's stages 1/2 by default.
  bool all_reduce_partitions = false;
  double allgather_bucket_bytes = 0;       // post-step parameter all-gather bucket (ZeRO-1/2)
  DType reduce_dtype = DType::bf16;        // dtype gradients are reduced in
  std::int64_t persistence_threshold = 0;  // tensors with fewer elements stay unsharded (ZeRO-3)
  // DeepSpeed ZeRO-3's stage3_max_reuse_distance: a gathered unit is not released when the
  // parameters used before its next use number fewer elements than this (0: always released).
  // Follows from the flavour (or the imported config); not part of the plan document.
  double reuse_distance_elems = 0;
  Offload offload = Offload::none;

  // Flavour details the memory accounting needs.
  bool fp32_sharded_params = false;     // FSDP: the sharded parameter is fp32, cast at all-gather
  bool separate_fp32_master = false;    // DeepSpeed: bf16 partition plus an fp32 master partition
  bool contiguous_grad_bucket = false;  // DeepSpeed: one preallocated reduce bucket
  bool flat_grad_partition = false;     // DeepSpeed ZeRO-3: a flat fp32 gradient partition buffer
  bool grad_bucket_copy = false;        // torch DDP without gradient_as_bucket_view: grads copied
                                        // into all-reduce buckets (a second gradient copy)
  // FSDP under a 16-bit job with MixedPrecision's param_dtype left unset (Composer's FULL): the
  // units are gathered, and their gradients computed, in the fp32 of the sharded parameters, and
  // autocast casts each weight at its op (the cast kept for backward, as under DDP's autocast).
  bool fp32_gathered = false;
  // Megatron-core's DistributedDataParallel (megatron/core/distributed/param_and_grad_buffer.py):
  // every parameter's main gradient is a view of one contiguous buffer of the reduce dtype,
  // allocated with the model and kept (zeroed between steps, never freed); the backward adds into
  // it and the buffer is all-reduced (DDP) or reduce-scattered (the distributed optimizer) in
  // place, once after the backward (reduce_bucket_bytes 0, Megatron-LM's default) or bucket by
  // bucket beside it (--overlap-grad-reduce). Follows from the flavour; not part of the plan
  // document.
  bool main_grad_buffer = false;
  // DeepSpeed's stage-0 engine (deepspeed/runtime/engine.py, allreduce_gradients ->
  // buffered_allreduce_fallback -> allreduce_no_retain): once the backward is done, the
  // gradients are taken in order into runs of just over reduce_bucket_bytes, and each run is
  // flattened into a new tensor, all-reduced and copied back, the copy freed before the next
  // run. Follows from the flavour; not part of the plan document.
  bool flatten_to_reduce = false;
  // DeepSpeed: the optimizer is a torch.optim one the training script passes to
  // deepspeed.initialize, not DeepSpeed's FusedAdam (which it builds from a config's "optimizer"
  // section, or the script passes): its foreach step writes an intermediate, and under bf16 at
  // stage 0 the engine wraps it in FP16_UnfusedOptimizer (an fp32 master per parameter,
  // deepspeed/runtime/fp16/unfused_optimizer.py) instead of FP16_Optimizer (one flat fp32
  // master, fused_optimizer.py; engine.py _configure_fp16_optimizer).
  bool torch_optimizer = false;
  // DeepSpeed's data_types.grad_accum_dtype (engine.py, get_data_types): the dtype its
  // BF16_Optimizer accumulates gradients in; none, the model's. A bf16 job at ZeRO stage 1 with
  // fp32 accumulation runs BF16_Optimizer instead of ZeRO's optimizer (runs_bf16_optimizer).
  std::optional<DType> grad_accum_dtype;
  // The backward keeps the low-precision .grad beside a main-gradient buffer it is added into
  // (BF16_Optimizer without immediate_grad_update, its default: update_hp_grads copies them in at
  // the backward's end and they stay to zero_grad). Follows from the engine; not part of the plan
  // document.
  bool low_grads_kept = false;

  // Shard count for a group of n ranks.
  int group(int world) const { return shard_group_size > 0 ? shard_group_size : world; }
};

// The preset for a strategy with a flavour (nullopt: the strategy's default flavour), for a
// cluster of `gpus_per_node` GPUs (HSDP's default shard group). Throws InputError for unknown
// names or a combination the frameworks do not have (ddp with deepspeed, zero3 with fsdp2, ...).
ShardingSpec make_spec(const std::string& strategy, std::optional<Flavour> flavour,
                       int gpus_per_node, std::optional<int> shard_group_size = std::nullopt);
Flavour default_flavour(const std::string& strategy);
// Flavours that implement a strategy (ddp: ddp, megatron, deepspeed (its ZeRO stage 0); zero1:
// deepspeed, megatron; zero2/3: deepspeed; fsdp-*/hsdp: fsdp2, fsdp1).
std::vector<Flavour> flavours_for(const std::string& strategy);

// The plan's Adam updates every tensor in place: DeepSpeed's FusedAdam (unless the script passes
// a torch.optim one: torch_optimizer), and Megatron-core's (Transformer Engine's or
// Apex's FusedAdam, megatron/core/optimizer/__init__.py); torch.optim's foreach Adam writes an
// intermediate per tensor (costmodel's optimizer step).
bool fused_adam(const ShardingSpec& s);

// The gradients are reduced once the (last micro-batch's) backward is done, not bucket by bucket
// beside it: DeepSpeed's stages 0 and 1 (engine.py allreduce_gradients; stage_1_and_2.py,
// reduce_gradients at the accumulation boundary) and Megatron-core's DDP without
// overlap_grad_reduce (finish_grad_sync).
bool reduces_after_backward(const ShardingSpec& s);

// Whether DeepSpeed's engine runs BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py) for the
// plan (engine.py, _do_optimizer_sanity_check): a bf16 job at ZeRO stage 1 with fp32 gradient
// accumulation and no offload, or at stage 0 under its pipeline engine (bf16 accumulation).
bool runs_bf16_optimizer(const ShardingSpec& s, Precision p, bool pipeline);
// BF16_Optimizer in the spec's terms: its flat accumulation buffer (fp32_groups_gradients_flat,
// grad_accum_dtype, allocated at initialize and kept) as a main-gradient buffer all-reduced whole
// once after the backward (buffered_allreduce_fallback on the one flat tensor: no copy, but a
// cast one where the communication dtype, reduce_dtype, is another), the
// low-precision .grad kept beside it, the fp32 master and moments partitioned over the
// data-parallel ranks as ZeRO-1's, and the updated bf16 partitions all-gathered after the step
// (update_lp_params).
ShardingSpec as_bf16_optimizer(ShardingSpec s);
// Megatron-core's DDP with --overlap-grad-reduce over `data_ranks` data- and context-parallel
// ranks: the main-gradient buffer reduced bucket by bucket beside the backward, each bucket its
// default size. A Megatron plan with reduce_bucket_bytes > 0 is one with the overlap.
ShardingSpec with_overlap_grad_reduce(ShardingSpec s, int data_ranks);

// The mode a spec runs under, or nullopt: not FSDP, not a 16-bit compute dtype, or dtypes that
// are none of the three (MixedPrecision's fields set one by one).
std::optional<FsdpMixedPrecision> fsdp_mixed_precision(const ShardingSpec& s, DType compute);

nlohmann::json spec_to_json(const ShardingSpec& s);
ShardingSpec spec_from_json(const nlohmann::json& j, const std::string& pointer);

}  // namespace shardplan::documents
