// Over 800 lines: one importer reads one DeepSpeed config, each section's reader beside the
// others, so that a key's meaning and its refusals sit in one class.
#include "planner/deepspeed_import.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "core/whole_count.hpp"
#include "planner/estimate.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;
using namespace core;
using nlohmann::json;

namespace {

constexpr std::int64_t kMaxBatch = 1'000'000'000;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool is_auto(const json& object, std::string_view key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() && it->get<std::string>() == "auto";
}

// A batch key: an integer >= 1, "auto", or absent.
struct BatchValue {
  std::optional<std::int64_t> value;
  bool automatic = false;
};

BatchValue batch_value(ObjectReader& r, const json& object, std::string_view key) {
  BatchValue b;
  if (is_auto(object, key)) {
    r.ignore(key);
    b.automatic = true;
    return b;
  }
  const auto it = object.find(key);
  if (it != object.end() && it->is_string())
    throw InputError(r.pointer_of(key),
                     "must be an integer or \"auto\", got " + describe_value(*it));
  b.value = r.optional_integer(key, Range{1, static_cast<double>(kMaxBatch), false});
  return b;
}

DType dtype_from(const std::string& name, const std::string& where) {
  const auto n = lower(name);  // DeepSpeed lower-cases it (config.py, get_communication_data_type)
  if (n == "fp32") return DType::fp32;
  if (n == "fp16") return DType::fp16;
  if (n == "bf16") return DType::bf16;
  throw InputError(where, fmt::format("must be one of fp16, bf16, fp32, got \"{}\"", name));
}

class Importer {
public:
  Importer(const json& ds, const Scenario& base) : ds_(ds), base_(base), r_(ds, "") {}

  DeepSpeedImport run() {
    read_precision();
    read_zero();
    read_communication_dtype();
    read_optimizer();
    read_data_types();
    check_bf16_optimizer();
    read_batch();
    read_activation_checkpointing();
    read_ignored();
    r_.finish();
    out_.job.seq_len = base_.job.seq_len;
    out_.job.attention = base_.job.attention;
    validate_job(out_.job, base_.cluster);
    return std::move(out_);
  }

private:
  void note(std::string line) { out_.assumptions.push_back(std::move(line)); }

  // ---- precision: "bf16" (alias "bfloat16") and "fp16" sections (precision_config.py).
  struct HalfSection {
    bool enabled = false;
    bool automatic = false;
    bool pure = false;  // bf16 master weights, gradients and optimizer states
  };

  HalfSection read_bf16(const char* key) {
    HalfSection h;
    const json* section = r_.optional_object(key);
    if (!section) return h;
    ObjectReader s(*section, std::string("/") + key);
    if (is_auto(*section, "enabled")) {
      s.ignore("enabled");
      h.automatic = true;
    } else {
      h.enabled = s.optional_boolean("enabled").value_or(false);
    }
    const bool master = s.optional_boolean("bf16_master_weights_and_grads").value_or(false);
    const bool states = s.optional_boolean("bf16_optimizer_states").value_or(false);
    if (master != states)
      throw InputError(s.pointer_of("bf16_optimizer_states"),
                       "only both bf16_master_weights_and_grads and bf16_optimizer_states (pure "
                       "bf16) or neither (fp32 master and optimizer states) are modelled");
    h.pure = master;
    // Read by BF16_Optimizer alone, which the stage and data_types decide (check_bf16_optimizer).
    if (s.optional_boolean("immediate_grad_update").value_or(false))
      immediate_grad_update_ = s.pointer_of("immediate_grad_update");
    if (s.optional_boolean("check_grad_overflow"))
      note(fmt::format(
          "/{}/check_grad_overflow ignored: one overflow check per step is not modelled", key));
    s.finish();
    return h;
  }

  HalfSection read_fp16() {
    HalfSection h;
    const json* section = r_.optional_object("fp16");
    if (!section) return h;
    ObjectReader s(*section, "/fp16");
    if (is_auto(*section, "enabled")) {
      s.ignore("enabled");
      h.automatic = true;
    } else {
      h.enabled = s.optional_boolean("enabled").value_or(false);
    }
    if (s.optional_boolean("fp16_master_weights_and_grads").value_or(false))
      throw InputError(s.pointer_of("fp16_master_weights_and_grads"),
                       "fp16 master weights (DeepSpeedCPUAdam only) are not modelled; remove it");
    bool scaling = false;
    for (const char* k :
         {"loss_scale", "initial_scale_power", "loss_scale_window", "min_loss_scale"})
      scaling |= s.optional_number(k, Range::non_negative()).has_value();
    scaling |= s.optional_integer("hysteresis", Range{1, 1e9, false}).has_value();
    scaling |= s.optional_boolean("consecutive_hysteresis").has_value();
    if (scaling)
      note("/fp16 loss-scaling settings ignored: loss scaling does not change memory or step time");
    if (s.optional_boolean("auto_cast"))
      note("/fp16/auto_cast ignored: casting the inputs does not change memory or step time");
    s.finish();
    return h;
  }

