#include "documents/sharding.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/json_reader.hpp"

namespace shardplan::documents {

using core::InputError;
using core::ObjectReader;
using core::Range;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

template <class E>
E from_names(const std::vector<std::string>& names, const std::string& s,
             const std::string& where) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return static_cast<E>(i);
  throw InputError(where, fmt::format("must be one of {}, got \"{}\"", fmt::join(names, ", "), s));
}

// torch.nn.parallel.DistributedDataParallel (torch/nn/parallel/distributed.py): bucket_cap_mb=25;
// gradient_as_bucket_view=False, so gradients are copied into the buckets (a second copy);
// gradients are reduced in the parameter dtype (fp32 parameters under autocast).
void apply_ddp(ShardingSpec& s) {
  s.reduce_bucket_bytes = 25 * kMiB;
  s.grad_bucket_copy = true;
  s.reduce_dtype = DType::fp32;
  s.forward_prefetch = s.backward_prefetch = 0;
}

// FSDP1 (torch/distributed/fsdp/fully_sharded_data_parallel.py, _limiter_utils.py):
// limit_all_gathers=True allows 2 in-flight all-gathers; backward_prefetch=BACKWARD_PRE prefetches
// one unit; forward_prefetch=False, but the CPU runs ahead of the GPU by up to the limiter, which
// issues the next unit's all-gather during the current forward (one unit ahead). The root unit
// stays unsharded after forward. MixedPrecision keeps the sharded FlatParameter in fp32 and casts
// to param_dtype at all-gather; reduce_dtype defaults to param_dtype.
void apply_fsdp1(ShardingSpec& s) {
  s.forward_prefetch = 1;
  s.backward_prefetch = 1;
  s.max_inflight_allgathers = 2;
  s.keep_root_unsharded = s.reshard_after_forward;
  s.root_unit = true;
  s.fp32_sharded_params = true;
  s.reduce_dtype = DType::bf16;
}

// FSDP2 (torch/distributed/_composable/fsdp/_fsdp_param_group.py): implicit prefetch of the next
// group in forward and backward; the previous all-gather output stays alive until the next
// copy-in (so at most two gathered groups); the root's reshard_after_forward=None means the last
// group is not resharded before backward. Sharded DTensor parameters stay fp32; reduce_dtype
// defaults to param_dtype.
void apply_fsdp2(ShardingSpec& s) {
  s.root_unit = true;
  s.reduce_copy_in = true;
  s.forward_prefetch = 1;
  s.backward_prefetch = 1;
  s.max_inflight_allgathers = 2;
  s.fp32_sharded_params = true;
  s.reduce_dtype = DType::bf16;
}

// DeepSpeed's engine at ZeRO stage 0 (deepspeed/runtime/engine.py): the gradients stay in the
// parameters' .grad and are all-reduced once the backward is done, in runs of 5e8 elements
// (MEMORY_OPT_ALLREDUCE_SIZE, not the config's reduce_bucket_size) flattened one at a time, in
// the communication dtype (the model's: bf16 under "bf16"); bf16 keeps an fp32 master copy
// (FP16_Optimizer or FP16_UnfusedOptimizer, wrapped by _configure_fp16_optimizer).
void apply_deepspeed_stage0(ShardingSpec& s) {
  s.reduce_bucket_bytes = 5e8 * 2;  // elements × bytes of bf16, sized to the job's dtype later
  s.flatten_to_reduce = true;
  s.separate_fp32_master = true;
  s.reduce_dtype = DType::bf16;
  s.forward_prefetch = s.backward_prefetch = 0;
}

