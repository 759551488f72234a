#include "planner/scenario.hpp"

#include <CLI/CLI.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/json_reader.hpp"
#include "core/number_text.hpp"
#include "core/option_types.hpp"
#include "core/text.hpp"
#include "costmodel/block_linears.hpp"
#include "costmodel/selective_op.hpp"
#include "documents/recipe.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using core::InputError;

namespace {

// A whole number >= 1 from a flag's text.
std::int64_t positive_count(const std::string& flag, const std::string& text) {
  const auto v = core::int64_from_text(flag, text);
  if (v < 1) throw InputError(flag, fmt::format("must be > 0, got {}", v));
  return v;
}

// A name flag given as "": refused, not read as "not given".
const std::string& named(const std::string& flag, const std::optional<std::string>& text,
                         const char* what) {
  if (text->empty()) throw InputError(flag, fmt::format("must name {}, got \"\"", what));
  return *text;
}

}  // namespace

void add_scenario_options(CLI::App& app, ScenarioOptions& o) {
  app.add_option("--model", o.model, "preset name or path to a Hugging Face config.json");
  app.add_option("--params", o.params, "a bare parameter count instead of --model (e.g. 7.5e9)");
  app.add_option("--layers", o.layers, "transformer blocks of a bare --params model");
  app.add_option("--hardware", o.hardware, "hardware profile name or path");
  app.add_option(
      "--gpu-memory-GiB", o.gpu_memory_GiB,
      "GPU memory per device in GiB, replacing the hardware profile's; --emit plan carries it "
      "to the executor,\nwhich then behaves like a device of that size");
  app.add_option("--job", o.job_file,
                 "training-job document (flags override its fields; its micro_batch, checkpointing "
                 "and loss pin the search as the flags do)");
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
                 fmt::format("the training code: {} (default hf: transformers' own model and "
                             "loss)",
                             fmt::join(documents::recipe_names(), " | ")));
  app.add_option(
      "--loss", o.loss,
      "upcast | fused | chunked:N | fused-linear | fp32-inplace (default: the recipe's)");
  app.add_option("--fsdp-mixed-precision", o.fsdp_mixed_precision,
                 "default | pure | full: FSDP's MixedPrecision as Composer names it (default: "
                 "param_dtype 16-bit, reduce_dtype fp32; pure: both 16-bit; full: fp32 "
                 "parameters under autocast); not given: the recipe's. --reduce-dtype then sets "
                 "the reduction alone");
  app.add_option("--fsdp2-groups", o.fsdp2_groups,
                 "root | ends: FSDP2's parameter groups (root: each block, then the root with the "
                 "embeddings and the head; ends: the embedding and the norm with the head groups "
                 "of their own, as torchtitan and accelerate group them); not given: the "
                 "recipe's");
  app.add_flag("--compile", o.compile,
               "torch.compile as the recipe's trainer applies it (torchtitan's --compile.enable: "
               "each block and the loss compiled)");
  app.add_option("--float8", o.float8,
                 "none | rowwise | rowwise_with_gw_hp: torchao's Float8 training of the linears "
                 "as the recipe converts them (torchtitan's Float8LinearConverter recipe_name)");
  app.add_option("--float8-filter", o.float8_filter,
                 "module names Float8 leaves in 16 bits, each a substring of a linear's fully "
                 "qualified name (torchtitan's filter_fqns, e.g. lm_head)")
      ->delimiter(',');
  app.add_option("--headroom", o.headroom, "fraction of GPU memory kept free (default 0.05)");
  app.add_option("--accounting", o.accounting, "framework | zero-paper (2+2+12 bytes/param)");
}