  void read_precision() {
    if (r_.has("bf16") && r_.has("bfloat16"))
      throw InputError("/bfloat16", "give bf16 or its old name bfloat16, not both");
    HalfSection bf16 = read_bf16(r_.has("bfloat16") ? "bfloat16" : "bf16");
    HalfSection fp16 = read_fp16();
    const auto p = base_.job.precision;
    if (bf16.automatic) {
      bf16.enabled = p == Precision::bf16_mixed || p == Precision::bf16;
      note(fmt::format("/bf16/enabled \"auto\": {} from the scenario's precision {}",
                       bf16.enabled ? "true" : "false", precision_name(p)));
    }
    if (fp16.automatic) {
      fp16.enabled = p == Precision::fp16_mixed;
      note(fmt::format("/fp16/enabled \"auto\": {} from the scenario's precision {}",
                       fp16.enabled ? "true" : "false", precision_name(p)));
    }
    if (bf16.enabled && fp16.enabled)
      throw InputError("/fp16/enabled", "bf16 and fp16 cannot both be enabled");
    if (bf16.pure && !bf16.enabled)
      throw InputError("/bf16/bf16_master_weights_and_grads", "needs bf16 enabled");
    Precision& q = out_.job.precision;
    q = bf16.enabled   ? (bf16.pure ? Precision::bf16 : Precision::bf16_mixed)
        : fp16.enabled ? Precision::fp16_mixed
                       : Precision::fp32;
    if (!bf16.enabled && !fp16.enabled)
      note("no bf16 or fp16 enabled: fp32 training (DeepSpeed's default)");
    if (q != p && !bf16.automatic && !fp16.automatic)
      note(fmt::format("precision {} from the config replaces the scenario's {}", precision_name(q),
                       precision_name(p)));
    for (const char* k : {"amp", "torch_autocast"})
      if (const json* v = r_.optional_object(k)) {
        ObjectReader s(*v, std::string("/") + k);
        if (s.optional_boolean("enabled").value_or(false))
          throw InputError(s.pointer_of("enabled"),
                           fmt::format("{} mixed precision is not modelled; use bf16 or fp16", k));
        s.ignore_if([](const std::string&) { return true; });
        note(fmt::format("/{} ignored: not enabled", k));
      }
  }

  // ---- zero_optimization (zero/config.py, DeepSpeedZeroConfig; zero/offload_config.py).
  struct OffloadSection {
    bool cpu = false;
  };

  OffloadSection read_offload(ObjectReader& z, const char* key, bool& present) {
    OffloadSection o;
    const json* section = z.optional_object(key);
    present = section != nullptr;
    if (!section) return o;
    ObjectReader s(*section, z.pointer_of(key));
    const auto device = s.optional_string("device").value_or("none");
    if (device == "nvme")
      throw InputError(s.pointer_of("device"),
                       "NVMe offload is not modelled; use \"cpu\" (or \"none\")");
    if (device != "cpu" && device != "none")
      throw InputError(s.pointer_of("device"),
                       fmt::format("must be one of none, cpu, nvme, got \"{}\"", device));
    o.cpu = device == "cpu";
    // pin_memory defaults to false in DeepSpeed (offload_config.py).
    if (!s.optional_boolean("pin_memory").value_or(false) && o.cpu)
      note(fmt::format("{}/pin_memory not true: host transfers are still modelled at the pinned "
                       "host-link rate (pageable copies are slower)",
                       z.pointer_of(key)));
    if (auto ratio = s.optional_number("ratio", Range::between(0, 1)); ratio && *ratio != 1.0)
      throw InputError(
          s.pointer_of("ratio"),
          fmt::format("partial optimizer offload is not modelled; use 1, got {}", *ratio));
    // NVMe-only and CPU-Adam tuning knobs: no effect on a CPU offload's GPU memory.
    s.ignore_if([](const std::string& k) {
      return k == "nvme_path" || k == "buffer_count" || k == "buffer_size" || k == "max_in_cpu" ||
             k == "pipeline_read" || k == "pipeline_write" || k == "fast_init" ||
             k == "super_offload" || k == "convert_grad_on_cpu" || k == "cpuadam_cores_perc" ||
             k == "pipeline";
    });
    s.finish();
    return o;
  }

  void read_zero() {
    const json* zj = r_.optional_object("zero_optimization");
    const json empty = json::object();
    ObjectReader z(zj ? *zj : empty, "/zero_optimization");
    read_zero_stage(z);
    read_zero_offload(z);
    read_zero_sizes(z, zj ? *zj : empty);
    read_zero_unmodelled(z);
    z.finish();
  }

  // zero_optimization.stage, and the plan it names.
  void read_zero_stage(ObjectReader& z) {
    int stage = 0;
    if (z.has("stage")) {
      const auto st = z.integer("stage");
      if (st < 0 || st > 3)
        throw InputError(z.pointer_of("stage"), fmt::format("must be 0, 1, 2 or 3, got {}", st));
      stage = static_cast<int>(st);
    } else {
      note("no zero_optimization.stage: stage 0, DeepSpeed's default");
    }
    stage_ = stage;
    const int gpn = base_.cluster.gpus_per_node;
    out_.spec = make_spec(stage == 0 ? std::string("ddp") : fmt::format("zero{}", stage),
                          Flavour::deepspeed, gpn);
  }

