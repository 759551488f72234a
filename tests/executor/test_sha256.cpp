// SHA-256 against the test vectors of FIPS 180-4's examples (NIST CSRC "Cryptographic Standards
// and Guidelines: Examples with Intermediate Values", SHA256.pdf and SHA2_Additional.pdf).
#include <doctest/doctest.h>

#include <string>

#include "executor/sha256.hpp"

using shardplan::executor::Sha256;

namespace {

std::string hex_of(std::string_view text) { return Sha256::hex(Sha256::of(text)); }

}  // namespace

TEST_CASE("sha256::FIPS 180-4 test vectors") {
  // One block.
  CHECK(hex_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // The empty message: one block of padding only.
  CHECK(hex_of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // 448 bits: the length no longer fits the first block, padding takes a second one.
  CHECK(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // 896 bits.
  CHECK(hex_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
               "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  // One million 'a'.
  CHECK(hex_of(std::string(1'000'000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256::a message fed in pieces hashes as one") {
  const std::string message(1000, 'x');
  const auto whole = Sha256::of(message);
  for (std::size_t piece : {1u, 3u, 55u, 63u, 64u, 65u, 127u, 999u}) {
    CAPTURE(piece);
    Sha256 h;
    for (std::size_t at = 0; at < message.size(); at += piece)
      h.update(message.data() + at, std::min(piece, message.size() - at));
    CHECK(h.finish() == whole);
  }
  // finish() resets: the object hashes a new message.
  Sha256 h;
  h.update("abc", 3);
  h.finish();
  CHECK(Sha256::hex(h.finish()) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}