namespace {

// A document's own name (its `key`, a non-empty string), else `fallback`.
std::string document_name(const nlohmann::json& doc, const char* key, const char* fallback) {
  if (doc.is_object() && doc.contains(key) && doc[key].is_string() &&
      !doc[key].get<std::string>().empty())
    return doc[key].get<std::string>();
  return fallback;
}

// parse() of a document given in memory, its errors named as a file's are, by `what` ("model:
// /hidden_size: ...").
template <class Parse> auto in_document(const char* what, Parse&& parse) {
  try {
    return parse();
  } catch (const InputError& e) {
    throw core::error_in_file(what, e);
  }
}

// The model and the hardware profile: from the documents in memory, or as the flags name them.
void set_model_and_hardware(const ScenarioOptions& o, Scenario& sc) {
  if (o.params && (o.model || o.model_document))
    throw InputError("--params", "give either --model or --params, not both");
  if (o.layers && !o.params)
    throw InputError("--layers", "goes with --params (a model's blocks are its own)");
  if (o.model && o.model_document)
    throw InputError("--model", "give either a name or a document, not both");
  if (o.hardware && o.hardware_document)
    throw InputError("--hardware", "give either a name or a document, not both");
  if (o.params) {
    const double params = core::double_from_text("--params", *o.params);
    const std::int64_t layers = o.layers ? positive_count("--layers", *o.layers) : 0;  // 0: derived
    sc.model = documents::model_from_param_count(params, layers);
  } else if (o.model_document) {
    sc.model = in_document("model", [&] {
      return documents::model_from_hf_config(
          *o.model_document, document_name(*o.model_document, "_name_or_path", "model"));
    });
  } else {
    sc.model = documents::load_model(o.model ? named("--model", o.model, "a preset or a file")
                                             : kDefaultModel);
  }
  if (o.hardware_document)
    sc.hardware = in_document("hardware", [&] {
      return documents::hardware_from_json(*o.hardware_document,
                                           document_name(*o.hardware_document, "name", "hardware"));
    });
  else
    sc.hardware = documents::load_hardware(
        o.hardware ? named("--hardware", o.hardware, "a profile or a file") : kDefaultHardware);
}

// The model, the hardware (with --gpu-memory-GiB) and the cluster.
void set_model_and_cluster(const ScenarioOptions& o, Scenario& sc) {
  set_model_and_hardware(o, sc);
  if (o.gpu_memory_GiB) {
    const double gib = core::double_from_text("--gpu-memory-GiB", *o.gpu_memory_GiB);
    if (!(gib > 0) || gib > 1e6)  // double_from_text refuses inf and nan
      throw InputError("--gpu-memory-GiB",
                       fmt::format("must be > 0 and <= 1000000, got {}", *o.gpu_memory_GiB));
    sc.profile_memory_bytes = sc.hardware.memory_bytes;
    sc.hardware.memory_bytes = gib * kGiB;
  }
  if (o.gpus) {
    sc.cluster.gpus = core::int_from_text("--gpus", *o.gpus);
    if (sc.cluster.gpus < 1)
      throw InputError("--gpus", fmt::format("must be >= 1, got {}", sc.cluster.gpus));
  } else {
    sc.cluster.gpus = kDefaultGpus;
  }
  if (!o.model && !o.params && !o.model_document)
    sc.defaulted.push_back(fmt::format("--model {}", kDefaultModel));
  if (!o.hardware && !o.hardware_document)
    sc.defaulted.push_back(fmt::format("--hardware {}", kDefaultHardware));
  if (!o.gpus) sc.defaulted.push_back(fmt::format("--gpus {}", kDefaultGpus));
  sc.cluster.gpus_per_node = o.gpus_per_node
                                 ? core::int_from_text("--gpus-per-node", *o.gpus_per_node)
                                 : sc.hardware.gpus_per_node;
  documents::validate_cluster(sc.cluster);
}

// Where a value of the job came from, as a message names it: the flag when given, else the --job
// document's key when there is one.
std::string job_field(const ScenarioOptions& o, bool flag_given, const char* flag,
                      const char* key) {
  if (flag_given || !o.job_file) return flag;
  return fmt::format("{}: {}", core::printable(*o.job_file), key);
}

// The job: the --job file's, or the defaults; which of loss and checkpointing the user named.
void set_base_job(const ScenarioOptions& o, Scenario& sc) {
  bool& loss_named = sc.loss_named;
  bool& checkpointing_named = sc.checkpointing_named;
  loss_named = o.loss.has_value();
  checkpointing_named = o.checkpointing.has_value();
  sc.attention_named = o.attention.has_value();
  if (o.job_file) {
    const auto doc = core::read_json_document(named("--job", o.job_file, "a file"),
                                              [&](const nlohmann::json& d) {
                                                sc.job = documents::job_from_json(d);
                                                return d;
                                              });
    loss_named = loss_named || (doc.is_object() && doc.contains("loss"));
    checkpointing_named = checkpointing_named || (doc.is_object() && doc.contains("checkpointing"));
    sc.attention_named = sc.attention_named || (doc.is_object() && doc.contains("attention"));
  } else {
    sc.job.seq_len = kDefaultSeqLen;
    sc.job.global_batch = kDefaultSequencesPerGpu * sc.cluster.gpus;
    if (!o.seq_len) sc.defaulted.push_back(fmt::format("--seq-len {}", kDefaultSeqLen));
    if (!o.global_batch)
      sc.defaulted.push_back(fmt::format("--global-batch {} ({} per GPU)", sc.job.global_batch,
                                         kDefaultSequencesPerGpu));
  }
}

// A config that chooses its attention kernel (MPT's attn_config.attn_impl: "flash", llm-foundry's
// default, or "torch", its eager scores; ModelSpec::config_attention): the job runs that one, and
// a job that names the other is refused.
void follow_mpt_attention(const ScenarioOptions& o, Scenario& sc) {
  const std::string& impl = sc.model.config_attention;
  if (impl.empty()) return;
  const auto kernel =
      impl == "torch" ? documents::AttentionImpl::eager : documents::AttentionImpl::flash;
  if (sc.attention_named && sc.job.attention != kernel)
    throw InputError(job_field(o, o.attention.has_value(), "--attention", "/attention"),
                     fmt::format("{}: the MPT config's attn_config.attn_impl \"{}\" runs {} "
                                 "attention",
                                 documents::attention_name(sc.job.attention), impl,
                                 documents::attention_name(kernel)));
  sc.job.attention = kernel;
}

// --fsdp2-groups (or the job's fsdp2_groups), then --compile (or the job's compile): the recipe's
// trainer compiles each block and the loss
// (torchtitan's CompileConfig components "model" and "loss"), so its loss is the compiled one
// (LossImpl::fused) unless the job names another. Recipes whose compiled block is not measured
// refuse it.
void apply_code_options(const ScenarioOptions& o, Scenario& sc) {
  if (o.fsdp2_groups)
    sc.job.fsdp2_groups = documents::fsdp2_groups_from_name(*o.fsdp2_groups, "--fsdp2-groups");
  if (o.compile) sc.job.compile = true;
  if (!sc.job.compile) return;
  const documents::RecipeTraits& r = documents::recipe_traits(sc.job.recipe);
  if (!r.compiles_blocks)
    throw InputError(job_field(o, o.compile, "--compile", "/compile"),
                     fmt::format("what torch.compile makes recipe {}'s block keep is not measured; "
                                 "torchtitan's is (--recipe torchtitan)",
                                 r.name));
  if (!sc.loss_named) sc.job.loss = documents::LossImpl::fused;
}

// --float8 and --float8-filter (or the job's float8, float8_filter): torchao's Float8 training,
// where the recipe's converter applies it, on a GPU with fp8 tensor cores, in a bf16-mixed job.
void apply_float8(const ScenarioOptions& o, Scenario& sc) {
  if (o.float8) sc.job.float8 = documents::float8_recipe_from_name(*o.float8, "--float8");
  if (!o.float8_filter.empty()) sc.job.float8_filter = o.float8_filter;
  const bool named = sc.job.float8 != documents::Float8Recipe::none;
  const std::string where = job_field(o, o.float8.has_value(), "--float8", "/float8");
  const char* name = documents::float8_recipe_name(sc.job.float8);
  if (!named) {
    if (!sc.job.float8_filter.empty())
      throw InputError(job_field(o, !o.float8_filter.empty(), "--float8-filter", "/float8_filter"),
                       fmt::format("{}: a filter of Float8's conversion, and no --float8 recipe "
                                   "is named",
                                   fmt::join(sc.job.float8_filter, ",")));
    return;
  }
  // torchtitan 0.3.0 hands torchao's _auto_filter_for_recipe a Linear.Config, which it accepts
  // only as an nn.Linear: with this entry no linear is converted (measured:
  // oracle_float8_units.json, meta.linear_filters).
  for (const auto& f : sc.job.float8_filter)
    if (f == "auto_filter_small_kn")
      throw InputError(job_field(o, !o.float8_filter.empty(), "--float8-filter", "/float8_filter"),
                       "auto_filter_small_kn: torchtitan 0.3.0's converter then converts no linear "
                       "(torchao's filter is handed a Linear.Config, not an nn.Linear); leave it "
                       "out, or name the modules to leave in 16 bits");
  const documents::RecipeTraits& r = documents::recipe_traits(sc.job.recipe);
  if (!r.offers_float8)
    throw InputError(where, fmt::format("{}: recipe {} has no Float8 training modeled; "
                                        "torchtitan's is (--recipe torchtitan)",
                                        name, r.name));
  if (sc.job.precision != documents::Precision::bf16_mixed)
    throw InputError(where, fmt::format("{}: Float8 training casts the linears' bf16 inputs; this "
                                        "job is {} (use --precision bf16-mixed)",
                                        name, documents::precision_name(sc.job.precision)));
  if (sc.hardware.fp8_peak_flops <= 0)
    throw InputError(where, fmt::format("{}: {} ({}) has no fp8 tensor cores (its profile names "
                                        "no peak_TFLOPs.fp8)",
                                        name, sc.hardware.name, sc.hardware.device));
  // Compiled, the partition measured is the one of a block whose linears are all in Float8.
  if (sc.job.compile && !costmodel::float8_whole_block(sc.model, sc.job)) {
    std::vector<std::string> kept;
    for (const auto& mm : costmodel::block_matmuls(sc.model, sc.job))
      if (!mm.fp8) kept.push_back(mm.name);
    const bool filtered = !sc.job.float8_filter.empty();
    throw InputError(
        filtered ? job_field(o, !o.float8_filter.empty(), "--float8-filter", "/float8_filter")
                 : where,
        fmt::format("{}: leaves {} in 16 bits; what a compiled block keeps with some "
                    "of its linears in 16 bits is not measured (with all of them in "
                    "Float8 it is)",
                    filtered ? fmt::format("{}", fmt::join(sc.job.float8_filter, ","))
                             : std::string(name),
                    fmt::join(kept, ", ")));
  }
  if (const auto f = costmodel::float8_filter_per_layer(sc.model, sc.job); !f.empty())
    throw InputError(job_field(o, !o.float8_filter.empty(), "--float8-filter", "/float8_filter"),
                     fmt::format("{}: matches a linear in some blocks and not in others; the "
                                 "blocks are planned alike, so a filter names a linear of every "
                                 "block or of none",
                                 f));
}

// The job flags over the base job.
void apply_job_flags(const ScenarioOptions& o, Scenario& sc) {
  if (o.seq_len) sc.job.seq_len = positive_count("--seq-len", *o.seq_len);
  if (o.global_batch) sc.job.global_batch = positive_count("--global-batch", *o.global_batch);
  if (o.micro_batch) sc.job.micro_batch = positive_count("--micro-batch", *o.micro_batch);
  if (sc.job.seq_len > 100'000'000)
    throw InputError("--seq-len", fmt::format("must be <= 100000000, got {}", sc.job.seq_len));
  if (o.precision) sc.job.precision = documents::precision_from_name(*o.precision, "--precision");
  if (o.optimizer) sc.job.optimizer = documents::optimizer_from_name(*o.optimizer, "--optimizer");
  if (o.checkpointing) documents::set_checkpointing(sc.job, *o.checkpointing, "--checkpointing");
  if (o.attention) sc.job.attention = documents::attention_from_name(*o.attention, "--attention");
  follow_mpt_attention(o, sc);
  if (o.recipe) {  // the recipe's loss and checkpointing unless the user names them
    sc.job.recipe = documents::recipe_from_name(*o.recipe, "--recipe");
    const documents::RecipeTraits& r = documents::recipe_traits(sc.job.recipe);
    if (!sc.loss_named) sc.job.loss = r.loss;
    if (!sc.checkpointing_named) sc.job.checkpointing = r.checkpointing;
  }
  if (o.loss) documents::set_loss(sc.job, *o.loss, "--loss");
  // torchtitan's ChunkedLossWrapper splits each sequence into the chunks: no more than its tokens.
  if (sc.job.loss == documents::LossImpl::chunked && sc.job.loss_chunks > sc.job.seq_len)
    throw InputError(job_field(o, o.loss.has_value(), "--loss", "/loss"),
                     fmt::format("chunked:{} splits each sequence into {} pieces, more "
                                 "than its {} tokens",
                                 sc.job.loss_chunks, sc.job.loss_chunks, sc.job.seq_len));
  apply_code_options(o, sc);
  apply_float8(o, sc);
  // every:N past the layers would checkpoint no block (torchtitan counts its N-th, 2N-th, ...) or
  // block 0 alone (transformers counts from 0): a count that says nothing of the model.
  if (sc.job.checkpointing == documents::Checkpointing::every &&
      sc.job.checkpoint_every > sc.model.layers)
    throw InputError(job_field(o, o.checkpointing.has_value(), "--checkpointing", "/checkpointing"),
                     fmt::format("every:{} counts past the model's {} layers (every:{} at most)",
                                 sc.job.checkpoint_every, sc.model.layers, sc.model.layers));
  // torchtitan's op-level save list is a policy over a PyTorch model's ops (costmodel's
  // selective_op_saved counts it on the per-op block): Megatron-core's GPT and the executor
  // checkpoint their own way.
  const documents::RecipeTraits& r = documents::recipe_traits(sc.job.recipe);
  if (sc.job.checkpointing == documents::Checkpointing::selective_op &&
      r.saved != documents::SavedTensors::per_op)
    throw InputError(
        job_field(o, o.checkpointing.has_value(), "--checkpointing", "/checkpointing"),
        fmt::format("selective-op: recipe {} does not run torchtitan's per-op save list; it "
                    "checkpoints none | full{}{}",
                    r.name, r.offers_every_n ? " | every:N" : "",
                    r.offers_selective_attention ? " | selective-attention" : ""));
  // The save list counts the block's aten::mm calls (costmodel::block_matmuls): derived for
  // torchtitan's block and transformers' Llama family, not for GPT-2's Conv1D, GPT-NeoX's or MPT's.
  if (sc.job.checkpointing == documents::Checkpointing::selective_op &&
      !costmodel::selective_op_derived(sc.model, sc.job))
    throw InputError(
        job_field(o, o.checkpointing.has_value(), "--checkpointing", "/checkpointing"),
        fmt::format("selective-op: torchtitan's per-op save list is derived for its own block and "
                    "transformers' Llama, Mistral and Qwen2, not for {} ({}) under recipe {}; "
                    "it checkpoints none | full{}{}",
                    sc.model.name, documents::architecture_name(sc.model.architecture), r.name,
                    r.offers_every_n ? " | every:N" : "",
                    r.offers_selective_attention ? " | selective-attention" : ""));
}

// --fsdp-mixed-precision (or the job's fsdp_mixed_precision): a mode of a 16-bit mixed job that
// the recipe's training code can set (documents::FsdpMixedPrecision).
void apply_fsdp_mixed_precision(const ScenarioOptions& o, Scenario& sc) {
  if (o.fsdp_mixed_precision)
    sc.job.fsdp_mixed_precision = documents::fsdp_mixed_precision_from_name(
        *o.fsdp_mixed_precision, "--fsdp-mixed-precision");
  if (!sc.job.fsdp_mixed_precision) return;
  const auto mode = *sc.job.fsdp_mixed_precision;
  const std::string where = job_field(o, o.fsdp_mixed_precision.has_value(),
                                      "--fsdp-mixed-precision", "/fsdp_mixed_precision");
  sc.fsdp_mixed_precision_field = where;
  const char* name = documents::fsdp_mixed_precision_name(mode);
  const auto p = sc.job.precision;
  if (p != documents::Precision::bf16_mixed && p != documents::Precision::fp16_mixed)
    throw InputError(where, fmt::format("{}: FSDP's mixed precision modes are of a bf16-mixed or "
                                        "fp16-mixed job; this one is {}",
                                        name, documents::precision_name(p)));
  const documents::RecipeTraits& r = documents::recipe_traits(sc.job.recipe);
  if (mode == documents::FsdpMixedPrecision::full && !r.autocast_with_fsdp)
    throw InputError(where, fmt::format("full: recipe {} runs no autocast under FSDP, so fp32 "
                                        "parameters compute in fp32 (state --precision fp32)",
                                        r.name));
  if (mode == documents::FsdpMixedPrecision::pure && r.reduces_in_fp32_only)
    throw InputError(where, fmt::format("pure: {} reduces gradients in fp32 only", r.name));
}

}  // namespace