  void read_zero_offload(ObjectReader& z) {
    const int stage = stage_;
    ShardingSpec& s = out_.spec;
    // The deprecated boolean switches (still accepted by DeepSpeed) and their replacements.
    bool opt_present = false, param_present = false;
    const OffloadSection opt = read_offload(z, "offload_optimizer", opt_present);
    const OffloadSection param = read_offload(z, "offload_param", param_present);
    bool opt_cpu = opt.cpu, param_cpu = param.cpu;
    if (auto v = z.optional_boolean("cpu_offload")) {
      note("/zero_optimization/cpu_offload is deprecated: read as offload_optimizer {device: cpu}");
      opt_cpu = opt_cpu || *v;
    }
    if (auto v = z.optional_boolean("cpu_offload_param")) {
      note("/zero_optimization/cpu_offload_param is deprecated: read as offload_param {device: "
           "cpu}");
      param_cpu = param_cpu || *v;
    }
    if (z.optional_boolean("cpu_offload_use_pin_memory"))
      note("/zero_optimization/cpu_offload_use_pin_memory ignored: transfers modelled as pinned");
    if (param_cpu && stage != 3)
      throw InputError(
          z.pointer_of(param_present ? "offload_param" : "cpu_offload_param"),
          fmt::format("DeepSpeed offloads parameters only at stage 3, got stage {}", stage));
    if (param_cpu && !opt_cpu)
      throw InputError(z.pointer_of(param_present ? "offload_param" : "cpu_offload_param"),
                       "offloading parameters without the optimizer is not modelled; add "
                       "\"offload_optimizer\": {\"device\": \"cpu\"}");
    if (opt_cpu && stage == 0)
      throw InputError(z.pointer_of(opt_present ? "offload_optimizer" : "cpu_offload"),
                       "optimizer offload needs ZeRO stage 1, 2 or 3, got stage 0");
    s.offload = param_cpu ? Offload::params : opt_cpu ? Offload::optimizer : Offload::none;
  }

  // Bucket and prefetch sizes. "auto" is the Hugging Face Trainer's fill from the model's
  // hidden size h (transformers/integrations/deepspeed.py, trainer_config_finalize):
  // reduce_bucket_size h², stage3_prefetch_bucket_size 0.9·h², stage3_param_persistence_threshold
  // 10·h. DeepSpeed also accepts the stage-3 keys without their prefix (pydantic aliases,
  // populate_by_name); the two spellings of one key cannot both be given.
  std::optional<double> sized(ObjectReader& z, const json& zo, const char* key, const char* alias,
                              std::optional<double> auto_value) {
    if (alias && z.has(key) && z.has(alias))
      throw InputError(z.pointer_of(alias), fmt::format("give {} or {}, not both", key, alias));
    const char* k = alias && z.has(alias) ? alias : key;
    if (!z.has(k)) return std::nullopt;
    if (stage_ < 3 && std::string_view(key).starts_with("stage3_")) {
      z.ignore(k);
      note(fmt::format("/zero_optimization/{} ignored: used at stage 3 only", k));
      return std::nullopt;
    }
    if (is_auto(zo, k)) {
      if (!auto_value)
        throw InputError(z.pointer_of(k),
                         "must be a number (the Hugging Face Trainer fills \"auto\" only for "
                         "reduce_bucket_size, stage3_prefetch_bucket_size and "
                         "stage3_param_persistence_threshold), got \"auto\"");
      z.ignore(k);
      note(fmt::format("/zero_optimization/{} \"auto\": {:.0f} from the model's hidden size {} "
                       "(the Hugging Face Trainer's rule)",
                       k, *auto_value, base_.model.hidden));
      return auto_value;
    }
    if (zo.at(k).is_string())
      throw InputError(z.pointer_of(k),
                       fmt::format("must be a number{}, got {}", auto_value ? " or \"auto\"" : "",
                                   describe_value(zo.at(k))));
    return z.number(k, Range{0, 1e15, false});
  }

