// Helpers the test suites share.
#pragma once

#include <string>

#include "core/input_error.hpp"

namespace shardplan::test {

// The message of the core::InputError that f() throws ("WHERE: MESSAGE"), or "no error" when
// it throws none. Any other exception goes on to the test case.
std::string error_of(auto&& f) {
  try {
    f();
  } catch (const core::InputError& e) {
    return e.what();
  }
  return "no error";
}

// Whether `text` holds `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace shardplan::test