Scenario make_scenario(const ScenarioOptions& o, bool check_batch) {
  Scenario sc;
  sc.is_default = !o.model && !o.params && !o.model_document && !o.hardware &&
                  !o.hardware_document && !o.gpus && !o.job_file;
  set_model_and_cluster(o, sc);
  set_base_job(o, sc);
  apply_job_flags(o, sc);
  apply_fsdp_mixed_precision(o, sc);
  if (const auto why = documents::moe_unplanned(sc.model, sc.job); !why.empty())
    throw InputError(o.model_document ? "model" : "--model",
                     fmt::format("{} is a mixture of {} experts, top-{}: {}", sc.model.name,
                                 sc.model.moe.experts, sc.model.moe.top_k, why));
  if (check_batch)
    documents::validate_job(
        sc.job, sc.cluster,
        job_field(o, o.global_batch.has_value(), "--global-batch", "/global_batch"),
        job_field(o, o.micro_batch.has_value(), "--micro-batch", "/micro_batch"));
  const double headroom = o.headroom ? core::double_from_text("--headroom", *o.headroom) : 0.05;
  if (!(headroom >= 0 && headroom < 1))
    throw InputError("--headroom", fmt::format("must be in [0, 1), got {}", headroom));
  sc.headroom = headroom;
  const std::string accounting = o.accounting.value_or("framework");
  if (accounting == "framework")
    sc.accounting = costmodel::Accounting::framework;
  else if (accounting == "zero-paper")
    sc.accounting = costmodel::Accounting::zero_paper;
  else
    throw InputError("--accounting",
                     fmt::format("must be framework or zero-paper, got \"{}\"", accounting));
  return sc;
}