  // The bucket, prefetch and persistence sizes (see sized) and the switches beside them.
  void read_zero_sizes(ObjectReader& z, const json& zo) {
    const int stage = stage_;
    ShardingSpec& s = out_.spec;
    const double h = static_cast<double>(base_.model.hidden);
    const auto reduce = sized(z, zo, "reduce_bucket_size", nullptr, h * h);
    const auto allgather = sized(z, zo, "allgather_bucket_size", nullptr, std::nullopt);
    const auto prefetch = sized(z, zo, "stage3_prefetch_bucket_size", "prefetch_bucket_size",
                                std::floor(0.9 * h * h));
    const auto persistence =
        sized(z, zo, "stage3_param_persistence_threshold", "param_persistence_threshold", 10 * h);
    const auto max_live =
        sized(z, zo, "stage3_max_live_parameters", "max_live_parameters", std::nullopt);
    const auto reuse =
        sized(z, zo, "stage3_max_reuse_distance", "max_reuse_distance", std::nullopt);
    const auto contiguous = z.optional_boolean("contiguous_gradients");
    const auto overlap = z.optional_boolean("overlap_comm");
    const auto reduce_scatter = z.optional_boolean("reduce_scatter");
    const auto allgather_partitions = z.optional_boolean("allgather_partitions");

    if (stage == 0) {
      for (const char* k :
           {"reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients", "overlap_comm",
            "reduce_scatter", "allgather_partitions", "use_multi_rank_bucket_allreduce"})
        if (z.has(k)) {
          z.ignore(k);
          note(fmt::format("/zero_optimization/{} ignored: not used at stage 0", k));
        }
    } else {
      // Elements to bytes: the reduce bucket holds gradients in the communication dtype (set
      // later, when communication_data_type is known), the all-gather bucket parameters in the
      // compute dtype.
      if (reduce) reduce_bucket_elems_ = *reduce;
      if (allgather)
        s.allgather_bucket_bytes = *allgather * dtype_bytes(compute_dtype(out_.job.precision));
      else
        s.allgather_bucket_bytes = 5e8 * dtype_bytes(compute_dtype(out_.job.precision));
      if (contiguous) s.contiguous_grad_bucket = *contiguous;
      if (overlap && *overlap != (stage == 3)) overlap_ = overlap;
      // Stages 1/2 all-reduce each bucket and keep their partition (stage_1_and_2.py,
      // average_tensor) unless use_multi_rank_bucket_allreduce is false, when they reduce each
      // rank's partition to it; reduce_scatter false all-reduces too. Stage 3 reduce-scatters
      // whatever these say (stage3.py, __avg_scatter_grads).
      const auto multi_rank = z.optional_boolean("use_multi_rank_bucket_allreduce");
      if (stage < 3) {
        s.all_reduce_partitions = reduce_scatter == false || multi_rank.value_or(true);
        if (!s.all_reduce_partitions)
          note("/zero_optimization/use_multi_rank_bucket_allreduce false: one reduce per rank's "
               "partition, modelled as a reduce-scatter");
      } else {
        if (reduce_scatter == false)
          note("/zero_optimization/reduce_scatter false: stage 3 reduce-scatters the gradients "
               "regardless");
        if (multi_rank)
          note("/zero_optimization/use_multi_rank_bucket_allreduce ignored: stage 3 "
               "reduce-scatters the gradients");
      }
      if (allgather_partitions == false)
        note("/zero_optimization/allgather_partitions false: DeepSpeed broadcasts partitions; "
             "modelled as all-gather");
    }
    if (stage == 3) {
      if (prefetch) s.prefetch_bucket_elems = std::floor(*prefetch);
      if (persistence) s.persistence_threshold = *rounded_count(*persistence);  // <= 1e15: read so
      if (reuse) s.reuse_distance_elems = *reuse;
      if (max_live) {
        // A limit below two blocks' parameters allows one gathered block at a time.
        const double block = static_cast<double>(base_.model.block.params());
        const int units = std::clamp(static_cast<int>(std::floor(*max_live / block)), 1,
                                     s.max_inflight_allgathers);
        if (units < s.max_inflight_allgathers)
          note(fmt::format("/zero_optimization/stage3_max_live_parameters {:.0f} is under two "
                           "blocks ({:.0f} parameters each): one gathered block at a time",
                           *max_live, block));
        s.max_inflight_allgathers = units;
      }
    }
  }

  // Keys understood but not modelled (noted), and ZeRO++/MiCS (refused unless switched off).
  void read_zero_unmodelled(ObjectReader& z) {
    // Understood but not modelled: stated, never dropped silently.
    struct Ignored {
      const char* key;
      const char* why;
    };
    static const Ignored ignored[] = {
        {"sub_group_size", "the optimizer-step tile size is not modelled (whole partitions)"},
        {"stage3_model_persistence_threshold", "bounds only what the persistence threshold keeps"},
        {"model_persistence_threshold", "bounds only what the persistence threshold keeps"},
        {"stage3_gather_16bit_weights_on_model_save", "concerns checkpoint saving"},
        {"gather_16bit_weights_on_model_save", "concerns checkpoint saving"},
        {"stage3_gather_fp16_weights_on_model_save", "concerns checkpoint saving"},
        {"load_from_fp32_weights", "concerns checkpoint loading"},
        {"elastic_checkpoint", "concerns checkpoint loading"},
        {"pipeline_loading_checkpoint", "concerns checkpoint loading"},
        {"ignore_unused_parameters", "a correctness check"},
        {"enable_sanity_checks", "a correctness check"},
        {"log_trace_cache_warnings", "logging"},
        {"round_robin_gradients", "an offload copy ordering, not modelled"},
        {"stage3_module_granularity_threshold", "a fetch-grouping detail, not modelled"},
        {"module_granularity_threshold", "a fetch-grouping detail, not modelled"},
        {"stage3_use_all_reduce_for_fetch_params", "modelled as all-gather"},
        {"use_all_reduce_for_fetch_params", "modelled as all-gather"},
        {"stage3_allgather_sequential", "modelled as bucketed all-gather"},
        {"allgather_sequential", "modelled as bucketed all-gather"},
        {"stage3_partition_stream_chunk_size", "concerns model initialization"},
        {"memory_efficient_linear", "a kernel detail, not modelled"},
        {"override_module_apply", "concerns model initialization"},
        {"legacy_stage1", "modelled as the current stage 1"},
        {"save_muon_momentum_buffer_in_memory", "NVMe offload only"},
        {"leaf_module", "a fetch-grouping detail, not modelled"},
    };
    for (const auto& i : ignored)
      if (z.has(i.key)) {
        z.ignore(i.key);
        note(fmt::format("/zero_optimization/{} ignored: {}", i.key, i.why));
      }
    // ZeRO++ and MiCS change what is communicated and kept: rejected unless switched off.
    for (const char* k : {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                          "zero_quantized_gradients", "mics_hierarchical_params_gather"})
      if (z.optional_boolean(k).value_or(false))
        throw InputError(z.pointer_of(k), "ZeRO++/MiCS features are not modelled; remove it");
    if (auto hpz = z.optional_integer("zero_hpz_partition_size"); hpz && *hpz > 1)
      throw InputError(
          z.pointer_of("zero_hpz_partition_size"),
          fmt::format("ZeRO++ hierarchical partitioning is not modelled; use 1, got {}", *hpz));
    if (auto mics = z.optional_integer("mics_shard_size"); mics && *mics > 0)
      throw InputError(
          z.pointer_of("mics_shard_size"),
          fmt::format("MiCS sharding is not modelled (hsdp is its FSDP equivalent); use "
                      "-1, got {}",
                      *mics));
    if (z.has("zeropp_loco_param")) {
      z.ignore("zeropp_loco_param");
      note("/zero_optimization/zeropp_loco_param ignored: used with quantized gradients only");
    }
    if (z.has("zenflow"))
      throw InputError(z.pointer_of("zenflow"), "ZenFlow is not modelled; remove it");
  }

