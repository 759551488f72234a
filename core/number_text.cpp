#include "core/number_text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

#include "core/input_error.hpp"

namespace shardplan::core {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// std::from_chars in base 10 over the whole text: no '+', no spaces, no prefixes.
template <class T> T whole_number(const std::string& field, std::string_view text) {
  const bool digits =
      !text.empty() && (is_digit(text.front()) || (text.front() == '-' && text.size() > 1));
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool negative_unsigned = std::is_unsigned_v<T> && digits && text.front() == '-' &&
                                 std::all_of(text.begin() + 1, text.end(), is_digit);
  if (!negative_unsigned && (!digits || end != text.data() + text.size() ||
                             (error != std::errc() && error != std::errc::result_out_of_range)))
    throw InputError(field, fmt::format("must be a whole decimal number, got \"{}\"", text));
  if (error == std::errc::result_out_of_range || negative_unsigned)
    throw InputError(field, fmt::format("must be between {} and {}, got \"{}\"",
                                        std::numeric_limits<T>::min(),
                                        std::numeric_limits<T>::max(), text));
  return value;
}

}  // namespace

std::int64_t int64_from_text(const std::string& field, std::string_view text) {
  return whole_number<std::int64_t>(field, text);
}

std::uint64_t uint64_from_text(const std::string& field, std::string_view text) {
  return whole_number<std::uint64_t>(field, text);
}

int int_from_text(const std::string& field, std::string_view text) {
  return whole_number<int>(field, text);
}

int bounded_int_from_text(const std::string& field, std::string_view text, int lo, int hi) {
  const bool integer = text.find_first_not_of("0123456789", text.starts_with('-') ? 1 : 0) ==
                           std::string_view::npos &&
                       text.size() > (text.starts_with('-') ? 1u : 0u);
  const auto out_of_range = [&] {
    return InputError(field, fmt::format("must be between {} and {}, got \"{}\"", lo, hi, text));
  };
  if (!integer) whole_number<std::int64_t>(field, text);  // throws, naming the text
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || value < lo || value > hi) throw out_of_range();
  return static_cast<int>(value);
}

double double_from_text(const std::string& field, std::string_view text) {
  // Digits, '.', an exponent and signs only: std::from_chars would also read "inf" and "nan".
  bool plain = !text.empty() && text.front() != '+';
  for (char c : text)
    plain = plain && (is_digit(c) || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+');
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!plain || end != text.data() + text.size() ||
      (error != std::errc() && error != std::errc::result_out_of_range))
    throw InputError(field, fmt::format("must be a decimal number, got \"{}\"", text));
  if (error == std::errc::result_out_of_range || !std::isfinite(value))
    throw InputError(
        field, fmt::format("must be a finite number within double's range, got \"{}\"", text));
  return value;
}

}  // namespace shardplan::core