std::string defaults_line(const Scenario& sc) {
  if (sc.defaulted.empty()) return "";
  return fmt::format("not given, so defaulted: {}", fmt::join(sc.defaulted, ", "));
}

namespace {
// "25 GB/s": a rate in GB/s (1e9 bytes), as many digits as it has up to 4 significant.
std::string gbps(double bytes_per_s) { return fmt::format("{:.4g} GB/s", bytes_per_s / 1e9); }
}  // namespace

namespace {

// The calibrated curves whose fit misses the goal calibrate set for it (written with
// --accept-poor-fit): each with its errors, the times the cost model reads from it that uncertain.
std::vector<std::string> poor_fits(const documents::HardwareProfile& h) {
  std::vector<std::string> out;
  if (!h.calibration) return out;
  for (const auto& c : h.calibration->collectives)
    if (c.misses_goal())
      out.push_back(fmt::format("{} over {} ranks ({}) fits its measurements within median "
                                "{:.1f}%, max {:.1f}% (goal {:.0f}% and {:.0f}%)",
                                documents::traits(c.op).name, c.ranks, documents::tier_name(c.tier),
                                100 * c.median_rel_error, 100 * c.max_rel_error,
                                100 * c.goal_median_rel_error.value_or(0),
                                100 * c.goal_max_rel_error.value_or(0)));
  return out;
}

}  // namespace

