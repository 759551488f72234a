// SHA-256 (NIST FIPS 180-4, "Secure Hash Standard", 2015), streaming: the checksums of checkpoint
// files and the run document's parameter hashes. Byte-oriented: messages are whole bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace shardplan::executor {

class Sha256 {
public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();
  void update(std::span<const std::uint8_t> bytes);
  void update(const void* data, std::size_t bytes);
  // Pads the message (§5.1.1) and returns H(N) (§6.2.2 step 4, words big-endian). The object is
  // then reset for a new message.
  Digest finish();

  static Digest of(std::string_view text);
  // 64 lowercase hexadecimal digits, as sha256sum prints.
  static std::string hex(const Digest& digest);

private:
  void compress(const std::uint8_t* block);  // one 512-bit block, §6.2.2
  void reset();

  std::array<std::uint32_t, 8> h_{};
  std::array<std::uint8_t, 64> block_{};
  std::size_t used_ = 0;      // bytes waiting in block_
  std::uint64_t length_ = 0;  // message bytes so far
};

}  // namespace shardplan::executor
