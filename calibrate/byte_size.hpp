// Byte counts on the command line, as nccl-tests' -b/-e take them: an integer with an optional
// suffix K, M or G (either case), binary multiples (1K = 1024).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardplan::calibrate {

// std::nullopt when the text is not such a size (or overflows 64 bits).
std::optional<std::uint64_t> parse_byte_size(std::string_view text);
// The shortest exact rendering with a suffix: 8, 64K, 32M, 1G, 1536.
std::string format_byte_size(std::uint64_t bytes);

}  // namespace shardplan::calibrate