std::string hardware_line(const Scenario& sc) {
  const auto& h = sc.hardware;
  const std::string memory =
      sc.profile_memory_bytes
          ? fmt::format("{:.4g} GiB per GPU (--gpu-memory-GiB; the profile's {:.4g} GiB)",
                        h.memory_bytes / kGiB, *sc.profile_memory_bytes / kGiB)
          : fmt::format("{:.4g} GiB per GPU", h.memory_bytes / kGiB);
  std::string line =
      fmt::format("hardware {}: {}; inter-node {} per GPU = {} per node of {} GPU{} (profile's "
                  "bandwidth_GBps_per_{})",
                  h.name, memory, gbps(h.inter_bandwidth_Bps),
                  gbps(h.inter_bandwidth_Bps * h.gpus_per_node), h.gpus_per_node,
                  h.gpus_per_node == 1 ? "" : "s", h.inter_bandwidth_per_node_key ? "node" : "gpu");
  const auto poor = poor_fits(h);
  if (!poor.empty())
    line +=
        fmt::format("\nNOTE: the profile's calibration misses its fit goals: {}; it was "
                    "written with --accept-poor-fit, and the communication times below come from "
                    "those fits",
                    fmt::join(poor, "; "));
  return line;
}

nlohmann::json hardware_json(const Scenario& sc) {
  const auto& h = sc.hardware;
  nlohmann::json j = {{"name", h.name},
                      {"gpu_memory_GiB", h.memory_bytes / kGiB},
                      {"gpu_memory_from", sc.profile_memory_bytes ? "--gpu-memory-GiB" : "profile"},
                      {"inter_node_GBps_per_gpu", h.inter_bandwidth_Bps / 1e9},
                      {"inter_node_GBps_per_node", h.inter_bandwidth_Bps * h.gpus_per_node / 1e9},
                      {"inter_node_key", h.inter_bandwidth_per_node_key
                                             ? "bandwidth_GBps_per_node"
                                             : "bandwidth_GBps_per_gpu"}};
  if (sc.profile_memory_bytes) j["profile_gpu_memory_GiB"] = *sc.profile_memory_bytes / kGiB;
  if (const auto poor = poor_fits(h); !poor.empty()) j["calibration_fits_missing_goal"] = poor;
  return j;
}

