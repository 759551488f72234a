#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/half_float.hpp"

using namespace shardplan::core;

TEST_CASE("half_float::bf16 keeps the top 16 bits of a float, rounding to nearest even") {
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  CHECK(float_to_bf16(-2.0f) == 0xC000);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  CHECK(float_to_bf16(1.00390625f) == 0x3F80);
  // 1 + 3·2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  CHECK(float_to_bf16(1.01171875f) == 0x3F82);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
  for (int i = -256; i <= 256; ++i)
    CHECK(bf16_to_float(float_to_bf16(static_cast<float>(i))) == static_cast<float>(i));
}

TEST_CASE("half_float::f16 encodes normals, subnormals, overflow and NaN as IEEE binary16") {
  CHECK(float_to_f16(1.0f) == 0x3C00);
  CHECK(float_to_f16(-2.0f) == 0xC000);
  CHECK(float_to_f16(65504.0f) == 0x7BFF);  // the largest finite half
  CHECK(float_to_f16(65520.0f) == 0x7C00);  // rounds up to infinity
  CHECK(float_to_f16(65519.0f) == 0x7BFF);
  CHECK(float_to_f16(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(float_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(float_to_f16(std::ldexp(1.0f, -26)) == 0x0000);  // a quarter of it rounds to zero
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_float(0x3555) == doctest::Approx(0.333251953125));
  // 1 + 2^-11 is halfway between 1.0 and 1 + 2^-10: ties to even (1.0).
  CHECK(float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  CHECK(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(f16_to_float(0x7C00)));
  for (int i = -2048; i <= 2048; ++i)
    CHECK(f16_to_float(float_to_f16(static_cast<float>(i))) == static_cast<float>(i));
}

TEST_CASE("half_float::every f16 value survives the round trip through float") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = f16_to_float(h);
    if (std::isnan(f)) continue;
    if (float_to_f16(f) != h) ++mismatches;
  }
  CHECK(mismatches == 0);
}
