#include "documents/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "documents/job.hpp"
#include "documents/model_readers.hpp"
#include "documents/recipe.hpp"

#ifndef SHARDPLAN_DEFAULT_DATA_DIR
#define SHARDPLAN_DEFAULT_DATA_DIR "."
#endif

namespace shardplan::documents {

using core::describe_value;
using core::InputError;
using core::ObjectReader;
using core::Range;
using core::read_json_document;

namespace model_detail {

const nlohmann::json* object_or_null(ObjectReader& r, const nlohmann::json& config,
                                     const char* key) {
  if (!r.has(key)) return nullptr;
  if (config.at(key).is_null()) {
    r.ignore(key);
    return nullptr;
  }
  return &r.object(key);
}

std::int64_t dim(ObjectReader& r, std::string_view key, double max) {
  return r.integer(key, Range{1, max, false});
}

Tensor matrix(std::string name, std::int64_t out, std::int64_t in) {
  return {std::move(name), out, in};
}
Tensor vec(std::string name, std::int64_t n) { return {std::move(name), 1, n}; }

void add_linear(UnitTensors& u, const std::string& prefix, std::int64_t out, std::int64_t in,
                bool bias) {
  u.tensors.push_back(matrix(prefix + ".weight", out, in));
  if (bias) u.tensors.push_back(vec(prefix + ".bias", out));
}

}  // namespace model_detail

using namespace model_detail;

namespace {

// Keys of an HF config.json that change neither the shapes nor the code a training step runs
// (transformers 5.23): tokens, inits, dtypes of the stored weights (the job sets the training
// precision), generation settings, numerical epsilons, rope frequencies (rope_theta; the rope
// types of rope_scaling/rope_parameters rescale the cos and sin tables, whose shapes stay those
// of the rotated width, read separately), Llama's pretraining_tp (no module of modeling_llama.py
// reads it), GPT-NeoX's rotary_emb_base (a frequency), classification heads' dropout, and
// output_hidden_states (the hidden states it returns are the blocks' inputs, kept anyway).
// Keys that choose a code path are read by each architecture's reader instead.
bool is_metadata_key(const std::string& k) {
  static const std::vector<std::string> exact = {
      "_name_or_path", "architectures", "model_type", "torch_dtype", "transformers_version",
      "use_cache", "initializer_range", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
      "rope_theta", "pretraining_tp", "rotary_emb_base", "rotary_emb_fraction",
      "classifier_dropout", "n_ctx", "task_specific_params", "id2label", "label2id", "is_decoder",
      "use_return_dict", "output_hidden_states", "dtype", "embedding_dropout", "max_length",
      "do_sample", "temperature", "top_p",
      // Leftovers of the OpenAI GPT config class in GPT-2 checkpoints (gpt2-medium: n_special,
      // predict_special_tokens; gpt2-xl: output_past); GPT2Config accepts and ignores them.
      "n_special", "predict_special_tokens", "output_past",
      // EleutherAI/gpt-neox-20b's config.json: legacy dropout keys GPTNeoXConfig never read
      // (its attention dropout is attention_dropout, read above).
      "attention_probs_dropout_prob", "hidden_dropout_prob"};
  if (std::find(exact.begin(), exact.end(), k) != exact.end()) return true;
  auto ends_with = [&](std::string_view s) {
    return k.size() >= s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0;
  };
  auto starts_with = [&](std::string_view s) { return k.rfind(s, 0) == 0; };
  // Keys starting with "_" are bookkeeping (_name_or_path, _commit_hash), except the attention
  // implementation, read in read_common_switches.
  return ends_with("_token_id") || ends_with("_token_ids") || starts_with("summary_") ||
         (starts_with("_") && k != "_attn_implementation");
}

// Keys any PreTrainedConfig reads (transformers/configuration_utils.py, modeling_utils.py) that
// switch the code a training step runs: accepted at their "off" value, refused otherwise.
// `modeled_remote_code`: the auto_map's code is the architecture's own, the one modeled here.
void read_common_switches(ObjectReader& r, const nlohmann::json& config, bool modeled_remote_code) {
  // PreTrainedConfig's output_attentions setter dispatches the eager attention (and refuses sdpa):
  // the job's attention setting chooses the implementation here.
  if (r.optional_boolean("output_attentions").value_or(false))
    throw InputError(r.pointer_of("output_attentions"),
                     "true forces eager attention; remove it and choose the attention in the job, "
                     "got true");
  // A legacy key PreTrainedModel._backward_compatibility_gradient_checkpointing consumes: true
  // turns activation checkpointing on at load, whatever the job says.
  if (r.optional_boolean("gradient_checkpointing").value_or(false))
    throw InputError(r.pointer_of("gradient_checkpointing"),
                     "true checkpoints every layer at load; remove it and choose the "
                     "checkpointing in the job, got true");
  for (const char* key : {"attn_implementation", "_attn_implementation"})
    if (const auto impl = r.optional_string(key))
      throw InputError(r.pointer_of(key),
                       fmt::format("the attention implementation is the job's setting; remove "
                                   "it, got \"{}\"",
                                   *impl));
  // A quantized checkpoint (GPTQ, AWQ, bitsandbytes ...) replaces the linear layers and their
  // storage; custom code (auto_map, loaded with trust_remote_code) replaces the model class.
  for (const char* key : {"quantization_config", "auto_map"}) {
    if (modeled_remote_code && std::string_view(key) == "auto_map") {
      r.ignore(key);
      continue;
    }
    if (const auto* v = object_or_null(r, config, key))
      throw InputError(
          r.pointer_of(key),
          fmt::format("{} models are not supported, got {}",
                      std::string_view(key) == "auto_map" ? "custom-code" : "quantized",
                      describe_value(*v)));
  }
}

// The MLP activation by its transformers name (transformers/activations.py, ACT2CLS); names of
// activations whose saved tensors are not modelled are refused.
Activation read_activation(ObjectReader& r, std::string_view key, const std::string& fallback) {
  static const std::vector<std::pair<std::string, Activation>> known = {
      {"gelu", Activation::gelu},
      {"gelu_new", Activation::gelu_new},
      {"gelu_pytorch_tanh", Activation::gelu_tanh},
      {"gelu_python_tanh", Activation::gelu_new},
      {"gelu_accurate", Activation::gelu_new},
      {"gelu_fast", Activation::gelu_fast},
      {"gelu_python", Activation::gelu_erf},
      {"gelu_10", Activation::gelu_10},
      {"quick_gelu", Activation::quick_gelu},
      {"relu", Activation::relu},
      {"silu", Activation::silu},
      {"swish", Activation::silu},
      {"linear", Activation::identity}};
  const std::string name = r.optional_string(key).value_or(fallback);
  for (const auto& [n, a] : known)
    if (n == name) return a;
  std::vector<std::string> names;
  names.reserve(known.size());
  for (const auto& [n, a] : known) names.push_back(n);
  throw InputError(r.pointer_of(key), fmt::format("unsupported activation; supported: {}; got "
                                                  "\"{}\"",
                                                  fmt::join(names, ", "), name));
}

// The rotated fraction of each head as transformers 5.23 resolves it
// (modeling_rope_utils.py, convert_rope_params_to_dict): a partial_rotary_factor inside
// rope_parameters (or the legacy rope_scaling it replaces) wins over the top-level one.
std::optional<double> nested_rotary_factor(ObjectReader& r, const nlohmann::json& config,
                                           std::string& pointer) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const auto* rope = object_or_null(r, config, key);
    if (rope == nullptr || !rope->contains("partial_rotary_factor")) continue;
    pointer = r.pointer_of(key) + "/partial_rotary_factor";
    const auto& v = rope->at("partial_rotary_factor");
    if (!v.is_number() || v.get<double>() <= 0 || v.get<double>() > 1)
      throw InputError(pointer, "must be a number in (0, 1], got " + describe_value(v));
    return v.get<double>();
  }
  return std::nullopt;
}