  void read_communication_dtype() {
    ShardingSpec& s = out_.spec;
    if (auto c = r_.optional_string("communication_data_type")) {
      s.reduce_dtype = dtype_from(*c, "/communication_data_type");
    } else {
      // DeepSpeed's engine: the fp16 or bf16 training dtype, else fp32 (engine.py,
      // communication_data_type).
      const auto p = out_.job.precision;
      s.reduce_dtype = p == Precision::fp16_mixed ? DType::fp16
                       : p == Precision::fp32     ? DType::fp32
                                                  : DType::bf16;
    }
    // Stage 0 flattens runs of 5e8 elements whatever the config says (engine.py,
    // MEMORY_OPT_ALLREDUCE_SIZE); reduce_bucket_size is ignored there (read_zero_sizes).
    s.reduce_bucket_bytes = reduce_bucket_elems_ * dtype_bytes(s.reduce_dtype);
    // Stage 1/2 keep one contiguous reduce bucket, two when overlap_comm is on
    // (deepspeed/runtime/zero/stage_1_and_2.py, the ipg buffers); the spec counts the stage's
    // default (overlap on at stage 3 only).
    if (overlap_ && *overlap_)
      note(fmt::format("/zero_optimization/overlap_comm true at stage {}: DeepSpeed then keeps a "
                       "second reduce bucket that the model does not count (memory under-predicted "
                       "by {} per GPU)",
                       stage_, gib(s.reduce_bucket_bytes)));
    else if (overlap_)
      note("/zero_optimization/overlap_comm false at stage 3: reductions are modelled overlapped "
           "with backward, the stage-3 default (time may be under-predicted)");
    if (r_.has("seq_parallel_communication_data_type")) {
      r_.ignore("seq_parallel_communication_data_type");
      note("/seq_parallel_communication_data_type ignored: no sequence parallelism here");
    }
  }

  // ---- data_types (config.py, DtypeEnum's names): grad_accum_dtype picks BF16_Optimizer for
  // bf16 at stage 1 when fp32 (engine.py, _do_optimizer_sanity_check); param_dtype must be the
  // enabled 16-bit dtype (_assert_valid_mixed_precision_config).
  void read_data_types() {
    const json* d = r_.optional_object("data_types");
    if (!d) return;
    ObjectReader t(*d, "/data_types");
    auto dtype = [&](const char* key) -> std::optional<DType> {
      if (!t.has(key) || d->at(key).is_null()) {
        if (t.has(key)) t.ignore(key);
        return std::nullopt;
      }
      const auto given = t.string(key);
      const auto n = lower(given);
      if (n == "fp32" || n == "float32" || n == "float" || n == "torch.float32") return DType::fp32;
      if (n == "bf16" || n == "bfloat16" || n == "torch.bfloat16") return DType::bf16;
      if (n == "fp16" || n == "float16" || n == "half" || n == "torch.float16") return DType::fp16;
      throw InputError(t.pointer_of(key),
                       fmt::format("must be one of fp32, bf16, fp16, got \"{}\"", given));
    };
    const auto precision = out_.job.precision;
    // The model's dtype, the one fp16 or bf16 enables (engine.py, get_data_types).
    const DType model = precision == Precision::fp16_mixed ? DType::fp16
                        : precision == Precision::fp32     ? DType::fp32
                                                           : DType::bf16;
    if (const auto p = dtype("param_dtype"); p && *p != model)
      throw InputError(t.pointer_of("param_dtype"),
                       fmt::format("{} does not match the enabled {} (DeepSpeed refuses it)",
                                   dtype_name(*p), dtype_name(model)));
    if (const auto a = dtype("grad_accum_dtype")) {
      // engine.py, _do_optimizer_sanity_check: without ZeRO the accumulation dtype must be the
      // model's ("unsupported mix").
      if (stage_ == 0 && *a != model)
        throw InputError(t.pointer_of("grad_accum_dtype"),
                         fmt::format("{} with a {} model at stage 0: DeepSpeed raises "
                                     "NotImplementedError (unsupported mix)",
                                     dtype_name(*a), dtype_name(model)));
      out_.spec.grad_accum_dtype = *a;
      if (runs_bf16_optimizer(out_.spec, precision, false))
        note(fmt::format("/data_types/grad_accum_dtype {}: bf16 at stage 1 runs BF16_Optimizer "
                         "(an fp32 accumulation buffer all-reduced whole, the bf16 .grad kept)",
                         dtype_name(*a)));
      else if (*a != model)
        // ZeRO then accumulates each gradient in another dtype (stage_1_and_2.py,
        // use_grad_accum_attribute), which the model does not have.
        throw InputError(t.pointer_of("grad_accum_dtype"),
                         fmt::format("{} with a {} model at stage {} is not modelled (only bf16 "
                                     "at stage 1 with fp32, BF16_Optimizer, without offload)",
                                     dtype_name(*a), dtype_name(model), stage_));
    }
    for (const char* k : {"buffer_dtype", "keep_in_fp32_modules"})
      if (t.has(k) && !d->at(k).is_null())
        throw InputError(t.pointer_of(k), "is not modelled; leave it out");
    t.finish();
  }