// DeepSpeed ZeRO (deepspeed/runtime/zero/config.py and stage_1_and_2.py / stage3.py):
// reduce_bucket_size = allgather_bucket_size = 5e8 elements; stage3_prefetch_bucket_size 5e7;
// stage3_param_persistence_threshold 1e5; contiguous_gradients true (one preallocated bucket per
// dtype, measured in 0.19.8); overlap_comm true for stage 3 and false otherwise; bf16/fp16
// partitions with a separate fp32 master partition; ZeRO-3 keeps a flat fp32 gradient partition.
void apply_deepspeed(ShardingSpec& s) {
  if (!s.shard_optimizer) return apply_deepspeed_stage0(s);
  const bool stage3 = s.shard_parameters;
  s.reduce_bucket_bytes = 5e8 * 2;  // elements × bytes of the bf16/fp16 communication dtype
  s.allgather_bucket_bytes = 5e8 * 2;
  s.prefetch_bucket_elems = stage3 ? 5e7 : 0;
  s.forward_prefetch = s.backward_prefetch = 1;
  s.max_inflight_allgathers = stage3 ? 2 : 1;
  s.persistence_threshold = stage3 ? 100000 : 0;
  s.reuse_distance_elems = stage3 ? 1e9 : 0;  // stage3_max_reuse_distance
  // Stages 1/2 all-reduce each bucket (stage_1_and_2.py, average_tensor:
  // use_multi_rank_bucket_allreduce); stage 3 reduce-scatters (stage3.py, __avg_scatter_grads).
  s.all_reduce_partitions = !stage3 && s.shard_optimizer;
  s.separate_fp32_master = true;
  s.contiguous_grad_bucket = true;
  s.flat_grad_partition = stage3;
  s.reduce_dtype = DType::bf16;
}

// Megatron-core as Megatron-LM runs it (megatron/core/distributed/distributed_data_parallel.py,
// param_and_grad_buffer.py, optimizer/distrib_optimizer.py; megatron/training/arguments.py):
// DDP keeps the 16-bit parameters, an fp32 main parameter per parameter and the optimizer's
// moments (Float16OptimizerWithFloat16Params), the distributed optimizer (ZeRO-1) shards the fp32
// main parameters and moments over the data- and context-parallel ranks; the main gradients are
// one fp32 buffer (--bf16 sets accumulate_allreduce_grads_in_fp32, so the buffer and its
// reduction are fp32). overlap_grad_reduce is False by default, which sets bucket_size to None:
// the whole buffer is one bucket, reduced once after the last micro-batch's backward
// (finish_grad_sync), all-reduced by DDP and reduce-scattered by the distributed optimizer, whose
// updated parameters are all-gathered after its step (overlap_param_gather False).
void apply_megatron(ShardingSpec& s) {
  s.main_grad_buffer = true;
  s.separate_fp32_master = true;
  s.reduce_dtype = DType::fp32;
  s.reduce_bucket_bytes = 0;
  s.forward_prefetch = s.backward_prefetch = 0;
}

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> n = {"ddp",       "zero1",        "zero2", "zero3",
                                             "fsdp-full", "fsdp-grad-op", "hsdp"};
  return n;
}
bool is_strategy(const std::string& s) {
  const auto& n = strategy_names();
  return s == kNoWrapper || std::find(n.begin(), n.end(), s) != n.end();
}
const std::vector<std::string>& flavour_names() {
  static const std::vector<std::string> n = {"ddp", "fsdp1", "fsdp2", "deepspeed", "megatron"};
  return n;
}
const std::vector<std::string>& offload_names() {
  static const std::vector<std::string> n = {"none", "optimizer", "params"};
  return n;
}

const char* flavour_name(Flavour f) { return flavour_names()[static_cast<std::size_t>(f)].c_str(); }
Flavour flavour_from_name(const std::string& s, const std::string& where) {
  return from_names<Flavour>(flavour_names(), s, where);
}
const char* offload_name(Offload o) { return offload_names()[static_cast<std::size_t>(o)].c_str(); }
Offload offload_from_name(const std::string& s, const std::string& where) {
  return from_names<Offload>(offload_names(), s, where);
}

std::optional<FsdpMixedPrecision> fsdp_mixed_precision(const ShardingSpec& s, DType compute) {
  const bool fsdp = s.flavour == Flavour::fsdp1 || s.flavour == Flavour::fsdp2;
  if (!fsdp || dtype_bytes(compute) >= 4) return std::nullopt;
  if (s.fp32_gathered)
    return s.reduce_dtype == DType::fp32 ? std::optional(FsdpMixedPrecision::full) : std::nullopt;
  if (s.reduce_dtype == DType::fp32) return FsdpMixedPrecision::default_mode;
  if (s.reduce_dtype == compute) return FsdpMixedPrecision::pure;
  return std::nullopt;  // a dtype of neither: MixedPrecision's dtypes set one by one
}