// The sliding window of Mistral and Qwen2 (transformers 5.23). MistralModel builds its mask with
// create_sliding_window_causal_mask whenever config.sliding_window is set (MistralConfig's
// default: 4096; null: none), the same for every layer. Qwen2Config keeps sliding_window only
// when use_sliding_window is true, and then only the layers from max_window_layers on get it
// (layer_types): blocks that differ are refused. LlamaConfig has no window; modeling_llama.py
// never reads these keys.
void read_sliding_window(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  const auto window = r.optional_integer("sliding_window", Range{1, 1e12, false});
  if (m.architecture == Architecture::mistral) {
    m.sliding_window = r.has("sliding_window") ? window.value_or(0) : 4096;
    r.ignore("use_sliding_window");  // Qwen2's keys; MistralModel never reads them
    r.ignore("max_window_layers");
    return;
  }
  if (m.architecture == Architecture::qwen2) {
    const bool use = r.optional_boolean("use_sliding_window").value_or(false);
    const auto first = r.optional_integer("max_window_layers", Range{0, kMaxLayers, false});
    const bool windowed = config.contains("sliding_window") ? window.has_value() : true;
    if (use && windowed && first.value_or(28) < m.layers)
      throw InputError(r.pointer_of("use_sliding_window"),
                       fmt::format("true gives layers {} to {} a sliding window and the others "
                                   "none; blocks that differ are not supported, got true",
                                   first.value_or(28), m.layers - 1));
    return;
  }
  r.ignore("use_sliding_window");
  r.ignore("max_window_layers");
}