  // bf16's immediate_grad_update (precision_config.py) is read by BF16_Optimizer alone, which
  // then releases each bf16 gradient as it is added into the accumulation buffer
  // (accumulate_hp_grads_and_remove_lp): not modelled where the plan runs it.
  void check_bf16_optimizer() {
    if (immediate_grad_update_.empty()) return;
    if (runs_bf16_optimizer(out_.spec, out_.job.precision, false))
      throw InputError(immediate_grad_update_,
                       "true: BF16_Optimizer then releases each bf16 gradient as it is "
                       "accumulated, which is not modelled; leave it false (its default)");
    note(fmt::format("{} ignored: only BF16_Optimizer reads it, which this plan does not run",
                     immediate_grad_update_));
  }

  // ---- optimizer (config.py: "optimizer": {"type", "params"}). DeepSpeed's own names plus
  // torch.optim names it accepts with zero_allow_untested_optimizer.
  void read_optimizer() {
    const json* o = r_.optional_object("optimizer");
    if (!o) {
      out_.job.optimizer = base_.job.optimizer;
      out_.spec.torch_optimizer = true;
      note(fmt::format(
          "no optimizer section: the training script's optimizer, assumed torch.optim's "
          "{} (the scenario's; its foreach step writes an intermediate per tensor)",
          optimizer_name(base_.job.optimizer)));
      return;
    }
    ObjectReader s(*o, "/optimizer");
    const auto type = s.string("type");
    const auto t = lower(type);
    if (t == "adam" || t == "muadam" || t == "fusedadam" || t == "cpuadam") {
      out_.job.optimizer = Optimizer::adam;
    } else if (t == "adamw" || t == "muadamw") {
      out_.job.optimizer = Optimizer::adamw;
    } else if (t == "sgd" || t == "musgd") {
      out_.job.optimizer = Optimizer::sgd;
    } else if (t == "adafactor") {
      out_.job.optimizer = Optimizer::adafactor;
    } else if (t == "lamb" || t == "onebitadam" || t == "zerooneadam" || t == "onebitlamb") {
      out_.job.optimizer = Optimizer::adam;
      note(fmt::format("/optimizer/type {}: modelled as Adam (two fp32 states per parameter); "
                       "its communication compression, if any, is not modelled",
                       type));
    } else if (t == "lion" || t == "adagrad" || t == "muon") {
      out_.job.optimizer = Optimizer::sgd;
      note(fmt::format("/optimizer/type {}: one state per parameter, modelled as SGD with momentum",
                       type));
    } else {
      throw InputError(s.pointer_of("type"),
                       fmt::format("must be one of Adam, AdamW, SGD, Adafactor, Lamb, OneBitAdam, "
                                   "ZeroOneAdam, OneBitLamb, Lion, Adagrad, Muon, got \"{}\"",
                                   type));
    }
    if (out_.job.optimizer != base_.job.optimizer)
      note(fmt::format("optimizer {} from the config replaces the scenario's {}",
                       optimizer_name(out_.job.optimizer), optimizer_name(base_.job.optimizer)));
    if (s.has("params")) {
      s.object("params");
      note("/optimizer/params ignored: lr, betas, eps and weight_decay do not affect memory or "
           "time");
    }
    if (s.has("legacy_fusion")) {
      s.ignore("legacy_fusion");
      note("/optimizer/legacy_fusion ignored: a kernel detail");
    }
    s.finish();
  }

  // ---- batch (config.py, _configure_train_batch_size and _batch_assertion).
  // The three batch keys as given, with what "auto" and the scenario fill in.
  struct BatchKeys {
    std::optional<std::int64_t> global, micro, accumulation;
    std::string global_text;  // train_batch_size as the config gave it, for the errors
    bool micro_free;          // micro-batch "auto" with no --micro-batch: the planner chooses
    bool global_auto, accumulation_auto;
  };

