// What every fuzz target shares. The input bytes are one document; a parser may reject them only
// with costmodel::InputError (the project's bad-input exception, which main() turns into one line
// and exit code 2). Anything else — another exception escaping, a crash, a sanitizer report, a
// leak, or a broken round trip (`require`) — is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/input_error.hpp"
#include "costmodel/json_reader.hpp"

namespace shardplan::fuzz {

// The bytes as JSON, read as every document of the project is read (costmodel::parse_json_text),
// or nothing when they are not JSON: that InputError is the expected outcome, not a finding.
inline std::optional<nlohmann::json> json_of(const std::uint8_t* data, std::size_t size) {
  try {
    return costmodel::parse_json_text(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const costmodel::InputError&) {
    return std::nullopt;
  }
}

// Runs `f`; an InputError is the expected outcome for bad input, so it is swallowed. Whatever
// else escapes reaches libFuzzer, which reports it as a crash.
template <class F>
void accept_input_error(F&& f) {
  try {
    f();
  } catch (const costmodel::InputError&) {
  }
}

// A property that must hold for every accepted document (round trips): abort when it does not.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

// Runs `f`, which reads a document this project wrote itself: rejecting it is a finding.
template <class F>
auto must_read(F&& f, const char* what) {
  try {
    return f();
  } catch (const costmodel::InputError& e) {
    std::fprintf(stderr, "%s does not read back: %s\n", what, e.what());
    std::abort();
  }
}

}  // namespace shardplan::fuzz