// Llama, Mistral and Qwen2 share one layout (HF modeling_llama.py, modeling_mistral.py,
// modeling_qwen2.py): RMSNorm, rotary positions, SwiGLU MLP (gate, up, down), GQA.
void read_llama_family(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  read_llama_shape(r, config, m);
  m.intermediate = dim(r, "intermediate_size");
  // Never read by LlamaDecoderLayer, MistralDecoderLayer or Qwen2DecoderLayer (no dropout on
  // the residual branches).
  r.ignore("hidden_dropout");
  read_sliding_window(r, config, m);

  bool qkv_bias = false, out_bias = false, mlp_bias = false;
  if (m.architecture == Architecture::llama) {
    // LlamaAttention: attention_bias applies to q, k, v and o; LlamaMLP: mlp_bias to all three.
    qkv_bias = out_bias = r.optional_boolean("attention_bias").value_or(false);
    mlp_bias = r.optional_boolean("mlp_bias").value_or(false);
  } else if (m.architecture == Architecture::qwen2) {
    // Qwen2Attention: q, k, v always have a bias; o_proj never does.
    qkv_bias = true;
  }

  m.embedding.tensors.push_back(matrix("embed_tokens.weight", m.vocab, m.hidden));
  add_norm(m.block, "input_layernorm", m);
  add_linear(m.block, "self_attn.q_proj", m.q_width(), m.hidden, qkv_bias);
  add_linear(m.block, "self_attn.k_proj", m.kv_width(), m.hidden, qkv_bias);
  add_linear(m.block, "self_attn.v_proj", m.kv_width(), m.hidden, qkv_bias);
  add_linear(m.block, "self_attn.o_proj", m.hidden, m.q_width(), out_bias);
  add_norm(m.block, "post_attention_layernorm", m);
  add_linear(m.block, "mlp.gate_proj", m.intermediate, m.hidden, mlp_bias);
  add_linear(m.block, "mlp.up_proj", m.intermediate, m.hidden, mlp_bias);
  add_linear(m.block, "mlp.down_proj", m.hidden, m.intermediate, mlp_bias);
  add_norm(m.head, "norm", m);
  if (!m.tied_embeddings) m.head.tensors.push_back(matrix("lm_head.weight", m.vocab, m.hidden));
}