void add_plan_options(CLI::App& app, PlanOptions& o, bool strategy_required) {
  auto* s = app.add_option("--strategy", o.strategy,
                           "ddp | zero1 | zero2 | zero3 | fsdp-full | fsdp-grad-op | hsdp | none "
                           "(one GPU, no data-parallel wrapper)");
  if (strategy_required) s->required();
  app.add_option("--flavour", o.flavour, "ddp | fsdp1 | fsdp2 | deepspeed (default by strategy)");
  app.add_option("--shard-group-size", o.shard_group_size,
                 "HSDP shard group (default: GPUs per node)");
  app.add_option("--offload", o.offload, "none | optimizer | params");
  app.add_option("--reduce-dtype", o.reduce_dtype,
                 "fp32 | bf16 | fp16: the dtype gradients are reduced in (FSDP's reduce_dtype, "
                 "DeepSpeed's communication_data_type; default: the framework's)");
  app.add_option("--deepspeed-optimizer", o.deepspeed_optimizer,
                 "fused | torch: DeepSpeed's optimizer, its FusedAdam built from the config's "
                 "optimizer section (default), or a torch.optim one the training script passes "
                 "(foreach Adam's intermediate; bf16 at stage 0 keeps a master per parameter)");
  app.add_option("--backward-prefetch", o.backward_prefetch,
                 "pre | none: FSDP1's backward_prefetch (BACKWARD_PRE or None; default: the "
                 "recipe's, none under hf as transformers' Trainer sets it)");
}

