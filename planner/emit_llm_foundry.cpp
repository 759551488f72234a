#include "planner/emit_llm_foundry.hpp"

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/recipe.hpp"
#include "planner/loss_requirement.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using core::InputError;
using documents::Flavour;
using nlohmann::ordered_json;

namespace {

bool runs_mpt(const Scenario& sc) { return sc.model.architecture == documents::Architecture::mpt; }

// What llm-foundry cannot run as the plan was costed.
void check_plan(const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  auto refuse = [](const std::string& why) { throw InputError("--emit", "llm-foundry: " + why); };
  if (!documents::recipe_traits(e.job.recipe).runs_mpt)
    refuse(fmt::format("recipe {} is not llm-foundry's code; plan with --recipe llm-foundry",
                       documents::recipe_name(e.job.recipe)));
  if (s.flavour != Flavour::fsdp1)
    refuse(fmt::format("{} ({}) is not Composer's FSDP; its fsdp_config runs FSDP1 (fsdp-full, "
                       "fsdp-grad-op, hsdp)",
                       s.strategy, documents::flavour_name(s.flavour)));
  if (!e.result.valid) refuse(fmt::format("the plan is not runnable: {}", e.result.reason));
  if (s.forward_prefetch != 1 || s.backward_prefetch != 1 || s.max_inflight_allgathers != 2)
    refuse(fmt::format("the plan prefetches {} units ahead with {} all-gathers in flight; "
                       "fsdp_config writes FSDP1's own (1, limit_all_gathers' 2)",
                       s.forward_prefetch, s.max_inflight_allgathers));
  if (s.offload != documents::Offload::none)
    refuse(fmt::format("offload {}: Composer's FSDP runs without CPU offload (its "
                       "get_cpu_offload refuses it)",
                       documents::offload_name(s.offload)));
  const auto c = e.job.checkpointing;
  if (c != documents::Checkpointing::none && c != documents::Checkpointing::full)
    refuse(fmt::format("checkpointing {}: fsdp_config's activation_checkpointing checkpoints every "
                       "block or none",
                       documents::checkpointing_label(e.job)));
  if (e.job.precision == documents::Precision::bf16)
    refuse("pure bf16 parameters: Composer's amp_bf16 autocasts fp32 parameters; plan with "
           "--precision bf16-mixed");
  if (runs_mpt(sc) && e.job.loss != documents::LossImpl::fused &&
      e.job.loss != documents::LossImpl::upcast)
    refuse(fmt::format("loss {}: MPT's loss_fn is fused_crossentropy (fused) or "
                       "torch_crossentropy (upcast)",
                       documents::loss_label(e.job)));
  if (e.job.micro_batch < 1 || e.job.global_batch % (e.job.micro_batch * sc.cluster.gpus) != 0)
    refuse(fmt::format("micro-batch {} does not divide global batch {} over {} GPUs",
                       e.job.micro_batch, e.job.global_batch, sc.cluster.gpus));
}

const char* composer_precision(documents::Precision p) {
  switch (p) {
  case documents::Precision::bf16_mixed:
    return "amp_bf16";
  case documents::Precision::fp16_mixed:
    return "amp_fp16";
  case documents::Precision::fp32:
  case documents::Precision::bf16:  // refused by check_plan
    break;
  }
  return "fp32";
}

// fsdp_config.mixed_precision: Composer's name for the plan's dtypes, or the dtypes one by one.
ordered_json mixed_precision(const Evaluation& e) {
  const auto compute = documents::compute_dtype(e.job.precision);
  if (documents::dtype_bytes(compute) >= 4) return "FULL";  // one dtype: fp32 throughout
  if (const auto mode = documents::fsdp_mixed_precision(e.spec, compute))
    return documents::fsdp_mixed_precision_label(*mode);
  const char* param =
      documents::dtype_name(e.spec.fp32_gathered ? documents::DType::fp32 : compute);
  return {{"param_dtype", param},
          {"reduce_dtype", documents::dtype_name(e.spec.reduce_dtype)},
          {"buffer_dtype", param}};
}

// Composer's FSDPConfig as the plan was costed: the sharding, the mixed precision, checkpointing
// with torch.utils.checkpoint's non-reentrant rerun (Composer's default is the reentrant one),
// FSDP1's own prefetch (BACKWARD_PRE; Composer's default is BACKWARD_POST) under its rate
// limiter, the original parameters exposed (Composer's default, as measured:
// validation/measure_fsdp1_steps.py).
ordered_json fsdp_config(const Scenario& sc, const Evaluation& e) {
  const auto& s = e.spec;
  const bool hybrid = s.shard_group_size > 0 && s.shard_group_size < sc.cluster.gpus;
  ordered_json f;
  f["sharding_strategy"] = hybrid                    ? "HYBRID_SHARD"
                           : s.reshard_after_forward ? "FULL_SHARD"
                                                     : "SHARD_GRAD_OP";
  if (hybrid) {
    f["data_parallel_shard_degree"] = s.shard_group_size;
    f["data_parallel_replicate_degree"] = sc.cluster.gpus / s.shard_group_size;
  }
  f["mixed_precision"] = mixed_precision(e);
  f["activation_checkpointing"] = e.job.checkpointing == documents::Checkpointing::full;
  f["activation_checkpointing_reentrant"] = false;
  f["activation_cpu_offload"] = false;
  f["limit_all_gathers"] = true;
  f["forward_prefetch"] = false;
  f["backward_prefetch"] = "BACKWARD_PRE";
  f["use_orig_params"] = true;
  return f;
}

// The model section of an MPT config.json: name mpt_causal_lm, the config's MPTConfig keys (less
// what a Hugging Face export adds), and the loss.
ordered_json mpt_model(const Scenario& sc, const Evaluation& e) {
  ordered_json m;
  m["name"] = "mpt_causal_lm";
  for (const auto& [key, value] : sc.model.hf_config.items())
    if (key != "architectures" && key != "auto_map" && key != "model_type" &&
        key != "transformers_version" && key != "torch_dtype" && key != "_name_or_path" &&
        key != "use_cache")
      m[key] = value;
  m["loss_fn"] =
      e.job.loss == documents::LossImpl::fused ? "fused_crossentropy" : "torch_crossentropy";
  return m;
}

// A JSON value's members as YAML: objects as indented blocks, everything else in JSON's own
// notation, which YAML's flow style reads.
void yaml(Text& t, const ordered_json& object, int indent) {
  for (const auto& [key, value] : object.items()) {
    if (value.is_object() && !value.empty()) {
      t.line("{:{}}{}:", "", indent, key);
      yaml(t, value, indent + 2);
    } else {
      t.line("{:{}}{}: {}", "", indent, key, value.dump());
    }
  }
}

}  // namespace

