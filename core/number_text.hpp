// Numbers from the text a user typed (a command-line flag): decimal only, whole text, in range.
// Integers are digits with an optional leading '-' ("010" is ten); no '+', spaces, base prefixes
// (0x, 0b, 0o), digit separators or exponents. Decimal numbers ("7.5e9", "0.05") may have a
// fraction and an exponent; not hex floats ("0x1p3"), inf, nan, or values past double's range.
// Every rejection is an InputError naming the field and quoting the text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shardplan::core {

std::int64_t int64_from_text(const std::string& field, std::string_view text);
std::uint64_t uint64_from_text(const std::string& field, std::string_view text);
// An int64_from_text that also fits an int ("--gpus").
int int_from_text(const std::string& field, std::string_view text);
// A whole number in [lo, hi]: any other, however many digits it has, is refused with that range.
int bounded_int_from_text(const std::string& field, std::string_view text, int lo, int hi);
double double_from_text(const std::string& field, std::string_view text);

}  // namespace shardplan::core