// GPT-2 (HF modeling_gpt2.py): LayerNorm with bias, learned positions, Conv1D layers with bias,
// GELU MLP of width n_inner (default 4h), dropout everywhere, head tied to wte.
void read_gpt2(ObjectReader& r, const nlohmann::json& /*config*/, ModelSpec& m) {
  m.hidden = dim(r, "n_embd");
  m.layers = dim(r, "n_layer", kMaxLayers);
  m.heads = dim(r, "n_head");
  m.kv_heads = m.heads;
  m.vocab = dim(r, "vocab_size");
  m.max_positions = dim(r, "n_positions", 1e9);
  m.intermediate =
      r.optional_integer("n_inner", Range{1, kMaxDimension, false}).value_or(4 * m.hidden);
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(true);
  // GPT2MLP: ACT2FN[activation_function] (GPT2Config's default "gelu_new").
  m.activation = read_activation(r, "activation_function", "gelu_new");
  // GPT2Attention folds both into one Python float (self.scaling) that multiplies the scores or
  // goes to sdpa as its scale: nothing more is saved either way.
  r.optional_boolean("scale_attn_weights");
  r.optional_boolean("scale_attn_by_inverse_layer_idx");
  // With eager attention, true runs _upcast_and_reordered_attn (fp32 baddbmm with autocast off):
  // other tensors are saved, and that path is not modelled.
  if (r.optional_boolean("reorder_and_upcast_attn").value_or(false))
    throw InputError(r.pointer_of("reorder_and_upcast_attn"),
                     "the upcast, reordered attention is not supported, got true");
  // GPT2Block: true adds a cross-attention and its LayerNorm to every block.
  if (r.optional_boolean("add_cross_attention").value_or(false))
    throw InputError(r.pointer_of("add_cross_attention"),
                     "cross-attention blocks are not supported, got true");
  m.attention_dropout = r.optional_number("attn_pdrop", Range::between(0, 1)).value_or(0.1) > 0;
  m.residual_dropout = r.optional_number("resid_pdrop", Range::between(0, 1)).value_or(0.1) > 0;
  m.embedding_dropout = r.optional_number("embd_pdrop", Range::between(0, 1)).value_or(0.1) > 0;
  check_heads(m, r, "n_head", "n_embd", false);
  m.head_dim = m.hidden / m.heads;
  m.mlp = MlpKind::gelu;
  m.norm = NormKind::layernorm;
  m.positions = PositionKind::learned;

  m.embedding.tensors.push_back(matrix("wte.weight", m.vocab, m.hidden));
  m.embedding.tensors.push_back(matrix("wpe.weight", m.max_positions, m.hidden));
  add_norm(m.block, "ln_1", m);
  add_linear(m.block, "attn.c_attn", 3 * m.hidden, m.hidden, true);
  add_linear(m.block, "attn.c_proj", m.hidden, m.hidden, true);
  add_norm(m.block, "ln_2", m);
  add_linear(m.block, "mlp.c_fc", m.intermediate, m.hidden, true);
  add_linear(m.block, "mlp.c_proj", m.hidden, m.intermediate, true);
  add_norm(m.head, "ln_f", m);
  if (!m.tied_embeddings) m.head.tensors.push_back(matrix("lm_head.weight", m.vocab, m.hidden));
}

// GPT-NeoX (HF modeling_gpt_neox.py): LayerNorm with bias, rotary on a fraction of each head,
// fused query_key_value, GELU MLP, parallel residual by default, untied embed_out by default.
void read_gpt_neox(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  m.hidden = dim(r, "hidden_size");
  m.intermediate = dim(r, "intermediate_size");
  m.layers = dim(r, "num_hidden_layers", kMaxLayers);
  m.heads = dim(r, "num_attention_heads");
  m.kv_heads = m.heads;
  m.vocab = dim(r, "vocab_size");
  m.max_positions = dim(r, "max_position_embeddings", 1e9);
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(false);
  m.parallel_residual = r.optional_boolean("use_parallel_residual").value_or(true);
  const bool bias = r.optional_boolean("attention_bias").value_or(true);
  // GPTNeoXMLP: ACT2FN[hidden_act] (GPTNeoXConfig's default "gelu").
  m.activation = read_activation(r, "hidden_act", "gelu");
  m.attention_dropout =
      r.optional_number("attention_dropout", Range::between(0, 1)).value_or(0) > 0;
  // GPTNeoXLayer drops out the attention and MLP outputs with hidden_dropout (default 0), and
  // GPTNeoXModel's emb_dropout the embeddings with the same rate.
  m.residual_dropout = r.optional_number("hidden_dropout", Range::between(0, 1)).value_or(0) > 0;
  m.embedding_dropout = m.residual_dropout;
  check_heads(m, r, "num_attention_heads", "hidden_size", false);
  m.head_dim = m.hidden / m.heads;
  m.mlp = MlpKind::gelu;
  m.norm = NormKind::layernorm;
  m.positions = PositionKind::rotary;
  // GPTNeoXConfig.rotary_pct (default 0.25): rotary on that fraction of each head; a
  // partial_rotary_factor in rope_parameters takes precedence (convert_rope_params_to_dict).
  std::string factor_pointer;
  const auto pct = r.optional_number("rotary_pct", Range{0, 1, true});
  const double factor =
      nested_rotary_factor(r, config, factor_pointer).value_or(pct.value_or(0.25));
  m.rotary_dim = static_cast<std::int64_t>(static_cast<double>(m.head_dim) * factor);

  m.embedding.tensors.push_back(matrix("embed_in.weight", m.vocab, m.hidden));
  add_norm(m.block, "input_layernorm", m);
  add_norm(m.block, "post_attention_layernorm", m);
  add_linear(m.block, "attention.query_key_value", 3 * m.hidden, m.hidden, bias);
  add_linear(m.block, "attention.dense", m.hidden, m.hidden, bias);
  add_linear(m.block, "mlp.dense_h_to_4h", m.intermediate, m.hidden, true);
  add_linear(m.block, "mlp.dense_4h_to_h", m.hidden, m.intermediate, true);
  add_norm(m.head, "final_layer_norm", m);
  if (!m.tied_embeddings) m.head.tensors.push_back(matrix("embed_out.weight", m.vocab, m.hidden));
}

}  // namespace

