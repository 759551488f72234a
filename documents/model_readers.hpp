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

// llm-foundry's MPT (model_mpt.cpp).
void read_mpt(core::ObjectReader& r, const nlohmann::json& config, ModelSpec& m);

}  // namespace shardplan::documents::model_detail