std::vector<Flavour> flavours_for(const std::string& strategy) {
  if (strategy == kNoWrapper) return {Flavour::ddp};
  if (strategy == "ddp") return {Flavour::ddp, Flavour::megatron, Flavour::deepspeed};
  if (strategy == "zero1") return {Flavour::deepspeed, Flavour::megatron};
  if (strategy.rfind("zero", 0) == 0) return {Flavour::deepspeed};
  return {Flavour::fsdp2, Flavour::fsdp1};
}

Flavour default_flavour(const std::string& strategy) { return flavours_for(strategy).front(); }

ShardingSpec make_spec(const std::string& strategy, std::optional<Flavour> flavour,
                       int gpus_per_node, std::optional<int> shard_group_size) {
  if (!is_strategy(strategy))
    throw InputError("--strategy",
                     fmt::format("must be one of {}, {}, got \"{}\"",
                                 fmt::join(strategy_names(), ", "), kNoWrapper, strategy));
  ShardingSpec s;
  s.strategy = strategy;
  s.flavour = flavour.value_or(default_flavour(strategy));
  const auto allowed = flavours_for(strategy);
  if (std::find(allowed.begin(), allowed.end(), s.flavour) == allowed.end()) {
    std::vector<std::string> ok;
    ok.reserve(allowed.size());
    for (auto f : allowed) ok.emplace_back(flavour_name(f));
    throw InputError("--flavour", fmt::format("{} is not implemented by {}; use {}", strategy,
                                              flavour_name(s.flavour), fmt::join(ok, " or ")));
  }
  // The three sharding switches: ZeRO-1 shards the optimizer states, ZeRO-2 and SHARD_GRAD_OP the
  // gradients too, ZeRO-3 and FULL_SHARD the parameters too (Rajbhandari et al. 2020, §5;
  // torch.distributed.fsdp.ShardingStrategy).
  if (strategy == "zero1") {
    s.shard_optimizer = true;
  } else if (strategy == "zero2" || strategy == "fsdp-grad-op") {
    s.shard_optimizer = s.shard_gradients = true;
    // SHARD_GRAD_OP: parameters sharded at rest but gathered at forward and kept through backward.
    s.shard_parameters = strategy == "fsdp-grad-op";
  } else if (strategy == "zero3" || strategy == "fsdp-full" || strategy == "hsdp") {
    s.shard_optimizer = s.shard_gradients = s.shard_parameters = true;
    s.reshard_after_forward = true;
  }
  if (strategy == "hsdp") {
    s.shard_group_size = shard_group_size.value_or(gpus_per_node);
    if (s.shard_group_size < 1)
      throw InputError("--shard-group-size",
                       fmt::format("must be >= 1, got {}", s.shard_group_size));
  } else if (shard_group_size) {
    throw InputError("--shard-group-size", fmt::format("applies to hsdp only, not {}", strategy));
  }
  switch (s.flavour) {
  case Flavour::ddp:
    apply_ddp(s);
    // One process with no data-parallel wrapper (a plain loop; transformers' Trainer and
    // accelerate on one GPU): the gradients stay where autograd put them, no buckets.
    if (strategy == kNoWrapper) {
      s.grad_bucket_copy = false;
      s.reduce_bucket_bytes = 0;
    }
    break;
  case Flavour::fsdp1:
    apply_fsdp1(s);
    break;
  case Flavour::fsdp2:
    apply_fsdp2(s);
    break;
  case Flavour::deepspeed:
    apply_deepspeed(s);
    break;
  case Flavour::megatron:
    apply_megatron(s);
    break;
  }
  return s;
}

bool fused_adam(const ShardingSpec& s) {
  return (s.flavour == Flavour::deepspeed && !s.torch_optimizer) || s.flavour == Flavour::megatron;
}

bool reduces_after_backward(const ShardingSpec& s) {
  const bool zero01 =
      s.flavour == Flavour::deepspeed && !s.shard_gradients && s.offload == Offload::none;
  return zero01 || (s.main_grad_buffer && s.reduce_bucket_bytes == 0);
}

