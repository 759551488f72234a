// transformers' mixtures of experts (5.23): MixtralForCausalLM, Qwen2MoeForCausalLM,
// Qwen3MoeForCausalLM and OlmoeForCausalLM. Their blocks are the Llama family's (RMSNorm, rotary
// positions over whole heads, grouped-query attention) with the MLP replaced by a sparse block
// (models/*/modeling_*.py, the *SparseMoeBlock classes): a router `mlp.gate` [E, h] without
// bias, E SwiGLU experts held as two fused tensors, `mlp.experts.gate_up_proj` [E, 2I, h] and
// `mlp.experts.down_proj` [E, h, I], and Qwen2-MoE's shared expert beside them. Parameter counts
// are checked against the classes themselves: tests/documents/data/moe_params.json
// (validation/measure_moe_params.py).
#include <fmt/format.h>

#include "core/json_reader.hpp"
#include "documents/model_readers.hpp"

namespace shardplan::documents::model_detail {

using core::InputError;
using core::ObjectReader;
using core::Range;

namespace {

// Each class's defaults where a config leaves a key out (configuration_*.py): routed experts,
// experts per token, and whether the k routing weights are renormalized (Mixtral always does;
// the others by norm_topk_prob, false by default).
struct MoeDefaults {
  std::int64_t experts, top_k;
  bool normalize_top_k;
  double aux_loss_coef;  // router_aux_loss_coef
};
MoeDefaults defaults_of(Architecture a) {
  switch (a) {
  case Architecture::mixtral:
    return {8, 2, true, 0.001};
  case Architecture::qwen2_moe:
    return {60, 4, false, 0.001};
  case Architecture::qwen3_moe:
    return {128, 8, false, 0.001};
  default:  // olmoe
    return {64, 8, false, 0.01};
  }
}

// The routed experts' count: the class's key or its alias (each config's attribute_map maps
// num_local_experts and num_experts onto one attribute; Qwen3-MoE saves the former).
std::int64_t read_expert_count(ObjectReader& r, std::int64_t fallback) {
  const auto local = r.optional_integer("num_local_experts", Range{1, 1e6, false});
  const auto experts = r.optional_integer("num_experts", Range{1, 1e6, false});
  if (local && experts && *local != *experts)
    throw InputError(
        r.pointer_of("num_experts"),
        fmt::format("names the same count as num_local_experts ({}), got {}", *local, *experts));
  return local.value_or(experts.value_or(fallback));
}

// Every block must be the same sparse block: Qwen2-MoE and Qwen3-MoE make block i dense where i is
// in mlp_only_layers or (i + 1) % decoder_sparse_step != 0, and their use_sliding_window gives the
// layers from max_window_layers on a window (layer_types names each block's attention).
void read_uniform_blocks(ObjectReader& r, const nlohmann::json& config, const ModelSpec& m) {
  const auto step = r.optional_integer("decoder_sparse_step", Range{1, 1e6, false}).value_or(1);
  if (step != 1 && m.layers > 1)
    throw InputError(r.pointer_of("decoder_sparse_step"),
                     fmt::format("{} makes every block but each {}th dense; blocks that differ "
                                 "are not supported, got {}",
                                 step, step, step));
  if (r.has("mlp_only_layers") && !config.at("mlp_only_layers").is_null()) {
    const auto& dense = r.array("mlp_only_layers");
    if (!dense.empty())
      throw InputError(r.pointer_of("mlp_only_layers"),
                       "dense blocks beside sparse ones are not supported, got " +
                           core::describe_value(dense));
  } else {
    r.ignore("mlp_only_layers");
  }
  if (r.optional_boolean("use_sliding_window").value_or(false))
    throw InputError(r.pointer_of("use_sliding_window"),
                     "windowed blocks beside full ones are not supported, got true");
  r.ignore("sliding_window");  // read only under use_sliding_window
  r.ignore("max_window_layers");
  if (r.has("layer_types") && !config.at("layer_types").is_null())
    for (const auto& t : r.array("layer_types"))
      if (t != "full_attention")
        throw InputError(r.pointer_of("layer_types"),
                         "every block's attention must be \"full_attention\", got " +
                             core::describe_value(t));
  r.ignore("layer_types");
}

// The attention's tensors: q, k, v, o (biases as the class gives them), and Qwen3-MoE's per-head
// or OLMoE's whole-width norms on q and k.
void add_attention(ModelSpec& m, bool qkv_bias, bool out_bias) {
  add_linear(m.block, "self_attn.q_proj", m.q_width(), m.hidden, qkv_bias);
  add_linear(m.block, "self_attn.k_proj", m.kv_width(), m.hidden, qkv_bias);
  add_linear(m.block, "self_attn.v_proj", m.kv_width(), m.hidden, qkv_bias);
  add_linear(m.block, "self_attn.o_proj", m.hidden, m.q_width(), out_bias);
  if (m.qk_norm == QkNorm::head) {  // Qwen3MoeRMSNorm(head_dim), one weight shared by the heads
    m.block.tensors.push_back(vec("self_attn.q_norm.weight", m.head_dim));
    m.block.tensors.push_back(vec("self_attn.k_norm.weight", m.head_dim));
  } else if (m.qk_norm == QkNorm::width) {  // OlmoeRMSNorm over the whole q and k
    m.block.tensors.push_back(vec("self_attn.q_norm.weight", m.q_width()));
    m.block.tensors.push_back(vec("self_attn.k_norm.weight", m.kv_width()));
  }
}

// The sparse MLP: the router, the routed experts fused, the shared expert and its gate.
void add_sparse_mlp(ModelSpec& m) {
  const auto& e = m.moe;
  add_linear(m.block, "mlp.gate", e.experts, m.hidden, false);
  m.block.tensors.push_back(
      {"mlp.experts.gate_up_proj", 2 * e.expert_intermediate, m.hidden, e.experts});
  m.block.tensors.push_back({"mlp.experts.down_proj", m.hidden, e.expert_intermediate, e.experts});
  if (e.shared_intermediate > 0) {
    add_linear(m.block, "mlp.shared_expert.gate_proj", e.shared_intermediate, m.hidden, false);
    add_linear(m.block, "mlp.shared_expert.up_proj", e.shared_intermediate, m.hidden, false);
    add_linear(m.block, "mlp.shared_expert.down_proj", m.hidden, e.shared_intermediate, false);
  }
  if (e.shared_gate) add_linear(m.block, "mlp.shared_expert_gate", 1, m.hidden, false);
}

// Each architecture's own keys: the expert width, the attention's biases and norms, its window.
// Returns {qkv bias, o bias}.
std::pair<bool, bool> read_architecture_keys(ObjectReader& r, const nlohmann::json& config,
                                             ModelSpec& m) {
  auto& e = m.moe;
  switch (m.architecture) {
  case Architecture::mixtral:
    // MixtralSparseMoeBlock: experts of intermediate_size; jitter noise multiplies the router's
    // input in training; sliding_window (None by default) applies to every layer.
    e.expert_intermediate = dim(r, "intermediate_size");
    e.router_jitter =
        r.optional_number("router_jitter_noise", Range::between(0, 1)).value_or(0) > 0;
    m.sliding_window = r.optional_integer("sliding_window", Range{1, 1e12, false}).value_or(0);
    return {false, false};
  case Architecture::qwen2_moe:
    // Qwen2MoeSparseMoeBlock: experts of moe_intermediate_size and always a shared expert of
    // shared_expert_intermediate_size under a sigmoid gate; q, k, v biased by qkv_bias (true
    // by default), o never; intermediate_size only sizes dense blocks (none here).
    e.expert_intermediate = dim(r, "moe_intermediate_size");
    e.shared_intermediate = dim(r, "shared_expert_intermediate_size");
    e.shared_gate = true;
    dim(r, "intermediate_size");
    read_uniform_blocks(r, config, m);
    return {r.optional_boolean("qkv_bias").value_or(true), false};
  case Architecture::qwen3_moe: {
    // Qwen3MoeAttention: attention_bias on q, k, v and o; q_norm and k_norm per head.
    e.expert_intermediate = dim(r, "moe_intermediate_size");
    dim(r, "intermediate_size");
    m.qk_norm = QkNorm::head;
    read_uniform_blocks(r, config, m);
    const bool bias = r.optional_boolean("attention_bias").value_or(false);
    return {bias, bias};
  }
  default: {  // olmoe
    // OlmoeAttention: attention_bias on q, k, v and o; q_norm over the q width and k_norm over
    // (h / heads)·kv_heads, which is the k width only where head_dim is h / heads; clip_qkv
    // clamps q, k and v.
    e.expert_intermediate = dim(r, "intermediate_size");
    m.qk_norm = QkNorm::width;
    if (m.head_dim * m.heads != m.hidden)
      throw InputError(r.pointer_of("head_dim"),
                       fmt::format("OLMoE's k_norm spans (hidden_size / heads) x key/value heads; "
                                   "a head_dim other than {} is not supported, got {}",
                                   m.hidden / m.heads, m.head_dim));
    if (r.has("clip_qkv") && !config.at("clip_qkv").is_null())
      m.clip_qkv = r.number("clip_qkv", Range{0, 1e9, true}) > 0;
    else
      r.ignore("clip_qkv");
    const bool bias = r.optional_boolean("attention_bias").value_or(false);
    return {bias, bias};
  }
  }
}

}  // namespace

void read_moe(ObjectReader& r, const nlohmann::json& config, ModelSpec& m) {
  const MoeDefaults d = defaults_of(m.architecture);
  read_llama_shape(r, config, m);

  auto& e = m.moe;
  e.experts = read_expert_count(r, d.experts);
  e.top_k = r.optional_integer("num_experts_per_tok", Range{1, 1e6, false}).value_or(d.top_k);
  if (e.top_k > e.experts)
    throw InputError(r.pointer_of("num_experts_per_tok"),
                     fmt::format("routes each token to more experts than the {} there are, got {}",
                                 e.experts, e.top_k));
  e.normalize_top_k = m.architecture == Architecture::mixtral ||
                      r.optional_boolean("norm_topk_prob").value_or(d.normalize_top_k);
  // MixtralSparseMoeBlock's router returns its fp32 top-k weights as they are; the others cast
  // them to the router logits' dtype (router_top_value.to(router_logits.dtype)).
  e.fp32_routing_weights = m.architecture == Architecture::mixtral;
  // output_router_logits: the ForCausalLM classes then add router_aux_loss_coef times the
  // load-balancing loss (load_balancing_loss_func over every block's router logits).
  const double coef =
      r.optional_number("router_aux_loss_coef", Range{0, 1e6, false}).value_or(d.aux_loss_coef);
  e.aux_loss_coef = r.optional_boolean("output_router_logits").value_or(false) ? coef : 0;
  const auto [qkv_bias, out_bias] = read_architecture_keys(r, config, m);
  m.intermediate = e.expert_intermediate;  // each routed expert's SwiGLU width

  m.embedding.tensors.push_back(matrix("embed_tokens.weight", m.vocab, m.hidden));
  add_norm(m.block, "input_layernorm", m);
  add_attention(m, qkv_bias, out_bias);
  add_norm(m.block, "post_attention_layernorm", m);
  add_sparse_mlp(m);
  add_norm(m.head, "norm", m);
  if (!m.tied_embeddings) m.head.tensors.push_back(matrix("lm_head.weight", m.vocab, m.hidden));
}

}  // namespace shardplan::documents::model_detail
