#include <doctest/doctest.h>

#include <map>
#include <string>

#include "comm/launch_env.hpp"
#include "core/input_error.hpp"

using namespace shardplan::comm;
using shardplan::core::InputError;

namespace {

using Variables = std::map<std::string, std::string>;

// What torchrun sets for the second process of two.
Variables torchrun_variables() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

EnvironmentLookup lookup_in(const Variables& variables) {
  return [&variables](const char* name) -> const char* {
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  };
}

// The error's text when reading `variables` fails, or "" when it does not.
std::string error_reading(const Variables& variables) {
  try {
    (void)read_launch_environment(lookup_in(variables));
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

std::string error_with(const std::string& name, const std::string& value) {
  auto variables = torchrun_variables();
  variables[name] = value;
  return error_reading(variables);
}

std::string error_without(const std::string& name) {
  auto variables = torchrun_variables();
  variables.erase(name);
  return error_reading(variables);
}

}  // namespace

TEST_CASE("launch_env::reads what torchrun sets") {
  const auto variables = torchrun_variables();
  const auto environment = read_launch_environment(lookup_in(variables));
  CHECK(environment.rank == 1);
  CHECK(environment.world_size == 2);
  CHECK(environment.local_rank == 1);
  CHECK(environment.master_addr == "127.0.0.1");
  CHECK(environment.master_port == 29500);
  CHECK(environment.exchange_port() == 29500);
  CHECK(launched_with_torchrun_environment(lookup_in(variables)));
}

TEST_CASE(
    "launch_env::with torchrun's agent store on MASTER_PORT the exchange takes the next port") {
  auto variables = torchrun_variables();
  variables["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  CHECK(read_launch_environment(lookup_in(variables)).exchange_port() == 29501);
  variables["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  CHECK(read_launch_environment(lookup_in(variables)).exchange_port() == 29500);
  variables["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  variables["MASTER_PORT"] = "65535";
  CHECK(error_reading(variables) ==
        "MASTER_PORT: must be below 65535 when TORCHELASTIC_USE_AGENT_STORE=True (the exchange "
        "uses the next port), got \"65535\"");
}

TEST_CASE("launch_env::RANK and WORLD_SIZE together say torchrun started the process") {
  CHECK_FALSE(launched_with_torchrun_environment(lookup_in({})));
  CHECK_FALSE(launched_with_torchrun_environment(lookup_in({{"RANK", "0"}})));
  CHECK_FALSE(launched_with_torchrun_environment(lookup_in({{"WORLD_SIZE", "2"}})));
  CHECK(launched_with_torchrun_environment(lookup_in({{"RANK", "0"}, {"WORLD_SIZE", "1"}})));
}

TEST_CASE("launch_env::a missing variable is named") {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    CAPTURE(name);
    CHECK(error_without(name) ==
          std::string(name) + ": not set (torchrun sets it for every process it starts)");
  }
}

TEST_CASE("launch_env::WORLD_SIZE must be an integer >= 1") {
  CHECK(error_with("WORLD_SIZE", "x") == "WORLD_SIZE: must be an integer >= 1, got \"x\"");
  CHECK(error_with("WORLD_SIZE", "0") == "WORLD_SIZE: must be an integer >= 1, got \"0\"");
  CHECK(error_with("WORLD_SIZE", "") == "WORLD_SIZE: must be an integer >= 1, got \"\"");
  CHECK(error_with("WORLD_SIZE", "2 ") == "WORLD_SIZE: must be an integer >= 1, got \"2 \"");
  CHECK(error_with("WORLD_SIZE", "+2") == "WORLD_SIZE: must be an integer >= 1, got \"+2\"");
  CHECK(error_with("WORLD_SIZE", "99999999999") ==
        "WORLD_SIZE: must be an integer >= 1, got \"99999999999\"");
}

TEST_CASE("launch_env::RANK must be an integer in 0..WORLD_SIZE-1") {
  CHECK(error_with("RANK", "-1") == "RANK: must be an integer >= 0, got \"-1\"");
  CHECK(error_with("RANK", "1.0") == "RANK: must be an integer >= 0, got \"1.0\"");
  CHECK(error_with("RANK", "2") == "RANK: must be < WORLD_SIZE (2), got \"2\"");
  CHECK(error_with("RANK", "0").empty());
}

TEST_CASE("launch_env::LOCAL_RANK must be an integer >= 0") {
  CHECK(error_with("LOCAL_RANK", "-3") == "LOCAL_RANK: must be an integer >= 0, got \"-3\"");
  CHECK(error_with("LOCAL_RANK", "gpu0") == "LOCAL_RANK: must be an integer >= 0, got \"gpu0\"");
}

TEST_CASE("launch_env::MASTER_ADDR must be a host name or an address") {
  CHECK(error_with("MASTER_ADDR", "") ==
        "MASTER_ADDR: must be a host name or an IPv4 address, got \"\"");
  CHECK(error_with("MASTER_ADDR", "node 1") ==
        "MASTER_ADDR: must be a host name or an IPv4 address, got \"node 1\"");
  CHECK(error_with("MASTER_ADDR", "localhost").empty());
}

TEST_CASE("launch_env::MASTER_PORT must be in 1..65535") {
  CHECK(error_with("MASTER_PORT", "0") == "MASTER_PORT: must be an integer in 1..65535, got \"0\"");
  CHECK(error_with("MASTER_PORT", "65536") ==
        "MASTER_PORT: must be an integer in 1..65535, got \"65536\"");
  CHECK(error_with("MASTER_PORT", "http") ==
        "MASTER_PORT: must be an integer in 1..65535, got \"http\"");
  CHECK(error_with("MASTER_PORT", "65535").empty());
}

TEST_CASE("launch_env::the error's where() is the variable") {
  auto variables = torchrun_variables();
  variables.erase("MASTER_PORT");
  variables.emplace("MASTER_PORT", "x");
  std::string where;
  try {
    (void)read_launch_environment(lookup_in(variables));
  } catch (const InputError& error) {
    where = error.where();
  }
  CHECK(where == "MASTER_PORT");
}
