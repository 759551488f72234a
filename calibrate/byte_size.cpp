#include "calibrate/byte_size.hpp"

#include <charconv>
#include <limits>

namespace shardplan::calibrate {

std::optional<std::uint64_t> parse_byte_size(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::uint64_t multiplier = 1;
  switch (text.back()) {
  case 'K':
  case 'k':
    multiplier = 1ULL << 10;
    break;
  case 'M':
  case 'm':
    multiplier = 1ULL << 20;
    break;
  case 'G':
  case 'g':
    multiplier = 1ULL << 30;
    break;
  default:
    break;
  }
  if (multiplier != 1) text.remove_suffix(1);
  if (text.empty() || text.front() == '+' || text.front() == '-') return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (value > std::numeric_limits<std::uint64_t>::max() / multiplier) return std::nullopt;
  return value * multiplier;
}

std::string format_byte_size(std::uint64_t bytes) {
  const char* suffixes[] = {"G", "M", "K"};
  const int shifts[] = {30, 20, 10};
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t unit = 1ULL << shifts[i];
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + suffixes[i];
  }
  return std::to_string(bytes);
}

}  // namespace shardplan::calibrate