  BatchKeys read_batch_keys() {
    const auto T0 = batch_value(r_, ds_, "train_batch_size");
    const auto M0 = batch_value(r_, ds_, "train_micro_batch_size_per_gpu");
    const auto A0 = batch_value(r_, ds_, "gradient_accumulation_steps");
    BatchKeys b{T0.value, M0.value,     A0.value,    T0.value ? std::to_string(*T0.value) : "",
                false,    T0.automatic, A0.automatic};
    auto& T = b.global;
    auto& M = b.micro;
    auto& t_desc = b.global_text;
    if (T0.automatic) {
      T = base_.job.global_batch;
      t_desc = fmt::format("\"auto\" (the scenario's global batch {})", *T);
      note(fmt::format("train_batch_size \"auto\": {}, the scenario's global batch", *T));
    }
    if (M0.automatic) {
      if (base_.job.micro_batch > 0) {
        M = base_.job.micro_batch;
        note(fmt::format("train_micro_batch_size_per_gpu \"auto\": {}, the scenario's micro-batch",
                         *M));
      } else {
        b.micro_free = true;
        note(
            "train_micro_batch_size_per_gpu \"auto\" and no --micro-batch: the planner chooses it");
      }
    }
    if (A0.automatic) note("gradient_accumulation_steps \"auto\": follows from the batch sizes");
    if (!T && !M) {
      if (!b.micro_free)
        throw InputError("/train_batch_size",
                         "missing: give train_batch_size or train_micro_batch_size_per_gpu (or "
                         "\"auto\" to take the scenario's)");
      T = base_.job.global_batch;
      t_desc = std::to_string(*T);
      note(fmt::format("no train_batch_size: {}, the scenario's global batch", *T));
    }
    return b;
  }

  // The key left out follows from the two given: train_batch_size = micro-batch x accumulation x
  // GPUs, as DeepSpeed's config reads them.
  void complete_batch(BatchKeys& b) {
    const int gpus = base_.cluster.gpus;
    auto& T = b.global;
    auto& M = b.micro;
    auto& A = b.accumulation;
    const auto& t_desc = b.global_text;
    const bool micro_free = b.micro_free;
    auto multiples = [](std::int64_t v, std::int64_t of) {
      const auto lo = v / of * of;
      return lo == 0 ? std::to_string(of) : fmt::format("{} or {}", lo, lo + of);
    };
    // Each batch key is at most 1e9, but their product with the GPU count can overflow 64 bits.
    if (M && A &&
        static_cast<double>(*M) * static_cast<double>(*A) * gpus > static_cast<double>(kMaxBatch))
      throw InputError(
          "/gradient_accumulation_steps",
          fmt::format("train_micro_batch_size_per_gpu {} x gradient_accumulation_steps "
                      "{} x {} GPUs is over {} sequences per step",
                      *M, *A, gpus, kMaxBatch));
    if (T && M && A) {
      if (*T != *M * *A * gpus) {
        std::string fix = fmt::format("use train_batch_size {}", *M * *A * gpus);
        if (*T % (*M * gpus) == 0)
          fix += fmt::format(" or gradient_accumulation_steps {}", *T / (*M * gpus));
        throw InputError("/train_batch_size",
                         fmt::format("{} is not train_micro_batch_size_per_gpu {} x "
                                     "gradient_accumulation_steps {} x {} GPUs = {}; {}",
                                     t_desc, *M, *A, gpus, *M * *A * gpus, fix));
      }
    } else if (T && M) {
      if (*T % (*M * gpus) != 0)
        throw InputError(
            "/train_batch_size",
            fmt::format("{} is not a multiple of train_micro_batch_size_per_gpu {} x {} "
                        "GPUs = {}; use {}",
                        t_desc, *M, gpus, *M * gpus, multiples(*T, *M * gpus)));
      A = *T / (*M * gpus);
    } else if (T && A) {
      if (*T % (*A * gpus) != 0)
        throw InputError("/train_batch_size",
                         fmt::format("{} is not a multiple of gradient_accumulation_steps {} x {} "
                                     "GPUs = {}; use {}",
                                     t_desc, *A, gpus, *A * gpus, multiples(*T, *A * gpus)));
      M = *T / (*A * gpus);
    } else if (M && A) {
      T = *M * *A * gpus;
    } else if (T) {  // no micro-batch, no accumulation
      if (*T % gpus != 0)
        throw InputError("/train_batch_size", fmt::format("{} is not a multiple of {} GPUs; use {}",
                                                          t_desc, gpus, multiples(*T, gpus)));
      if (!micro_free) {  // DeepSpeed: accumulation 1, micro = train_batch_size / GPUs
        A = 1;
        M = *T / gpus;
      }
    } else {  // only the micro-batch
      if (b.accumulation_auto) {
        T = base_.job.global_batch;
        if (*T % (*M * gpus) != 0)
          throw InputError(
              "/train_micro_batch_size_per_gpu",
              fmt::format("{} x {} GPUs does not divide the scenario's global batch {} "
                          "(gradient_accumulation_steps \"auto\")",
                          *M, gpus, *T));
        note(fmt::format("no train_batch_size: {}, the scenario's global batch", *T));
      } else {  // DeepSpeed: accumulation 1
        T = *M * gpus;
      }
    }
  }