ordered_json llm_foundry_settings(const Scenario& sc, const Evaluation& e) {
  check_plan(sc, e);
  ordered_json out;
  out["max_seq_len"] = e.job.seq_len;
  out["global_train_batch_size"] = e.job.global_batch;
  out["device_train_microbatch_size"] = e.job.micro_batch;
  out["precision"] = composer_precision(e.job.precision);
  out["fsdp_config"] = fsdp_config(sc, e);
  if (runs_mpt(sc)) out["model"] = mpt_model(sc, e);
  return out;
}

std::string llm_foundry_yaml(const Scenario& sc, const Evaluation& e) {
  const ordered_json settings = llm_foundry_settings(sc, e);  // refuses what it cannot write
  const auto& r = e.result;
  Text t;
  for (const auto& needs : plan_requirements(e.spec, e.job)) t.line("# NOTE: {}", needs);
  t.line("# shardplan: {} ({}) for {}", e.spec.strategy, flavour_name(e.spec.flavour),
         scenario_line(sc));
  t.line("# micro-batch {} x {} accumulation, checkpointing {}; predicted peak {} of {} usable per "
         "GPU{}, step {}",
         e.job.micro_batch, r.grad_accumulation, checkpointing_label(e.job), gib(r.peak_bytes),
         gib(sc.usable_bytes()), e.fits ? "" : " (DOES NOT FIT)", seconds(r.step_s));
  t.line("# Merge into your llm-foundry train YAML (scripts/train/train.py); fsdp_config states "
         "the Composer defaults the plan depends on too.");
  if (!runs_mpt(sc))
    t.line("# model: your hf_causal_lm section for {} (transformers' code, as planned)",
           sc.model.name);
  yaml(t, settings, 0);
  return t.str;
}

}  // namespace shardplan::planner
