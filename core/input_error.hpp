// The one exception type for bad user input: it carries the JSON pointer (or CLI flag) of the
// offending field, and main() turns it into one line on stderr and exit code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace shardplan::core {

class InputError : public std::runtime_error {
public:
  // where: a JSON pointer ("/gpu/memory_GiB") or a flag ("--gpus"); message says what is wrong
  // and quotes the value, e.g. "must be > 0, got -8".
  InputError(std::string where, const std::string& message)
      : std::runtime_error(where + ": " + message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

private:
  std::string where_;
};

}  // namespace shardplan::core
