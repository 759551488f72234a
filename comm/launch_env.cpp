#include "comm/launch_env.hpp"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "core/input_error.hpp"

namespace shardplan::comm {
namespace {

using core::InputError;

const char* process_environment(const char* name) { return std::getenv(name); }

std::string quoted(std::string_view value) { return "\"" + std::string(value) + "\""; }

// The whole value must be a decimal integer in [minimum, maximum]: no sign other than the digits'
// own, no spaces, no trailing text, so that "1 " or "2x" is an error instead of 1 or 2.
int integer_variable(const EnvironmentLookup& lookup, const char* name, long minimum, long maximum,
                     const char* expected) {
  const char* value = lookup(name);
  if (value == nullptr)
    throw InputError(name, "not set (torchrun sets it for every process it starts)");
  const std::string_view text(value);
  long parsed = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  const bool whole = !text.empty() && error == std::errc() && end == text.data() + text.size();
  if (!whole || parsed < minimum || parsed > maximum)
    throw InputError(name, std::string("must be ") + expected + ", got " + quoted(text));
  return static_cast<int>(parsed);
}

}  // namespace

bool launched_with_torchrun_environment() {
  return launched_with_torchrun_environment(process_environment);
}

bool launched_with_torchrun_environment(const EnvironmentLookup& lookup) {
  return lookup("RANK") != nullptr && lookup("WORLD_SIZE") != nullptr;
}

LaunchEnvironment read_launch_environment() { return read_launch_environment(process_environment); }

LaunchEnvironment read_launch_environment(const EnvironmentLookup& lookup) {
  constexpr long int_max = 2147483647;
  LaunchEnvironment environment;
  environment.world_size = integer_variable(lookup, "WORLD_SIZE", 1, int_max, "an integer >= 1");
  environment.rank = integer_variable(lookup, "RANK", 0, int_max, "an integer >= 0");
  if (environment.rank >= environment.world_size)
    throw InputError("RANK", "must be < WORLD_SIZE (" + std::to_string(environment.world_size) +
                                 "), got " + quoted(lookup("RANK")));
  environment.local_rank = integer_variable(lookup, "LOCAL_RANK", 0, int_max, "an integer >= 0");
  const char* address = lookup("MASTER_ADDR");
  if (address == nullptr)
    throw InputError("MASTER_ADDR", "not set (torchrun sets it for every process it starts)");
  const std::string_view address_text(address);
  if (address_text.empty() || address_text.find_first_of(" \t\r\n") != std::string_view::npos)
    throw InputError("MASTER_ADDR",
                     "must be a host name or an IPv4 address, got " + quoted(address_text));
  environment.master_addr = address_text;
  environment.master_port =
      integer_variable(lookup, "MASTER_PORT", 1, 65535, "an integer in 1..65535");
  const char* agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE");
  environment.agent_store = agent_store != nullptr && std::string_view(agent_store) == "True";
  if (environment.agent_store && environment.master_port == 65535)
    throw InputError("MASTER_PORT", "must be below 65535 when TORCHELASTIC_USE_AGENT_STORE=True "
                                    "(the exchange uses the next port), got \"65535\"");
  return environment;
}

}  // namespace shardplan::comm