namespace model_detail {

void add_norm(UnitTensors& u, const std::string& prefix, const ModelSpec& m) {
  u.tensors.push_back(vec(prefix + ".weight", m.hidden));
  if (m.norm == NormKind::layernorm) u.tensors.push_back(vec(prefix + ".bias", m.hidden));
}

void check_heads(const ModelSpec& m, ObjectReader& r, std::string_view heads_key,
                 std::string_view hidden_key, bool explicit_head_dim) {
  if (!explicit_head_dim && m.hidden % m.heads != 0)
    throw InputError(r.pointer_of(heads_key),
                     fmt::format("{} heads do not divide {} = {}", m.heads, hidden_key, m.hidden));
  if (m.heads % m.kv_heads != 0)
    throw InputError(
        r.pointer_of("num_key_value_heads"),
        fmt::format("{} key/value heads do not divide {} query heads", m.kv_heads, m.heads));
}

// The rotary tables span the whole head: the default rope of LlamaRotaryEmbedding (and
// Mistral's, Qwen2's, the mixtures of experts') ignores partial_rotary_factor, and the scaled rope
// types that honour it (modeling_rope_utils.py) would build tables narrower than the heads
// apply_rotary_pos_emb multiplies. A factor below 1 is refused rather than read as a narrower
// table.
void check_whole_head_rope(ObjectReader& r, const nlohmann::json& config, const ModelSpec& m) {
  std::string factor_pointer = r.pointer_of("partial_rotary_factor");
  const auto top_factor = r.optional_number("partial_rotary_factor", Range{0, 1, true});
  const auto factor =
      nested_rotary_factor(r, config, factor_pointer).value_or(top_factor.value_or(1.0));
  if (factor != 1.0)
    throw InputError(factor_pointer,
                     fmt::format("{} rotates whole heads; only 1 is supported, got {}",
                                 architecture_name(m.architecture), factor));
}

void read_llama_shape(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  m.hidden = dim(r, "hidden_size");
  m.layers = dim(r, "num_hidden_layers", kMaxLayers);
  m.heads = dim(r, "num_attention_heads");
  m.kv_heads =
      r.optional_integer("num_key_value_heads", Range{1, kMaxDimension, false}).value_or(m.heads);
  const auto head_dim = r.optional_integer("head_dim", Range{1, kMaxDimension, false});
  m.head_dim = head_dim.value_or(m.hidden / m.heads);
  m.vocab = dim(r, "vocab_size");
  m.max_positions = dim(r, "max_position_embeddings", 1e9);
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(false);
  const auto act = r.optional_string("hidden_act").value_or("silu");
  if (act != "silu" && act != "swish")
    throw InputError(r.pointer_of("hidden_act"),
                     fmt::format("must be \"silu\" for a SwiGLU MLP, got \"{}\"", act));
  m.activation = Activation::silu;
  m.attention_dropout =
      r.optional_number("attention_dropout", Range::between(0, 1)).value_or(0) > 0;
  check_heads(m, r, "num_attention_heads", "hidden_size", head_dim.has_value());
  m.mlp = MlpKind::swiglu;
  m.norm = NormKind::rmsnorm;
  m.positions = PositionKind::rotary;
  check_whole_head_rope(r, config, m);
  m.rotary_dim = m.head_dim;
}

}  // namespace model_detail

