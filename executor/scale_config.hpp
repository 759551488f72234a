// `executor scale-config`: writes the Hugging Face config.json of a scaled-down copy of a model
// (scaled_model.hpp), so that the planner plans exactly the model the executor runs. The executor
// applies no dropout, so the written config has every dropout rate at 0: the cost model then
// counts no dropout masks either.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "executor/scaled_model.hpp"

namespace shardplan::executor {

// The config.json of `source` (a preset or a config.json path) scaled to `size`, dropout 0.
// Throws core::InputError.
nlohmann::json scaled_config(const std::string& source, const ScaledSize& size);

}  // namespace shardplan::executor
