// Conversions between float and the two 16-bit float formats, for reducing bf16/f16 buffers on the
// CPU (the MPI backend) and for filling and checking them. Rounding is to nearest, ties to even;
// NaN stays NaN, overflow becomes infinity.
#pragma once

#include <cstdint>

namespace shardplan::comm {

float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);
// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits; subnormals kept.
float f16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float value);

} // namespace shardplan::comm