const char* architecture_name(Architecture a) {
  switch (a) {
  case Architecture::llama:
    return "LlamaForCausalLM";
  case Architecture::mistral:
    return "MistralForCausalLM";
  case Architecture::qwen2:
    return "Qwen2ForCausalLM";
  case Architecture::gpt2:
    return "GPT2LMHeadModel";
  case Architecture::gpt_neox:
    return "GPTNeoXForCausalLM";
  case Architecture::mpt:
    return "MPTForCausalLM";
  case Architecture::mixtral:
    return "MixtralForCausalLM";
  case Architecture::qwen2_moe:
    return "Qwen2MoeForCausalLM";
  case Architecture::qwen3_moe:
    return "Qwen3MoeForCausalLM";
  case Architecture::olmoe:
    return "OlmoeForCausalLM";
  case Architecture::uniform:
    return "uniform";
  }
  return "?";
}

std::int64_t UnitTensors::params() const {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += t.elements();
  return n;
}

std::int64_t UnitTensors::matmul_params() const {
  std::int64_t n = 0;
  for (const auto& t : tensors)
    if (t.is_matrix() && t.experts == 1) n += t.elements();
  return n;
}

std::int64_t UnitTensors::matrices() const {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += t.is_matrix() ? 1 : 0;
  return n;
}

std::int64_t ModelSpec::total_params() const {
  return embedding.params() + layers * block.params() + head.params();
}

std::int64_t ModelSpec::active_params() const {
  std::int64_t unused = 0;  // per block: the routed experts a token is not sent to
  for (const auto& t : block.tensors)
    if (t.experts > 1) unused += (t.experts - moe.top_k) * t.rows * t.cols;
  return total_params() - layers * unused;
}

std::string moe_unplanned(const ModelSpec& m, const TrainingJob& j) {
  const auto& e = m.moe;
  if (e.experts == 0) return "";
  // Measured: transformers' blocks on their default grouped_mm path
  // (tests/costmodel/data/oracle_moe_units.json), under any recipe running transformers' code.
  const RecipeTraits& r = recipe_traits(j.recipe);
  if (!r.transformers_code)
    return fmt::format("the {} recipe's own mixture-of-experts code is not modeled; transformers' "
                       "is (--recipe hf, deepspeed or llm-foundry)",
                       r.name);
  if (j.compile) return "--compile: what a compiled sparse block keeps is not measured";
  if (j.float8 != Float8Recipe::none) return "--float8: its experts' Float8 is not modeled";
  if (e.aux_loss_coef > 0)
    return "output_router_logits: the load-balancing loss over every block's router logits is not "
           "modeled yet";
  if (e.router_jitter) return "router_jitter_noise: the router's input noise is not modeled yet";
  if (m.clip_qkv) return "clip_qkv: OLMoE's clamped q, k and v are not modeled yet";
  return "";
}
std::vector<std::string> preset_model_names() {
  return {"gpt2",        "gpt2-medium",    "gpt2-large",  "gpt2-xl",
          "llama-2-7b",  "llama-2-13b",    "llama-2-70b", "llama-3-8b",
          "llama-3-70b", "llama-3.1-405b", "mistral-7b",  "mixtral-8x7b"};
}

namespace {

bool holds_data(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_directory(dir / "hardware_profiles", ec) &&
         std::filesystem::is_directory(dir / "examples" / "models", ec);
}

}  // namespace

std::string data_dir() { return find_data_dir().path; }

DataDir find_data_dir() {
  // The user's folder, checked: a wrong one is an error, not an empty list.
  if (const char* env = std::getenv("SHARDPLAN_DATA_DIR"); env && *env) {
    if (!holds_data(env))
      throw InputError(
          "SHARDPLAN_DATA_DIR",
          fmt::format("\"{}\" has no hardware_profiles/ and examples/models/ folders", env));
    return {env, DataDirOrigin::environment};
  }
  // Installed: <prefix>/bin/<program> finds <prefix>/share/shardplan (cmake --install).
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto installed = exe.parent_path().parent_path() / "share" / "shardplan";
    if (holds_data(installed)) return {installed.string(), DataDirOrigin::installed};
  }
  // A build tree: the sources it was built from.
  if (holds_data(SHARDPLAN_DEFAULT_DATA_DIR))
    return {SHARDPLAN_DEFAULT_DATA_DIR, DataDirOrigin::source_tree};
  throw InputError(
      "SHARDPLAN_DATA_DIR",
      "is not set and neither an installed share/shardplan folder nor the source tree was "
      "found: set it to the folder holding hardware_profiles/ and examples/models/");
}

