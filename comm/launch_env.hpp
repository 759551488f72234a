// The environment torchrun gives each process it starts, read strictly, so that a program can join
// its ranks without MPI (`torchrun --no-python`, clusters without MPI). The variables are the ones
// torchrun documents for its workers (PyTorch, "torchrun (Elastic Launch)", section "Environment
// Variables"): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
#pragma once

#include <functional>
#include <string>

namespace shardplan::comm {

struct LaunchEnvironment {
  int rank = 0;             // in the whole job, 0 ≤ rank < world_size
  int world_size = 1;       // processes in the job
  int local_rank = 0;       // on this host; picks the GPU
  std::string master_addr;  // where rank 0 listens: an IPv4 address or a host name
  int master_port = 0;      // 1..65535
  // torchrun's own store already listens on MASTER_PORT (it sets TORCHELASTIC_USE_AGENT_STORE=True
  // when its agent hosts the store, torch/distributed/elastic/agent/server/api.py): the ranks'
  // exchange then uses the next port.
  bool agent_store = false;
  // The port rank 0 serves the exchange on (comm/tcp_exchange.hpp).
  int exchange_port() const { return agent_store ? master_port + 1 : master_port; }
};

// The value of a variable, or null when it is not set (std::getenv's contract). The overloads
// without one read this process's environment; tests pass their own.
using EnvironmentLookup = std::function<const char*(const char*)>;

// True when RANK and WORLD_SIZE are both set, as torchrun sets them: a program may then take its
// ranks from the environment instead of from MPI.
bool launched_with_torchrun_environment();
bool launched_with_torchrun_environment(const EnvironmentLookup& lookup);

// Every variable must be set and well formed; otherwise a core::InputError whose where() is
// the variable and whose message quotes its value (`WORLD_SIZE: must be an integer >= 1, got
// "x"`). RANK must be below WORLD_SIZE, MASTER_PORT in 1..65535, MASTER_ADDR not empty.
LaunchEnvironment read_launch_environment();
LaunchEnvironment read_launch_environment(const EnvironmentLookup& lookup);

}  // namespace shardplan::comm
