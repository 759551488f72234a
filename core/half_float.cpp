#include "core/half_float.hpp"

#include <bit>
#include <cmath>

namespace shardplan::core {

float f16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa · 2^-24.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F)  // infinity or NaN
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

std::uint16_t float_to_f16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
  if (std::isnan(value)) return static_cast<std::uint16_t>(sign | 0x7E00u);
  if (magnitude_bits >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65536
  if (magnitude_bits < 0x38800000u) {
    // Below the smallest normal (2^-14): a subnormal, in units of 2^-24, rounded to nearest even.
    const float magnitude = std::bit_cast<float>(magnitude_bits);
    const float units = std::nearbyint(std::ldexp(magnitude, 24));  // default mode: ties to even
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(units));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even;
  // a carry out of the mantissa correctly bumps the exponent (up to infinity).
  const std::uint32_t rebased = magnitude_bits - (112u << 23);
  const std::uint32_t lsb = (rebased >> 13) & 1u;
  const std::uint32_t rounded = (rebased + 0xFFFu + lsb) >> 13;
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(rounded));
}

}  // namespace shardplan::core