ModelSpec model_from_hf_config(const nlohmann::json& config, const std::string& name) {
  ObjectReader r(config, "");
  const auto& archs = r.array("architectures");
  if (archs.size() != 1 || !archs[0].is_string())
    throw InputError("/architectures",
                     "must be a list of one architecture name, got " + describe_value(archs));
  const std::string arch = archs[0].get<std::string>();
  ModelSpec m;
  m.name = name;
  std::vector<std::string> supported;  // the class names, each read by its own architecture
  for (const Architecture a :
       {Architecture::llama, Architecture::mistral, Architecture::qwen2, Architecture::gpt2,
        Architecture::gpt_neox, Architecture::mpt, Architecture::mixtral, Architecture::qwen2_moe,
        Architecture::qwen3_moe, Architecture::olmoe}) {
    supported.emplace_back(architecture_name(a));
    if (arch == supported.back()) m.architecture = a;
  }
  if (std::find(supported.begin(), supported.end(), arch) == supported.end())
    throw InputError("/architectures/0",
                     fmt::format("unsupported architecture \"{}\"; supported: {}", arch,
                                 fmt::join(supported, ", ")));
  // An MPT checkpoint's auto_map names llm-foundry's own MPT code (trust_remote_code), the code
  // read_mpt models.
  read_common_switches(r, config, m.architecture == Architecture::mpt);
  switch (m.architecture) {
  case Architecture::gpt2:
    read_gpt2(r, config, m);
    break;
  case Architecture::gpt_neox:
    read_gpt_neox(r, config, m);
    break;
  case Architecture::mpt:
    read_mpt(r, config, m);
    break;
  case Architecture::mixtral:
  case Architecture::qwen2_moe:
  case Architecture::qwen3_moe:
  case Architecture::olmoe:
    read_moe(r, config, m);
    break;
  default:
    read_llama_family(r, config, m);
    break;
  }
  // The rope variants (rope_type and its factors) rescale the tables, not their shapes; the
  // rotated fraction inside them was read above.
  object_or_null(r, config, "rope_scaling");
  object_or_null(r, config, "rope_parameters");
  // Each dimension is bounded, but their products are not: count in double before anything
  // multiplies them in 64-bit integers (h·q_width alone can reach 1e21).
  auto elements = [](const UnitTensors& u) {
    double n = 0;
    for (const auto& t : u.tensors) n += static_cast<double>(t.rows) * static_cast<double>(t.cols);
    return n;
  };
  const double block = elements(m.block);
  const double total =
      elements(m.embedding) + static_cast<double>(m.layers) * block + elements(m.head);
  if (total > kMaxParams)
    throw InputError("/",
                     fmt::format("the dimensions give {:.3g} parameters ({:.3g} per block x {} "
                                 "blocks); at most {:.0e} are supported",
                                 total, block, m.layers, kMaxParams));
  // Dropout rates of the Llama family are read above; GPT-2's embedding dropout keeps no state
  // we count. Everything else must be metadata.
  r.ignore_if(is_metadata_key);
  r.finish();
  m.hf_config = config;
  return m;
}

ModelSpec load_model(const std::string& name_or_path) {
  const auto presets = preset_model_names();
  std::string path = name_or_path;
  if (std::find(presets.begin(), presets.end(), name_or_path) != presets.end())
    path = data_dir() + "/examples/models/" + name_or_path + "/config.json";
  else if (!std::filesystem::exists(name_or_path))
    throw InputError("--model", fmt::format("\"{}\" is neither a preset ({}) nor a file",
                                            name_or_path, fmt::join(presets, ", ")));
  else if (std::filesystem::is_directory(name_or_path))
    path = name_or_path + "/config.json";
  return read_json_document(path, [&](const nlohmann::json& config) {
    return model_from_hf_config(config, name_or_path);
  });
}

