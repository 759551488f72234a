#include "executor/scaled_model.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/input_error.hpp"

namespace shardplan::executor {
namespace {

using core::InputError;
using documents::Architecture;
using documents::ModelSpec;

bool has_tensor(const documents::UnitTensors& unit, const std::string& name) {
  return std::any_of(unit.tensors.begin(), unit.tensors.end(),
                     [&](const documents::Tensor& t) { return t.name == name; });
}

double dropout(bool on) { return on ? 0.1 : 0.0; }

// The size with its defaults filled in from the source model, checked against its architecture.
ScaledSize complete_size(const ModelSpec& source, const ScaledSize& size) {
  ScaledSize s = size;
  if (s.layers < 1 || s.hidden < 1 || s.heads < 1 || s.vocab < 1)
    throw InputError("--scale", fmt::format("layers, hidden, heads and vocab must be >= 1, got "
                                            "{}, {}, {}, {}",
                                            s.layers, s.hidden, s.heads, s.vocab));
  if (s.kv_heads == 0)
    s.kv_heads = std::max<std::int64_t>(1, s.heads * source.kv_heads / source.heads);
  if (s.intermediate == 0)
    s.intermediate = std::max<std::int64_t>(1, s.hidden * source.intermediate / source.hidden);
  if (s.max_positions == 0) s.max_positions = source.max_positions;
  if (s.head_dim == 0) {
    if (s.hidden % s.heads != 0)
      throw InputError("--scale",
                       fmt::format("{} heads do not divide hidden {}", s.heads, s.hidden));
    s.head_dim = s.hidden / s.heads;
  }
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0)
    throw InputError("--scale",
                     fmt::format("{} key/value heads do not divide {} heads", s.kv_heads, s.heads));

  const bool llama_family = source.architecture == Architecture::llama ||
                            source.architecture == Architecture::mistral ||
                            source.architecture == Architecture::qwen2;
  if (!llama_family && s.kv_heads != s.heads)
    throw InputError("--scale", fmt::format("{} has no grouped-query attention (kv_heads {} != "
                                            "heads {})",
                                            documents::architecture_name(source.architecture),
                                            s.kv_heads, s.heads));
  if (!llama_family && s.head_dim * s.heads != s.hidden)
    throw InputError("--scale", fmt::format("{} needs head_dim = hidden / heads",
                                            documents::architecture_name(source.architecture)));
  return s;
}

// The Hugging Face config.json of the scaled model, in the keys of the source's architecture.
nlohmann::json scaled_config(const ModelSpec& source, const ScaledSize& s) {
  nlohmann::json config = {{"architectures", {documents::architecture_name(source.architecture)}}};
  switch (source.architecture) {
  case Architecture::mpt:
    throw core::InputError("/architectures",
                           "the executor runs GPT-2's, the Llama family's and GPT-NeoX's blocks, "
                           "not MPT's (its ALiBi and low-precision norms)");
  case Architecture::gpt2:
    config.update({{"n_embd", s.hidden},
                   {"n_layer", s.layers},
                   {"n_head", s.heads},
                   {"n_inner", s.intermediate},
                   {"vocab_size", s.vocab},
                   {"n_positions", s.max_positions},
                   {"tie_word_embeddings", source.tied_embeddings},
                   {"attn_pdrop", dropout(source.attention_dropout)},
                   {"resid_pdrop", dropout(source.residual_dropout)}});
    break;
  case Architecture::gpt_neox:
    config.update({{"hidden_size", s.hidden},
                   {"num_hidden_layers", s.layers},
                   {"num_attention_heads", s.heads},
                   {"intermediate_size", s.intermediate},
                   {"vocab_size", s.vocab},
                   {"max_position_embeddings", s.max_positions},
                   {"tie_word_embeddings", source.tied_embeddings},
                   {"use_parallel_residual", source.parallel_residual},
                   {"attention_bias", has_tensor(source.block, "attention.query_key_value.bias")},
                   {"attention_dropout", dropout(source.attention_dropout)}});
    break;
  default:
    config.update({{"hidden_size", s.hidden},
                   {"num_hidden_layers", s.layers},
                   {"num_attention_heads", s.heads},
                   {"num_key_value_heads", s.kv_heads},
                   {"head_dim", s.head_dim},
                   {"intermediate_size", s.intermediate},
                   {"vocab_size", s.vocab},
                   {"max_position_embeddings", s.max_positions},
                   {"tie_word_embeddings", source.tied_embeddings},
                   {"hidden_act", "silu"},
                   {"attention_dropout", dropout(source.attention_dropout)}});
    if (source.architecture == Architecture::llama)
      config.update({{"attention_bias", has_tensor(source.block, "self_attn.q_proj.bias")},
                     {"mlp_bias", has_tensor(source.block, "mlp.gate_proj.bias")}});
    break;
  }
  return config;
}

}  // namespace

ModelSpec scale_down(const ModelSpec& source, const ScaledSize& size) {
  if (source.architecture == Architecture::uniform)
    throw InputError("--scale", "a bare parameter count has no architecture to scale down");
  const ScaledSize s = complete_size(source, size);
  const nlohmann::json config = scaled_config(source, s);
  const std::string name =
      fmt::format("{} scaled to L={} h={} a={} kv={} d={} I={} V={}", source.name, s.layers,
                  s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab);
  try {
    ModelSpec scaled = documents::model_from_hf_config(config, name);
    scaled.residual_dropout = source.residual_dropout;
    return scaled;
  } catch (const InputError& e) {
    // The config's key came from a flag: the message names the flag the user typed.
    static const std::pair<const char*, const char*> kFlagOf[] = {
        {"/n_layer", "--layers"},
        {"/num_hidden_layers", "--layers"},
        {"/n_embd", "--hidden"},
        {"/hidden_size", "--hidden"},
        {"/n_head", "--heads"},
        {"/num_attention_heads", "--heads"},
        {"/num_key_value_heads", "--kv-heads"},
        {"/head_dim", "--head-dim"},
        {"/n_inner", "--intermediate"},
        {"/intermediate_size", "--intermediate"},
        {"/vocab_size", "--vocab"},
        {"/n_positions", "--max-positions"},
        {"/max_position_embeddings", "--max-positions"}};
    for (const auto& [key, flag] : kFlagOf)
      if (e.where() == key) {
        const std::string what = e.what();
        throw InputError(flag, what.substr(std::min(what.size(), e.where().size() + 2)));
      }
    throw;
  }
}

}  // namespace shardplan::executor
