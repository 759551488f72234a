// The one way a computed double (bytes, elements: the cost model counts in doubles) becomes an
// integer: rounded to the nearest, and only where int64 holds it. std::llround past int64's range
// returns an unspecified value (INT64_MIN on x86-64: a peak of −9223372036854775808 bytes).
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace shardplan::core {

// The largest count a plan carries (bytes per GPU, elements): 2^62, so that sums and differences
// of two such counts stay within int64.
inline constexpr double kMaxCount = 4611686018427387904.0;  // 2^62

// x rounded to the nearest integer; nullopt when x is not finite or |x| > kMaxCount.
std::optional<std::int64_t> rounded_count(double x);
// For a JSON document: x's rounded integer, or x itself (a JSON double) when rounded_count has
// none for it (null when x is not finite). Never a wrapped integer.
nlohmann::json count_json(double x);

}  // namespace shardplan::core