ModelSpec model_from_param_count(double params, std::int64_t layers) {
  if (!std::isfinite(params) || params < 1e3 || params > 1e15)
    throw InputError("--params", fmt::format("must be between 1e3 and 1e15, got {}", params));
  if (layers < 0 || layers > kMaxLayers)
    throw InputError("--layers",
                     fmt::format("must be between 1 and {}, got {}", kMaxLayers, layers));
  const auto total = static_cast<std::int64_t>(std::llround(params));
  ModelSpec m;
  m.name = fmt::format("params:{}", params);
  m.architecture = Architecture::uniform;
  // 12·L·h² ≈ P with the aspect ratio h ≈ 128·L of GPT-3's family (Brown et al. 2020, Table 2.1)
  // gives L = (P / (12·128²))^(1/3).
  if (layers == 0)
    layers = std::max<std::int64_t>(1, std::llround(std::cbrt(params / (12.0 * 128 * 128))));
  m.layers = std::min(layers, total);
  const std::int64_t per_block = total / m.layers;
  // GPT-3's block (Brown et al. 2020; Radford et al. 2019): W_qkv [3h, h], W_o [h, h],
  // W_fc [4h, h], W_proj [h, 4h], 12·h² weights in GEMMs, with the largest h whose 12·h² fits the
  // block's share; what is left of the share (norms, biases, rounding) is one vector, so that the
  // count stays the user's and the FLOPs come from the shape (2 per GEMM weight per token).
  auto h = static_cast<std::int64_t>(std::sqrt(static_cast<double>(per_block) / 12.0));
  while (h > 1 && 12 * h * h > per_block) --h;  // the square root's rounding
  m.hidden = std::max<std::int64_t>(1, h);
  m.heads = std::max<std::int64_t>(1, m.hidden / 128);
  m.kv_heads = m.heads;
  m.head_dim = std::max<std::int64_t>(1, m.hidden / m.heads);
  m.intermediate = 4 * m.hidden;
  m.max_positions = 2048;
  m.mlp = MlpKind::gelu;
  m.norm = NormKind::layernorm;
  const std::int64_t hh = m.hidden;
  if (12 * hh * hh <= per_block && hh > 1) {
    m.block.tensors = {{"attn.c_attn.weight", 3 * hh, hh},
                       {"attn.c_proj.weight", hh, hh},
                       {"mlp.c_fc.weight", 4 * hh, hh},
                       {"mlp.c_proj.weight", hh, 4 * hh}};
    if (const std::int64_t left = per_block - 12 * hh * hh; left > 0)
      m.block.tensors.push_back({"norms, biases and the count's rest", left, 1});
  } else {
    m.block.tensors.push_back({"block", per_block, 1});  // too small for a 2×2 block
  }
  const std::int64_t rest = total - per_block * m.layers;
  if (rest > 0) m.head.tensors.push_back({"remainder", rest, 1});
  return m;
}

nlohmann::json model_to_json(const ModelSpec& m) {
  auto unit = [](const UnitTensors& u) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : u.tensors)
      tensors.push_back(
          {{"name", t.name},
           {"shape", t.experts > 1 ? nlohmann::json::array({t.experts, t.rows, t.cols})
                     : t.rows == 1 ? nlohmann::json::array({t.cols})
                                   : nlohmann::json::array({t.rows, t.cols})},
           {"params", t.elements()}});
    return nlohmann::json{{"params", u.params()}, {"tensors", tensors}};
  };
  return {{"schema_version", 1},
          {"model", m.name},
          {"architecture", architecture_name(m.architecture)},
          {"hidden_size", m.hidden},
          {"layers", m.layers},
          {"heads", m.heads},
          {"kv_heads", m.kv_heads},
          {"head_dim", m.head_dim},
          {"intermediate_size", m.intermediate},
          {"vocab_size", m.vocab},
          {"tied_embeddings", m.tied_embeddings},
          {"embedding", unit(m.embedding)},
          {"block", unit(m.block)},
          {"head", unit(m.head)},
          {"params", m.total_params()},
          {"active_params", m.active_params()},
          {"experts", m.moe.experts},
          {"experts_per_token", m.moe.top_k}};
}

double block_forward_flops_per_token(const ModelSpec& m, std::int64_t seq_len) {
  double routed = 0;  // the top_k experts a token goes through
  for (const auto& t : m.block.tensors)
    if (t.experts > 1) routed += static_cast<double>(m.moe.top_k * t.rows * t.cols);
  return 2.0 * (static_cast<double>(m.block.matmul_params()) + routed) +
         attention_core_flops_per_token(m, seq_len);
}

double attention_core_flops_per_token(const ModelSpec& m, std::int64_t seq_len) {
  return 4.0 * static_cast<double>(seq_len) * static_cast<double>(m.q_width());
}

double head_forward_flops_per_token(const ModelSpec& m) {
  return 2.0 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);
}

}  // namespace shardplan::documents