  void read_batch() {
    BatchKeys b = read_batch_keys();
    complete_batch(b);
    const auto& T = b.global;
    const auto& M = b.micro;
    out_.job.global_batch = *T;
    out_.job.micro_batch = M.value_or(0);
    if (base_.job.micro_batch > 0 && M && *M != base_.job.micro_batch)
      note(fmt::format("micro-batch {} from the config replaces the scenario's {}", *M,
                       base_.job.micro_batch));
    if (*T != base_.job.global_batch && !b.global_auto)
      note(fmt::format("train_batch_size {} replaces the scenario's global batch {}", *T,
                       base_.job.global_batch));
  }

  // ---- activation_checkpointing (runtime/activation_checkpointing/config.py).
  void read_activation_checkpointing() {
    out_.job.checkpointing = base_.job.checkpointing;
    const json* a = r_.optional_object("activation_checkpointing");
    note(fmt::format("activation checkpointing is switched on in the model code, not by the "
                     "DeepSpeed config: the scenario's --checkpointing {}",
                     checkpointing_label(base_.job)));
    if (!a) return;
    ObjectReader s(*a, "/activation_checkpointing");
    if (s.optional_boolean("partition_activations").value_or(false))
      note("/activation_checkpointing/partition_activations ignored: it splits checkpoints over "
           "tensor-parallel ranks, and there are none here");
    if (s.optional_boolean("cpu_checkpointing").value_or(false))
      note("/activation_checkpointing/cpu_checkpointing true: checkpoints moved to host memory are "
           "still counted on the GPU (not modelled)");
    s.optional_boolean("contiguous_memory_optimization");
    s.optional_boolean("synchronize_checkpoint_boundary");
    s.optional_boolean("profile");
    s.optional_integer("number_checkpoints", Range{1, 1e9, false});
    s.finish();
    note("/activation_checkpointing configures deepspeed.checkpointing for models that call it; "
         "its other switches do not change the modelled memory or time");
  }

  // ---- keys that do not affect memory or step time, and features the planner does not model.
  void read_ignored() {
    struct Ignored {
      const char* key;
      const char* why;
    };
    static const Ignored ignored[] = {
        {"comment", "free text"},
        {"scheduler", "the learning-rate schedule does not affect memory or time"},
        {"gradient_clipping", "one gradient-norm reduction per step is not modelled"},
        {"steps_per_print", "logging"},
        {"wall_clock_breakdown", "logging"},
        {"dump_state", "logging"},
        {"memory_breakdown", "logging"},
        {"flops_profiler", "profiling"},
        {"tensorboard", "logging"},
        {"wandb", "logging"},
        {"csv_monitor", "logging"},
        {"comet", "logging"},
        {"checkpoint", "checkpoint I/O settings"},
        {"zero_allow_untested_optimizer", "a safety switch"},
        {"zero_force_ds_cpu_optimizer",
         "a safety switch (the CPU optimizer is modelled as CPU Adam)"},
        {"prescale_gradients", "scaling before or after the reduction costs the same"},
        {"gradient_predivide_factor", "scaling before or after the reduction costs the same"},
        {"sparse_gradients", "embedding gradients are modelled dense"},
        {"aio", "NVMe I/O settings (no NVMe offload here)"},
        {"autotuning", "settings of DeepSpeed's autotuner"},
        {"compile", "compute is modelled at the profile's efficiency"},
    };
    for (const auto& i : ignored)
      if (r_.has(i.key)) {
        r_.ignore(i.key);
        note(fmt::format("/{} ignored: {}", i.key, i.why));
      }
    // Features that change the model, the data or the parallelism: accepted only when disabled.
    static const char* const not_modelled[] = {
        "pipeline",
        "tensor_parallel",
        "sparse_attention",
        "compression_training",
        "curriculum_learning",
        "data_efficiency",
        "elasticity",
        "hybrid_engine",
        "progressive_layer_drop",
        "eigenvalue",
        "quantize_training",
        "weight_quantization",
        "sequence_parallel_size",
    };
    for (const char* k : not_modelled) {
      if (!r_.has(k)) continue;
      const json& v = ds_.at(k);
      const bool disabled = v.is_object() && v.contains("enabled") && v.at("enabled") == false;
      if (!disabled)
        throw InputError(std::string("/") + k,
                         "is a DeepSpeed feature the planner does not model; remove it to estimate "
                         "the data-parallel plan");
      r_.ignore(k);
      note(fmt::format("/{} ignored: not enabled", k));
    }
  }

  const json& ds_;
  const Scenario& base_;
  ObjectReader r_;
  DeepSpeedImport out_;
  int stage_ = 0;
  std::optional<bool> overlap_;        // overlap_comm, when it differs from the stage's default
  std::string immediate_grad_update_;  // the pointer of a bf16 immediate_grad_update: true
  double reduce_bucket_elems_ = 5e8;   // DeepSpeed's default reduce_bucket_size
};

}  // namespace

DeepSpeedImport import_deepspeed_config(const json& ds, const Scenario& base) {
  return Importer(ds, base).run();
}

}  // namespace shardplan::planner