bool runs_bf16_optimizer(const ShardingSpec& s, Precision p, bool pipeline) {
  if (s.flavour != Flavour::deepspeed || p != Precision::bf16_mixed || s.shard_gradients)
    return false;
  const DType accum = s.grad_accum_dtype.value_or(DType::bf16);
  if (s.shard_optimizer) return accum == DType::fp32 && s.offload == Offload::none;
  return pipeline && accum == DType::bf16;
}

ShardingSpec as_bf16_optimizer(ShardingSpec s) {
  s.main_grad_buffer = true;
  s.low_grads_kept = true;
  s.grad_accum_dtype = s.grad_accum_dtype.value_or(DType::bf16);
  s.reduce_bucket_bytes = 0;
  s.shard_optimizer = true;
  s.all_reduce_partitions = true;
  s.contiguous_grad_bucket = false;
  s.flatten_to_reduce = false;
  return s;
}

ShardingSpec with_overlap_grad_reduce(ShardingSpec s, int data_ranks) {
  // distributed_data_parallel.py: bucket_size = max(40000000, 1000000 * dp_cp size) elements
  // (of the main-gradient buffer's dtype) when overlap_grad_reduce is on.
  const double elements = std::max(40e6, 1e6 * data_ranks);
  s.reduce_bucket_bytes = elements * dtype_bytes(s.reduce_dtype);
  return s;
}

nlohmann::json spec_to_json(const ShardingSpec& s) {
  return {{"strategy", s.strategy},
          {"flavour", flavour_name(s.flavour)},
          {"shard_optimizer", s.shard_optimizer},
          {"shard_gradients", s.shard_gradients},
          {"shard_parameters", s.shard_parameters},
          {"shard_group_size", s.shard_group_size},
          {"reshard_after_forward", s.reshard_after_forward},
          {"keep_root_unsharded", s.keep_root_unsharded},
          {"forward_prefetch", s.forward_prefetch},
          {"backward_prefetch", s.backward_prefetch},
          {"max_inflight_allgathers", s.max_inflight_allgathers},
          {"prefetch_bucket_elems", s.prefetch_bucket_elems},
          {"reduce_bucket_bytes", s.reduce_bucket_bytes},
          {"allgather_bucket_bytes", s.allgather_bucket_bytes},
          {"all_reduce_partitions", s.all_reduce_partitions},
          {"reduce_dtype", dtype_name(s.reduce_dtype)},
          {"persistence_threshold", s.persistence_threshold},
          {"offload", offload_name(s.offload)},
          {"fp32_sharded_params", s.fp32_sharded_params},
          {"separate_fp32_master", s.separate_fp32_master},
          {"contiguous_grad_bucket", s.contiguous_grad_bucket},
          {"flat_grad_partition", s.flat_grad_partition},
          {"grad_bucket_copy", s.grad_bucket_copy},
          {"fp32_gathered", s.fp32_gathered},
          {"torch_optimizer", s.torch_optimizer},
          {"grad_accum_dtype",
           s.grad_accum_dtype ? nlohmann::json(dtype_name(*s.grad_accum_dtype)) : nullptr}};
}

