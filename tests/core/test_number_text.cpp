// Numbers from flag text: decimal only, the whole text, in range; every rejection names the field.
// Numbers computed in doubles become integers only where int64 holds them.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/input_error.hpp"
#include "core/number_text.hpp"
#include "core/whole_count.hpp"

using namespace shardplan::core;

TEST_CASE("number_text::integers are decimal: 010 is ten, 0x10 and 08 are not special") {
  CHECK(int64_from_text("--gpus", "010") == 10);
  CHECK(int64_from_text("--gpus", "08") == 8);
  CHECK(int64_from_text("--gpus", "0") == 0);
  CHECK(int64_from_text("--gpus", "-5") == -5);
  CHECK(int_from_text("--gpus", "16") == 16);
  for (const char* bad : {"0x10", "0X10", "0b11", "0o7", "+5", " 5", "5 ", "1e3", "1.0", "1_000",
                          "", "-", "--5", "five", "5x"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(
        int64_from_text("--gpus", bad),
        ("--gpus: must be a whole decimal number, got \"" + std::string(bad) + "\"").c_str(),
        InputError);
  }
}

TEST_CASE("number_text::out of range is refused, never clamped") {
  CHECK(uint64_from_text("--seed", "18446744073709551615") ==
        std::numeric_limits<std::uint64_t>::max());
  CHECK(uint64_from_text("--seed", "0") == 0);
  CHECK(int64_from_text("--x", "9223372036854775807") == std::numeric_limits<std::int64_t>::max());
  CHECK(int64_from_text("--x", "-9223372036854775808") == std::numeric_limits<std::int64_t>::min());
  CHECK_THROWS_WITH_AS(
      uint64_from_text("--seed", "18446744073709551616"),
      "--seed: must be between 0 and 18446744073709551615, got \"18446744073709551616\"",
      InputError);
  CHECK_THROWS_WITH_AS(
      uint64_from_text("--seed", "99999999999999999999"),
      "--seed: must be between 0 and 18446744073709551615, got \"99999999999999999999\"",
      InputError);
  CHECK_THROWS_WITH_AS(uint64_from_text("--seed", "-1"),
                       "--seed: must be between 0 and 18446744073709551615, got \"-1\"",
                       InputError);
  CHECK_THROWS_AS(int64_from_text("--x", "9223372036854775808"), InputError);
  CHECK_THROWS_WITH_AS(int_from_text("--gpus", "5000000000"),
                       "--gpus: must be between -2147483648 and 2147483647, got \"5000000000\"",
                       InputError);
}

TEST_CASE("number_text::a bounded integer says its range for every number outside it") {
  CHECK(bounded_int_from_text("--tensor-parallel", "8", 1, 64) == 8);
  CHECK(bounded_int_from_text("--tensor-parallel", "-3", -5, 5) == -3);
  // 0, a number past int, and one past int64 get the same message.
  for (const char* outside :
       {"0", "65", "-1", "2147483648", "9223372036854775808", "99999999999999999999999"}) {
    CAPTURE(outside);
    CHECK_THROWS_WITH_AS(
        bounded_int_from_text("--tensor-parallel", outside, 1, 64),
        ("--tensor-parallel: must be between 1 and 64, got \"" + std::string(outside) + "\"")
            .c_str(),
        InputError);
  }
  for (const char* bad : {"", "-", "0x8", "8.0", "eight"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(
        bounded_int_from_text("--tensor-parallel", bad, 1, 64),
        ("--tensor-parallel: must be a whole decimal number, got \"" + std::string(bad) + "\"")
            .c_str(),
        InputError);
  }
}

TEST_CASE("number_text::decimal numbers: no hex floats, inf, nan or overflow") {
  CHECK(double_from_text("--params", "7.5e9") == 7.5e9);
  CHECK(double_from_text("--params", "7.5E+9") == 7.5e9);
  CHECK(double_from_text("--headroom", "0.05") == 0.05);
  CHECK(double_from_text("--headroom", ".5") == 0.5);
  CHECK(double_from_text("--x", "-2") == -2);
  CHECK(double_from_text("--x", "010") == 10);
  for (const char* bad :
       {"0x1p3", "0x10", "inf", "-inf", "nan", "infinity", "+1", "1e", "", ".", " 1", "1,5"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(
        double_from_text("--params", bad),
        ("--params: must be a decimal number, got \"" + std::string(bad) + "\"").c_str(),
        InputError);
  }
  CHECK_THROWS_WITH_AS(double_from_text("--params", "1e400"),
                       "--params: must be a finite number within double's range, got \"1e400\"",
                       InputError);
}

TEST_CASE("whole_count::a double becomes an integer only where int64 holds it, never wrapped") {
  CHECK(rounded_count(2.5e9) == 2500000000);
  CHECK(rounded_count(0.4) == 0);
  CHECK(rounded_count(kMaxCount) == std::int64_t{1} << 62);
  CHECK_FALSE(rounded_count(1e19).has_value());  // std::llround: INT64_MIN on x86-64
  CHECK_FALSE(rounded_count(-1e19).has_value());
  CHECK_FALSE(rounded_count(std::numeric_limits<double>::infinity()).has_value());
  CHECK_FALSE(rounded_count(std::numeric_limits<double>::quiet_NaN()).has_value());
  CHECK(count_json(1234.4) == 1234);
  CHECK(count_json(1234.4).is_number_integer());
  CHECK(count_json(3.59e21).is_number_float());
  CHECK(count_json(3.59e21).get<double>() == 3.59e21);
  CHECK(count_json(std::numeric_limits<double>::infinity()).is_null());
}
