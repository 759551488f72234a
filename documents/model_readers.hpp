// The config.json readers' shared parts (documents/model.cpp, and one file per architecture that
// has its own: model_mpt.cpp). Not part of the documents' interface.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/json_reader.hpp"
#include "documents/model.hpp"

namespace shardplan::documents::model_detail {

// Dimensions beyond these are absurd for any model and would overflow the 64-bit counts
// (h·V, h·I ≤ 1e7·1e7 = 1e14 per tensor; a 100T-parameter model still fits in int64 many times).
constexpr double kMaxDimension = 1e7;
constexpr double kMaxLayers = 1e5;
// The largest model, as for a bare parameter count (model_from_param_count).
constexpr double kMaxParams = 1e15;

// An object-valued key that may also be null (null: as if absent).
const nlohmann::json* object_or_null(core::ObjectReader& r, const nlohmann::json& config,
                                     const char* key);
// A positive dimension, at most `max`.
std::int64_t dim(core::ObjectReader& r, std::string_view key, double max = kMaxDimension);
Tensor matrix(std::string name, std::int64_t out, std::int64_t in);
Tensor vec(std::string name, std::int64_t n);
void add_linear(UnitTensors& u, const std::string& prefix, std::int64_t out, std::int64_t in,
                bool bias);

// The norm's weight (and a LayerNorm's bias) of width m.hidden.
void add_norm(UnitTensors& u, const std::string& prefix, const ModelSpec& m);
// Heads that divide the width (unless head_dim is given) and key/value heads that divide them.
void check_heads(const ModelSpec& m, core::ObjectReader& r, std::string_view heads_key,
                 std::string_view hidden_key, bool explicit_head_dim);
// Refuses a rotary factor below 1 (rope over whole heads only), top-level or nested.
void check_whole_head_rope(core::ObjectReader& r, const nlohmann::json& config, const ModelSpec& m);

// The Llama family's shape and code (its mixtures of experts' too): widths, heads, vocabulary,
// SwiGLU of silu, RMSNorm, rotary positions over whole heads, attention dropout; not the MLP's
// width.
void read_llama_shape(core::ObjectReader& r, const nlohmann::json& config, ModelSpec& m);

// llm-foundry's MPT (model_mpt.cpp).
void read_mpt(core::ObjectReader& r, const nlohmann::json& config, ModelSpec& m);
// transformers' mixtures of experts: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE (model_moe.cpp).
void read_moe(core::ObjectReader& r, const nlohmann::json& config, ModelSpec& m);

}  // namespace shardplan::documents::model_detail