ShardingSpec spec_from_json(const nlohmann::json& j, const std::string& pointer) {
  ObjectReader r(j, pointer);
  ShardingSpec s;
  s.strategy = r.choice("strategy", strategy_names());
  s.flavour = flavour_from_name(r.string("flavour"), r.pointer_of("flavour"));
  s.root_unit = s.flavour == Flavour::fsdp1 || s.flavour == Flavour::fsdp2;
  s.reduce_copy_in = s.flavour == Flavour::fsdp2;
  s.main_grad_buffer = s.flavour == Flavour::megatron;
  s.shard_optimizer = r.boolean("shard_optimizer");
  s.flatten_to_reduce = s.flavour == Flavour::deepspeed && !s.shard_optimizer;
  s.shard_gradients = r.boolean("shard_gradients");
  s.shard_parameters = r.boolean("shard_parameters");
  s.shard_group_size = static_cast<int>(r.integer("shard_group_size", Range{0, 1e6, false}));
  s.reshard_after_forward = r.boolean("reshard_after_forward");
  s.keep_root_unsharded = r.boolean("keep_root_unsharded");
  s.forward_prefetch = static_cast<int>(r.integer("forward_prefetch", Range{0, 1e4, false}));
  s.backward_prefetch = static_cast<int>(r.integer("backward_prefetch", Range{0, 1e4, false}));
  s.max_inflight_allgathers =
      static_cast<int>(r.integer("max_inflight_allgathers", Range{1, 1e4, false}));
  s.prefetch_bucket_elems = r.number("prefetch_bucket_elems", Range::non_negative());
  s.reduce_bucket_bytes = r.number("reduce_bucket_bytes", Range::non_negative());
  s.allgather_bucket_bytes = r.number("allgather_bucket_bytes", Range::non_negative());
  // Optional: plans written before it existed leave it to the flavour (DeepSpeed's stages 1/2).
  s.all_reduce_partitions =
      r.optional_boolean("all_reduce_partitions")
          .value_or(s.flavour == Flavour::deepspeed && s.shard_optimizer && !s.shard_parameters);
  const auto rd = r.choice("reduce_dtype", {"fp32", "bf16", "fp16"});
  s.reduce_dtype = rd == "fp32" ? DType::fp32 : rd == "bf16" ? DType::bf16 : DType::fp16;
  s.persistence_threshold = r.integer("persistence_threshold", Range{0, 1e12, false});
  s.offload = offload_from_name(r.string("offload"), r.pointer_of("offload"));
  s.fp32_sharded_params = r.boolean("fp32_sharded_params");
  s.separate_fp32_master = r.boolean("separate_fp32_master");
  s.contiguous_grad_bucket = r.boolean("contiguous_grad_bucket");
  s.flat_grad_partition = r.boolean("flat_grad_partition");
  s.grad_bucket_copy = r.boolean("grad_bucket_copy");
  // Optional: plans written before it existed gather in the compute dtype.
  s.fp32_gathered = r.optional_boolean("fp32_gathered").value_or(false);
  // Optional: plans written before it existed run DeepSpeed's own optimizer.
  s.torch_optimizer = r.optional_boolean("torch_optimizer").value_or(false);
  // Optional, null or absent: the model's dtype.
  if (r.has("grad_accum_dtype") && !j.at("grad_accum_dtype").is_null()) {
    const auto a = r.choice("grad_accum_dtype", {"fp32", "bf16", "fp16"});
    s.grad_accum_dtype = a == "fp32" ? DType::fp32 : a == "bf16" ? DType::bf16 : DType::fp16;
  } else if (r.has("grad_accum_dtype")) {
    r.ignore("grad_accum_dtype");
  }
  r.finish();
  if (s.flavour == Flavour::deepspeed && s.shard_parameters) s.reuse_distance_elems = 1e9;
  if (s.shard_gradients && !s.shard_optimizer)
    throw InputError(r.pointer_of("shard_gradients"),
                     "sharding gradients needs sharded optimizer states (no framework does this)");
  if (s.reshard_after_forward && !s.shard_parameters)
    throw InputError(r.pointer_of("reshard_after_forward"), "needs shard_parameters");
  if (s.fp32_gathered && s.flavour != Flavour::fsdp1 && s.flavour != Flavour::fsdp2)
    throw InputError(
        r.pointer_of("fp32_gathered"),
        fmt::format("applies to FSDP (fsdp1, fsdp2), not {}", flavour_name(s.flavour)));
  if (s.grad_accum_dtype && s.flavour != Flavour::deepspeed)
    throw InputError(
        r.pointer_of("grad_accum_dtype"),
        fmt::format("applies to DeepSpeed (deepspeed), not {}", flavour_name(s.flavour)));
  if (s.torch_optimizer && s.flavour != Flavour::deepspeed)
    throw InputError(
        r.pointer_of("torch_optimizer"),
        fmt::format("applies to DeepSpeed (deepspeed), not {}", flavour_name(s.flavour)));
  if (s.all_reduce_partitions && (!s.shard_optimizer || s.shard_parameters))
    throw InputError(r.pointer_of("all_reduce_partitions"),
                     "applies to ZeRO-1/2 (shard_optimizer without shard_parameters)");
  return s;
}

}  // namespace shardplan::documents