std::optional<int> shard_group_size(const PlanOptions& o) {
  if (!o.shard_group_size) return std::nullopt;
  return core::int_from_text("--shard-group-size", *o.shard_group_size);
}

documents::ShardingSpec with_job_precision(documents::ShardingSpec s,
                                           const documents::TrainingJob& job) {
  using documents::DType;
  using documents::FsdpMixedPrecision;
  // DDP reduces in the gradients' own dtype; Megatron-LM's --bf16 reduces its fp32 main
  // gradients (accumulate_allreduce_grads_in_fp32).
  if (s.flavour == documents::Flavour::ddp || s.flavour == documents::Flavour::megatron) return s;
  const DType c = documents::compute_dtype(job.precision);
  const DType compute = c == DType::tf32 ? DType::fp32 : c;
  if (s.flavour == documents::Flavour::deepspeed) {
    s.reduce_bucket_bytes *=
        documents::dtype_bytes(compute) / documents::dtype_bytes(s.reduce_dtype);
    s.allgather_bucket_bytes *= documents::dtype_bytes(compute) / 2;  // preset: 2-byte elements
  }
  const auto& recipe = documents::recipe_traits(job.recipe);
  const bool fsdp =
      s.flavour == documents::Flavour::fsdp1 || s.flavour == documents::Flavour::fsdp2;
  const auto mode = job.fsdp_mixed_precision.value_or(recipe.fsdp_mixed_precision);
  s.reduce_dtype = recipe.reduces_in_fp32_only || (fsdp && mode != FsdpMixedPrecision::pure)
                       ? DType::fp32
                       : compute;
  s.fp32_gathered = fsdp && mode == FsdpMixedPrecision::full;
  if (s.flavour == documents::Flavour::fsdp1 && !recipe.fsdp1_backward_prefetch)
    s.backward_prefetch = 0;
  return s;
}

bool torch_optimizer_from(const std::string& name, documents::Flavour flavour) {
  if (name != "fused" && name != "torch")
    throw InputError("--deepspeed-optimizer",
                     fmt::format("must be one of fused, torch, got \"{}\"", name));
  if (flavour != documents::Flavour::deepspeed)
    throw InputError("--deepspeed-optimizer",
                     fmt::format("{}: the optimizer under DeepSpeed's engine; the plan runs {}",
                                 name, documents::flavour_name(flavour)));
  return name == "torch";
}

int backward_prefetch_units(const std::string& name, documents::Flavour flavour) {
  if (name != "pre" && name != "none")
    throw InputError("--backward-prefetch",
                     fmt::format("must be one of pre, none, got \"{}\" (FSDP1's BACKWARD_PRE or "
                                 "None; BACKWARD_POST is not modeled)",
                                 name));
  if (flavour != documents::Flavour::fsdp1)
    throw InputError("--backward-prefetch",
                     fmt::format("{}: FSDP1's backward_prefetch; the plan runs {}, which has no "
                                 "such setting",
                                 name, documents::flavour_name(flavour)));
  return name == "pre" ? 1 : 0;
}

documents::ShardingSpec with_reduce_dtype(documents::ShardingSpec s, const std::string& name,
                                          const documents::TrainingJob& job) {
  using documents::DType;
  const DType d = name == "fp32"   ? DType::fp32
                  : name == "bf16" ? DType::bf16
                  : name == "fp16" ? DType::fp16
                                   : throw InputError("--reduce-dtype",
                                                      fmt::format("must be fp32, bf16 or fp16, "
                                                                  "got \"{}\"",
                                                                  name));
  // torchtitan's mixed_precision_reduce takes "float32" only (torchtitan/config/job_config.py).
  if (documents::recipe_traits(job.recipe).reduces_in_fp32_only && d != DType::fp32)
    throw InputError("--reduce-dtype", fmt::format("{}: {} reduces gradients in fp32 only", name,
                                                   documents::recipe_name(job.recipe)));
  if (s.strategy == documents::kNoWrapper)
    throw InputError("--reduce-dtype",
                     fmt::format("{}: one GPU without a wrapper reduces no gradients; leave "
                                 "--reduce-dtype out",
                                 name));
  if (s.flavour == documents::Flavour::ddp)
    throw InputError("--reduce-dtype",
                     fmt::format("{}: DDP reduces the gradients in their own dtype (a compression "
                                 "hook is not modelled); leave --reduce-dtype out",
                                 name));
  // DeepSpeed's bucket holds reduce_bucket_size elements of the communication dtype
  // (deepspeed/runtime/zero/stage_1_and_2.py, the ipg buffers).
  if (s.flavour == documents::Flavour::deepspeed)
    s.reduce_bucket_bytes *= documents::dtype_bytes(d) / documents::dtype_bytes(s.reduce_dtype);
  s.reduce_dtype = d;
  return s;
}

