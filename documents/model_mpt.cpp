#include <cmath>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "documents/model_readers.hpp"

namespace shardplan::documents::model_detail {

using core::InputError;
using core::ObjectReader;
using core::Range;

namespace {

// llm-foundry's MPT (llm-foundry 0.22.0: llmfoundry/models/mpt/configuration_mpt.py, MPTConfig;
// modeling_mpt.py; models/layers/blocks.py, attention.py, ffn.py, norm.py), from a config.json of
// MPTConfig's keys, each defaulting as llm-foundry does (models/utils/config_defaults.py). A
// block: norm_1, attn (Wqkv, or Wq, Wk and Wv without fused_qkv; q_ln and k_ln under qk_ln or
// qk_gn; out_proj), norm_2, ffn (up_proj and down_proj, and gate_proj for mptglu). The embeddings:
// wte, and wpe under learned_pos_emb unless ALiBi or rope turn it off. The head: norm_f, and
// lm_head when the embeddings are not tied. The linears' biases follow no_bias (the QKV's follow
// attention_bias, which defaults to it); no_bias also drops the norms' biases (MPTModel.__init__),
// and RMSNorm has none. Checked against llm-foundry's own MPTForCausalLM:
// tests/documents/data/mpt_params.json.
struct MptAttention {
  bool fused = true;
  bool alibi = false, rope = false;
};

MptAttention read_mpt_attention(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  const auto* attn = object_or_null(r, config, "attn_config");
  const nlohmann::json defaults = nlohmann::json::object();
  ObjectReader a(attn != nullptr ? *attn : defaults, r.pointer_of("attn_config"));
  MptAttention out;
  const std::string type =
      a.has("attn_type") ? a.choice("attn_type", {"multihead_attention", "multiquery_attention",
                                                  "grouped_query_attention"})
                         : "multihead_attention";
  const auto kv = a.optional_integer("kv_n_heads", Range{1, kMaxDimension, false});
  m.kv_heads = type == "multihead_attention" ? m.heads : type == "multiquery_attention" ? 1 : 0;
  if (type == "grouped_query_attention") {
    if (!kv) throw InputError(a.pointer_of("kv_n_heads"), "grouped_query_attention needs it");
    m.kv_heads = *kv;
  }
  m.attention_dropout = a.optional_number("attn_pdrop", Range::between(0, 1)).value_or(0) > 0;
  // "flash" (the default) or "torch" (its eager scores): the job runs that kernel (the planner's
  // scenario follows it and refuses a job that names the other).
  m.config_attention = a.has("attn_impl") ? a.choice("attn_impl", {"flash", "torch"}) : "flash";
  const bool qk_ln = a.optional_boolean("qk_ln").value_or(false);
  const bool qk_gn = a.optional_boolean("qk_gn").value_or(false);
  m.qk_norm = qk_ln ? QkNorm::width : qk_gn ? QkNorm::head : QkNorm::none;
  out.fused = a.optional_boolean("fused_qkv").value_or(true);
  m.clip_qkv = a.optional_number("clip_qkv", Range::positive()).has_value();  // a clamp
  a.optional_number("softmax_scale", Range::positive());                      // the scores' scale
  a.optional_boolean("attn_uses_sequence_id");  // a mask within packed sequences
  const auto window = a.optional_integer("sliding_window_size", Range{-1, 1e12, false});
  if (window.value_or(-1) == 0)
    throw InputError(a.pointer_of("sliding_window_size"), "must be -1 (none) or a window, got 0");
  m.sliding_window = window.value_or(-1) > 0 ? *window : 0;
  out.alibi = a.optional_boolean("alibi").value_or(false);
  a.optional_number("alibi_bias_max", Range::positive());
  out.rope = a.optional_boolean("rope").value_or(false);
  a.optional_number("rope_theta", Range::positive());
  // llm-foundry's default rope_impl is "dail" (models/utils/config_defaults.py): flash-attn's
  // RotaryEmbedding, a CUDA kernel that rotates in place; "hf" is transformers' rotate_half.
  const std::string rope_impl = a.has("rope_impl") ? a.choice("rope_impl", {"dail", "hf"}) : "dail";
  m.rope_in_place = out.rope && rope_impl == "dail";
  a.optional_object("rope_dail_config");  // the rotation's variant and dtype, not its shapes
  a.optional_object("rope_hf_config");    // scaling beyond the training length
  for (const char* key : {"nope", "prefix_lm"})
    if (a.optional_boolean(key).value_or(false))
      throw InputError(a.pointer_of(key), "is not supported, got true");
  // Logit soft-capping, cross-attention, KV reuse across layers and Ulysses attention: not
  // modeled, accepted only when off (null).
  for (const char* key : {"attn_logit_softcapping", "kv_dim", "reuse_kv_layer_idx",
                          "reuse_kv_x_layer_idx", "seq_parallel_world_size"}) {
    const auto v = a.optional_number(key);
    const bool off = !v || (std::string_view(key) == "seq_parallel_world_size" && *v == 1);
    if (!off) throw InputError(a.pointer_of(key), "is not supported; leave it null");
  }
  if (const auto* tuning = a.optional_object("attn_temperature_tuning");
      tuning != nullptr && tuning->value("attn_scale", 0.0) != 0.0)
    throw InputError(a.pointer_of("attn_temperature_tuning"),
                     "attention temperature tuning is not supported; attn_scale must be 0");
  a.finish();
  // What the cost model has not measured MPT's code keeping (the first such switch that is on).
  // (qk_ln and qk_gn build their norms with the model's norm_type: measured for the LayerNorm.)
  if (m.sliding_window > 0 && m.unmeasured.empty())
    m.unmeasured = "attn_config.sliding_window_size";
  return out;
}

// fc_type: "torch" or {"name": "torch"} (torch's nn.Linear; Transformer Engine's "te" is not
// modeled). MPTConfig._validate_config copies it into ffn_config, so an exported config.json has
// it in both.
void read_fc_type(ObjectReader& r, const nlohmann::json& config) {
  if (!r.has("fc_type") || config.at("fc_type").is_null()) {
    r.ignore("fc_type");
    return;
  }
  if (config.at("fc_type").is_string()) {
    r.choice("fc_type", {"torch"});
    return;
  }
  ObjectReader f(r.object("fc_type"), r.pointer_of("fc_type"));
  f.choice("name", {"torch"});
  f.finish();
}

// MPT's FFN (ffn.py, build_ffn): mptmlp (up, act, down) or mptglu (act(gate)·up, down), its width
// ffn_hidden_size or d_model·expansion_ratio (resolve_ffn_hidden_size: a whole number), its
// activation torch.nn.functional's ffn_act_fn (default F.gelu, exact).
void read_mpt_ffn(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  const auto ratio = r.optional_number("expansion_ratio", Range::positive()).value_or(4);
  const auto* ffn = object_or_null(r, config, "ffn_config");
  const nlohmann::json defaults = nlohmann::json::object();
  ObjectReader f(ffn != nullptr ? *ffn : defaults, r.pointer_of("ffn_config"));
  const std::string type =
      f.has("ffn_type") ? f.choice("ffn_type", {"mptmlp", "mptglu"}) : "mptmlp";
  read_fc_type(f, ffn != nullptr ? *ffn : defaults);
  m.mlp = type == "mptglu" ? MlpKind::swiglu : MlpKind::gelu;
  const auto width = f.optional_integer("ffn_hidden_size", Range{1, kMaxDimension, false});
  const double from_ratio = static_cast<double>(m.hidden) * ratio;
  if (!width && from_ratio != std::floor(from_ratio))
    throw InputError(
        r.pointer_of("expansion_ratio"),
        fmt::format("d_model x expansion_ratio must be a whole number, got {}", from_ratio));
  m.intermediate = width.value_or(static_cast<std::int64_t>(from_ratio));
  m.activation = Activation::gelu;
  if (const auto* act = f.optional_object("ffn_act_fn")) {
    ObjectReader a(*act, f.pointer_of("ffn_act_fn"));
    const auto name = a.choice("name", {"gelu", "silu", "relu", "quick_gelu"});
    const auto approximate =
        a.has("approximate") ? a.choice("approximate", {"none", "tanh"}) : "none";
    a.finish();
    m.activation = name == "silu"          ? Activation::silu
                   : name == "relu"        ? Activation::relu
                   : name == "quick_gelu"  ? Activation::quick_gelu
                   : approximate == "tanh" ? Activation::gelu_tanh
                                           : Activation::gelu;
  }
  f.finish();
}

// MPT's tensors per unit, from what read_mpt read.
void add_mpt_tensors(ModelSpec& m, const MptAttention& attn, bool no_bias, bool qkv_bias) {
  auto add_mpt_norm = [&](UnitTensors& u, const std::string& prefix, std::int64_t n) {
    u.tensors.push_back(vec(prefix + ".weight", n));
    if (m.norm == NormKind::layernorm && !no_bias) u.tensors.push_back(vec(prefix + ".bias", n));
  };
  m.embedding.tensors.push_back(matrix("wte.weight", m.vocab, m.hidden));
  if (m.positions == PositionKind::learned)
    m.embedding.tensors.push_back(matrix("wpe.weight", m.max_positions, m.hidden));
  add_mpt_norm(m.block, "norm_1", m.hidden);
  if (attn.fused) {
    add_linear(m.block, "attn.Wqkv", m.q_width() + 2 * m.kv_width(), m.hidden, qkv_bias);
  } else {
    add_linear(m.block, "attn.Wq", m.q_width(), m.hidden, qkv_bias);
    add_linear(m.block, "attn.Wk", m.kv_width(), m.hidden, qkv_bias);
    add_linear(m.block, "attn.Wv", m.kv_width(), m.hidden, qkv_bias);
  }
  if (m.qk_norm != QkNorm::none) {
    const bool width = m.qk_norm == QkNorm::width;
    add_mpt_norm(m.block, "attn.q_ln", width ? m.q_width() : m.head_dim);
    add_mpt_norm(m.block, "attn.k_ln", width ? m.kv_width() : m.head_dim);
  }
  add_linear(m.block, "attn.out_proj", m.hidden, m.q_width(), !no_bias);
  add_mpt_norm(m.block, "norm_2", m.hidden);
  if (m.mlp == MlpKind::swiglu)
    add_linear(m.block, "ffn.gate_proj", m.intermediate, m.hidden, !no_bias);
  add_linear(m.block, "ffn.up_proj", m.intermediate, m.hidden, !no_bias);
  add_linear(m.block, "ffn.down_proj", m.hidden, m.intermediate, !no_bias);
  add_mpt_norm(m.head, "norm_f", m.hidden);
  if (!m.tied_embeddings) m.head.tensors.push_back(matrix("lm_head.weight", m.vocab, m.hidden));
}

}  // namespace

void read_mpt(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  m.hidden = dim(r, "d_model");
  m.heads = dim(r, "n_heads");
  m.layers = dim(r, "n_layers", kMaxLayers);
  m.vocab = dim(r, "vocab_size");
  m.max_positions = dim(r, "max_seq_len", 1e9);
  const auto head_dim = r.optional_integer("head_dim", Range{1, kMaxDimension, false});
  if (!head_dim && m.hidden % m.heads != 0)
    throw InputError(r.pointer_of("n_heads"),
                     fmt::format("{} heads do not divide d_model = {}", m.heads, m.hidden));
  m.head_dim = head_dim.value_or(m.hidden / m.heads);
  read_mpt_ffn(r, config, m);
  const MptAttention attn = read_mpt_attention(r, config, m);
  if (m.heads % m.kv_heads != 0)
    throw InputError(r.pointer_of("attn_config") + "/kv_n_heads",
                     fmt::format("{} key/value heads do not divide {} heads", m.kv_heads, m.heads));
  m.residual_dropout = r.optional_number("resid_pdrop", Range::between(0, 1)).value_or(0) > 0;
  m.embedding_dropout = r.optional_number("emb_pdrop", Range::between(0, 1)).value_or(0) > 0;
  const bool learned = r.optional_boolean("learned_pos_emb").value_or(true);
  m.positions = attn.alibi  ? PositionKind::alibi
                : attn.rope ? PositionKind::rotary
                : learned   ? PositionKind::learned
                            : PositionKind::none;
  m.rotary_dim = attn.rope ? m.head_dim : 0;
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(true);
  const std::string norm = r.has("norm_type")
                               ? r.choice("norm_type", {"low_precision_layernorm", "layernorm",
                                                        "rmsnorm", "low_precision_rmsnorm"})
                               : "low_precision_layernorm";
  m.norm = norm.find("rmsnorm") != std::string::npos ? NormKind::rmsnorm : NormKind::layernorm;
  const bool no_bias = r.optional_boolean("no_bias").value_or(false);
  const bool qkv_bias = r.optional_boolean("attention_bias").value_or(!no_bias);
  // The fc layers are torch's nn.Linear (Transformer Engine's are refused); the logits' scale,
  // the embeddings' gradient fraction and the FFN's padding are ops on existing tensors.
  read_fc_type(r, config);
  if (r.has("logit_scale") && config.at("logit_scale").is_string())
    r.choice("logit_scale", {"inv_sqrt_d_model"});
  else
    r.optional_number("logit_scale", Range::positive());
  r.optional_number("embedding_fraction", Range{0, 1, true});
  const bool padded_ffn = r.optional_boolean("use_pad_tok_in_ffn").value_or(true);
  const std::pair<bool, const char*> unmeasured[] = {
      {norm != "low_precision_layernorm" && norm != "low_precision_rmsnorm", "norm_type"},
      {!padded_ffn, "use_pad_tok_in_ffn"},
      {m.qk_norm != QkNorm::none && m.norm == NormKind::rmsnorm,
       "attn_config.qk_ln or qk_gn under low_precision_rmsnorm"}};
  for (const auto& [on, key] : unmeasured)
    if (on && m.unmeasured.empty()) m.unmeasured = key;
  for (const char* key : {"block_overrides", "final_logit_softcapping"})
    if (r.has(key) && !config.at(key).is_null())
      throw InputError(r.pointer_of(key), "is not supported; leave it null");
  r.ignore("block_overrides");
  r.ignore("final_logit_softcapping");
  for (const char* key : {"init_device", "init_config", "norm_eps", "name", "verbose"})
    r.ignore(key);  // initialization, an epsilon, logging

  add_mpt_tensors(m, attn, no_bias, qkv_bias);
}

}  // namespace shardplan::documents::model_detail
