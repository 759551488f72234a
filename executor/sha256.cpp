#include "executor/sha256.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace shardplan::executor {
namespace {

// §4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr std::array<std::uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// §5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8 primes.
constexpr std::array<std::uint32_t, 8> kH0 = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

// §4.1.2, functions (4.2)–(4.7).
constexpr std::uint32_t ch(std::uint32_t x, std::uint32_t y, std::uint32_t z) {
  return (x & y) ^ (~x & z);
}
constexpr std::uint32_t maj(std::uint32_t x, std::uint32_t y, std::uint32_t z) {
  return (x & y) ^ (x & z) ^ (y & z);
}
constexpr std::uint32_t big_sigma0(std::uint32_t x) {
  return std::rotr(x, 2) ^ std::rotr(x, 13) ^ std::rotr(x, 22);
}
constexpr std::uint32_t big_sigma1(std::uint32_t x) {
  return std::rotr(x, 6) ^ std::rotr(x, 11) ^ std::rotr(x, 25);
}
constexpr std::uint32_t small_sigma0(std::uint32_t x) {
  return std::rotr(x, 7) ^ std::rotr(x, 18) ^ (x >> 3);
}
constexpr std::uint32_t small_sigma1(std::uint32_t x) {
  return std::rotr(x, 17) ^ std::rotr(x, 19) ^ (x >> 10);
}

}  // namespace

Sha256::Sha256() { reset(); }

void Sha256::reset() {
  h_ = kH0;
  used_ = 0;
  length_ = 0;
}

void Sha256::compress(const std::uint8_t* block) {
  // §6.2.2 step 1: the message schedule; the block's words are big-endian (§3.1).
  std::array<std::uint32_t, 64> w{};
  for (std::size_t t = 0; t < 16; ++t)
    w[t] = std::uint32_t{block[4 * t]} << 24 | std::uint32_t{block[4 * t + 1]} << 16 |
           std::uint32_t{block[4 * t + 2]} << 8 | std::uint32_t{block[4 * t + 3]};
  for (std::size_t t = 16; t < 64; ++t)
    w[t] = small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];
  // Steps 2–4.
  auto [a, b, c, d, e, f, g, h] = h_;
  for (std::size_t t = 0; t < 64; ++t) {
    const std::uint32_t t1 = h + big_sigma1(e) + ch(e, f, g) + kK[t] + w[t];
    const std::uint32_t t2 = big_sigma0(a) + maj(a, b, c);
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  const std::array<std::uint32_t, 8> v = {a, b, c, d, e, f, g, h};
  for (std::size_t i = 0; i < 8; ++i) h_[i] += v[i];
}

void Sha256::update(std::span<const std::uint8_t> bytes) {
  length_ += bytes.size();
  std::size_t i = 0;
  if (used_ > 0) {
    const std::size_t take = std::min(bytes.size(), block_.size() - used_);
    std::memcpy(block_.data() + used_, bytes.data(), take);
    used_ += take;
    i = take;
    if (used_ < block_.size()) return;
    compress(block_.data());
    used_ = 0;
  }
  for (; i + 64 <= bytes.size(); i += 64) compress(bytes.data() + i);
  std::memcpy(block_.data(), bytes.data() + i, bytes.size() - i);
  used_ = bytes.size() - i;
}

void Sha256::update(const void* data, std::size_t bytes) {
  update({static_cast<const std::uint8_t*>(data), bytes});
}

Sha256::Digest Sha256::finish() {
  // §5.1.1: a 1 bit, zeros up to 448 mod 512 bits, then the message length in bits as a 64-bit
  // big-endian integer.
  const std::uint64_t bits = length_ * 8;
  block_[used_++] = 0x80;
  if (used_ > 56) {
    std::memset(block_.data() + used_, 0, 64 - used_);
    compress(block_.data());
    used_ = 0;
  }
  std::memset(block_.data() + used_, 0, 56 - used_);
  for (std::size_t i = 0; i < 8; ++i)
    block_[56 + i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
  compress(block_.data());
  Digest out{};
  for (std::size_t i = 0; i < 8; ++i)
    for (std::size_t j = 0; j < 4; ++j)
      out[4 * i + j] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * j));
  reset();
  return out;
}

Sha256::Digest Sha256::of(std::string_view text) {
  Sha256 s;
  s.update(text.data(), text.size());
  return s.finish();
}

std::string Sha256::hex(const Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (auto byte : digest) {
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 15]);
  }
  return out;
}

}  // namespace shardplan::executor
