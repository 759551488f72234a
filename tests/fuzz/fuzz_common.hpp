// What every fuzz target shares. The input bytes are one document; a parser may reject them only
// with core::InputError (the project's bad-input exception, which main() turns into one line
// and exit code 2). Anything else — another exception escaping, a crash, a sanitizer report, a
// leak, or a broken round trip (`require`) — is a finding.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/input_error.hpp"
#include "core/json_reader.hpp"

namespace shardplan::fuzz {

// The bytes as JSON, read as every document of the project is read (core::parse_json_text),
// or nothing when they are not JSON: that InputError is the expected outcome, not a finding.
inline std::optional<nlohmann::json> json_of(const std::uint8_t* data, std::size_t size) {
  try {
    return core::parse_json_text(std::string(reinterpret_cast<const char*>(data), size),
                                 "fuzz.json");
  } catch (const core::InputError&) {
    return std::nullopt;
  }
}

// Runs `f`; an InputError is the expected outcome for bad input, so it is swallowed. Whatever
// else escapes reaches libFuzzer, which reports it as a crash.
template <class F> void accept_input_error(F&& f) {
  try {
    f();
  } catch (const core::InputError&) {
  }
}

// A property that must hold for every accepted document (round trips): abort when it does not.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

// Runs `f`, which reads a document this project wrote itself: rejecting it is a finding.
template <class F> auto must_read(F&& f, const char* what) {
  try {
    return f();
  } catch (const core::InputError& e) {
    std::fprintf(stderr, "%s does not read back: %s\n", what, e.what());
    std::abort();
  }
}

// Structure-aware mutation for the JSON targets: byte-level mutation rarely turns a valid document
// into another valid one with one number at an edge, which is where the bugs of a strict reader
// are (products that overflow, values that do not survive being written back). Three times in
// four, the document is parsed, one to three values in it are replaced by an edge value, scaled,
// changed in type or removed, and the document is written again; otherwise (and when the bytes
// are not JSON) libFuzzer's own mutation runs.
extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

namespace detail {

inline void collect(nlohmann::json& j, std::vector<nlohmann::json*>& nodes, int depth) {
  nodes.push_back(&j);
  if (depth > 32 || !j.is_structured()) return;
  for (auto& child : j) collect(child, nodes, depth + 1);
}

inline nlohmann::json edge_value(std::minstd_rand& rng, const nlohmann::json& old) {
  static const nlohmann::json edges[] = {0,
                                         -1,
                                         1,
                                         2,
                                         3,
                                         7,
                                         0.5,
                                         -0.5,
                                         1e-300,
                                         1e300,
                                         -1e300,
                                         1e18,
                                         1e19,
                                         1e15,
                                         1e15 + 1,
                                         1e12,
                                         1e9,
                                         1e9 + 1,
                                         1e7,
                                         1e7 + 1,
                                         1e6,
                                         1e6 + 1,
                                         1e5,
                                         1e5 + 1,
                                         1023,
                                         1024,
                                         1025,
                                         2147483647,
                                         2147483648.0,
                                         9007199254740993,
                                         std::numeric_limits<std::int64_t>::max(),
                                         std::numeric_limits<std::int64_t>::min(),
                                         std::numeric_limits<std::uint64_t>::max(),
                                         "",
                                         "auto",
                                         "x",
                                         true,
                                         false,
                                         nullptr,
                                         nlohmann::json::object(),
                                         nlohmann::json::array()};
  constexpr std::size_t kEdges = sizeof(edges) / sizeof(edges[0]);
  if (old.is_number() && rng() % 2 == 0) {
    const double x = old.get<double>();
    switch (rng() % 5) {
    case 0:
      return x * std::pow(10.0, 1 + rng() % 6);  // toward the upper bounds
    case 1:
      return std::floor(x / 3);
    case 2:
      return -x;
    case 3:
      return x + 1;
    default:
      return x - 1;
    }
  }
  return edges[rng() % kEdges];
}

}  // namespace detail

inline std::size_t mutate_json(std::uint8_t* data, std::size_t size, std::size_t max_size,
                               unsigned seed) {
  std::minstd_rand rng(seed);
  if (rng() % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
  auto doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return LLVMFuzzerMutate(data, size, max_size);
  for (unsigned n = 1 + rng() % 3; n > 0; --n) {  // one to three changes
    std::vector<nlohmann::json*> nodes;  // collected again: a change frees the values it replaces
    detail::collect(doc, nodes, 0);
    nlohmann::json& node = *nodes[rng() % nodes.size()];
    if (node.is_object() && !node.empty() && rng() % 4 == 0) {
      auto it = node.begin();
      std::advance(it, static_cast<long>(rng() % node.size()));
      node.erase(it);  // a missing key
    } else if (&node != &doc) {
      node = detail::edge_value(rng, node);
    }
  }
  const std::string out = doc.dump();
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace shardplan::fuzz

// Use the structure-aware mutation in a JSON target.
#define SHARDPLAN_FUZZ_JSON_MUTATOR                                                                \
  extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size,             \
                                                 std::size_t max_size, unsigned int seed) {        \
    return shardplan::fuzz::mutate_json(data, size, max_size, seed);                               \
  }
