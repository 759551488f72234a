// Reading and writing elements of any DataType as doubles, for filling buffers and checking sums.
#pragma once

#include <cstdint>
#include <cstring>

#include "comm/data_type.hpp"
#include "core/half_float.hpp"

namespace shardplan::comm::testing {

inline void store(DataType type, void* base, std::size_t index, double value) {
  auto* at = static_cast<std::byte*>(base) + index * element_bytes(type);
  auto put = [&](auto v) { std::memcpy(at, &v, sizeof v); };
  switch (type) {
  case DataType::f32:
    put(static_cast<float>(value));
    break;
  case DataType::f64:
    put(value);
    break;
  case DataType::bf16:
    put(core::float_to_bf16(static_cast<float>(value)));
    break;
  case DataType::f16:
    put(core::float_to_f16(static_cast<float>(value)));
    break;
  case DataType::i32:
    put(static_cast<std::int32_t>(value));
    break;
  case DataType::i64:
    put(static_cast<std::int64_t>(value));
    break;
  case DataType::u8:
    put(static_cast<std::uint8_t>(value));
    break;
  }
}

inline double load(DataType type, const void* base, std::size_t index) {
  const auto* at = static_cast<const std::byte*>(base) + index * element_bytes(type);
  auto get = [&](auto v) {
    std::memcpy(&v, at, sizeof v);
    return v;
  };
  switch (type) {
  case DataType::f32:
    return static_cast<double>(get(0.0f));
  case DataType::f64:
    return get(0.0);
  case DataType::bf16:
    return static_cast<double>(core::bf16_to_float(get(std::uint16_t{0})));
  case DataType::f16:
    return static_cast<double>(core::f16_to_float(get(std::uint16_t{0})));
  case DataType::i32:
    return static_cast<double>(get(std::int32_t{0}));
  case DataType::i64:
    return static_cast<double>(get(std::int64_t{0}));
  case DataType::u8:
    return static_cast<double>(get(std::uint8_t{0}));
  }
  return 0.0;
}

// Small integers, exact in every type and in every sum over up to 4 ranks (at most 50).
inline double pattern(int rank, std::size_t index) {
  return static_cast<double>((rank + 1) * static_cast<int>(index % 5 + 1));
}

}  // namespace shardplan::comm::testing
