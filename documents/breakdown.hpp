// The categories peak memory is reported in, by the simulator and in a plan's prediction
// (/prediction/breakdown: one key per category_name).
#pragma once

#include <array>

namespace shardplan::documents {

enum class Category { parameters, gradients, optimizer_states, activations, buffers, overhead };
constexpr int kCategories = 6;
const char* category_name(Category c);  // "parameters", ..., "optimizer_states", "overhead"

using Breakdown = std::array<double, kCategories>;  // bytes per Category
double total(const Breakdown& b);

}  // namespace shardplan::documents
