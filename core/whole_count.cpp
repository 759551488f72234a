#include "core/whole_count.hpp"

#include <cmath>

namespace shardplan::core {

std::optional<std::int64_t> rounded_count(double x) {
  if (!std::isfinite(x) || std::fabs(x) > kMaxCount) return std::nullopt;
  return std::llround(x);
}

nlohmann::json count_json(double x) {
  if (const auto n = rounded_count(x)) return *n;
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

}  // namespace shardplan::core
