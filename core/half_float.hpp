// Conversions between float and the two 16-bit float formats, for reducing bf16/f16 buffers on the
// CPU (the MPI backend) and for filling and checking them. Rounding is to nearest, ties to even;
// NaN stays NaN, overflow becomes infinity.
#pragma once

#include <cstdint>
#include <cstring>

namespace shardplan::core {

// bf16 is the upper half of an fp32: inline, as the CPU's 16-bit kernels call them per element.
// (memcpy, not std::bit_cast: CUDA sources include this as C++17.)
inline float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}
inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if (value != value) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest even on the 16 bits that are dropped.
  const std::uint32_t lsb = (bits >> 16) & 1u;
  const std::uint32_t rounded = bits + 0x7FFFu + lsb;
  return static_cast<std::uint16_t>(rounded >> 16);
}
// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits; subnormals kept.
float f16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float value);

}  // namespace shardplan::core