documents::ShardingSpec make_plan_spec(const PlanOptions& o, const std::string& strategy,
                                       const Scenario& sc) {
  const documents::RecipeTraits& recipe = documents::recipe_traits(sc.job.recipe);
  documents::Flavour flavour = recipe.flavour_for(strategy);
  if (o.flavour) {
    flavour = documents::flavour_from_name(*o.flavour, "--flavour");
    if (!recipe.runs_under(flavour))
      throw InputError("--flavour", fmt::format("{}: recipe {} runs under {}", *o.flavour,
                                                recipe.name, recipe.flavour_list()));
  }
  if (sc.job.fsdp_mixed_precision && flavour != documents::Flavour::fsdp1 &&
      flavour != documents::Flavour::fsdp2)
    throw InputError(sc.fsdp_mixed_precision_field,
                     fmt::format("{}: {} runs under {}, not FSDP",
                                 documents::fsdp_mixed_precision_name(*sc.job.fsdp_mixed_precision),
                                 strategy, documents::flavour_name(flavour)));
  auto spec = with_job_precision(
      documents::make_spec(strategy, flavour, sc.cluster.gpus_per_node, shard_group_size(o)),
      sc.job);
  if (o.reduce_dtype) spec = with_reduce_dtype(spec, *o.reduce_dtype, sc.job);
  if (o.backward_prefetch)
    spec.backward_prefetch = backward_prefetch_units(*o.backward_prefetch, spec.flavour);
  if (o.deepspeed_optimizer)
    spec.torch_optimizer = torch_optimizer_from(*o.deepspeed_optimizer, spec.flavour);
  spec.offload = documents::offload_from_name(o.offload.value_or("none"), "--offload");
  if (strategy == documents::kNoWrapper && sc.cluster.gpus != 1)
    throw InputError("--strategy", fmt::format("none runs one GPU without a data-parallel "
                                               "wrapper; got --gpus {}",
                                               sc.cluster.gpus));
  if (spec.shard_group_size > 0 && sc.cluster.gpus % spec.shard_group_size != 0)
    throw InputError("--shard-group-size", fmt::format("{} does not divide {} GPUs",
                                                       spec.shard_group_size, sc.cluster.gpus));
  return spec;
}

// What each option's value is, as --help shows it (the options read text and check it themselves,
// so CLI11 would call every value TEXT): counts, sizes in their unit, names, files, lists.
void name_option_types(CLI::App& app) {
  static const core::OptionType kTypes[] = {
      {"gpus", "INT"},
      {"gpus-per-node", "INT"},
      {"seq-len", "TOKENS"},
      {"global-batch", "SEQUENCES"},
      {"micro-batch", "SEQUENCES"},
      {"micro-batches", "INT"},
      {"layers", "INT"},
      {"params", "COUNT"},
      {"shard-group-size", "INT"},
      {"tensor-parallel", "INT"},
      {"pipeline-parallel", "INT"},
      {"virtual-stages", "INT"},
      {"context-parallel", "INT"},
      {"first-stage-less-layers", "INT"},
      {"last-stage-less-layers", "INT"},
      {"top", "INT"},
      {"gpu-memory-GiB", "GiB"},
      {"headroom", "FRACTION"},
      {"model", "NAME|FILE"},
      {"hardware", "NAME|FILE"},
      {"job", "FILE"},
      {"deepspeed", "FILE"},
      {"plan", "FILE"},
      {"run", "FILE"},
      {"svg", "FILE"},
      {"trace", "FILE"},
      {"strategies", "LIST"},
      {"losses", "LIST"},
      {"emit", "NAME"},
      {"precision", "NAME"},
      {"optimizer", "NAME"},
      {"checkpointing", "MODE"},
      {"attention", "NAME"},
      {"recipe", "NAME"},
      {"loss", "NAME"},
      {"accounting", "NAME"},
      {"strategy", "NAME"},
      {"flavour", "NAME"},
      {"offload", "NAME"},
      {"reduce-dtype", "NAME"},
      {"backward-prefetch", "NAME"},
      {"deepspeed-optimizer", "NAME"},
      {"fsdp-mixed-precision", "NAME"},
      {"fsdp2-groups", "NAME"},
      {"float8", "NAME"},
      {"float8-filter", "LIST"},
      {"format", "NAME"},
      {"schedule", "NAME"},
      {"cp-rotate-method", "NAME"},
  };
  core::name_option_types(app, std::span<const core::OptionType>(kTypes));
}

}  // namespace shardplan::planner
