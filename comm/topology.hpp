// Where the ranks run: which share a node (a host), and each rank's index on its node. Found as
// nccl-tests does: every rank hashes its host name and the hashes are gathered; ranks with equal
// hashes share a node, and a rank's local rank is the number of lower ranks on its node.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"

namespace shardplan::comm {

struct Topology {
  int rank = 0;                    // in the world
  int size = 1;                    // world size
  int node = 0;                    // this rank's node, numbered in order of the nodes' lowest ranks
  int nodes = 1;                   // number of nodes
  int local_rank = 0;              // index among the ranks of its node
  int local_size = 1;              // ranks on this rank's node
  std::vector<std::string> hosts;  // host name of every world rank
  std::vector<int> node_of_rank;   // node of every world rank
  std::vector<int> local_rank_of;  // local rank of every world rank

  // True when every node runs the same number of ranks.
  bool uniform() const;
  // Distinct host names in node order, joined by ",".
  std::string host_list() const;
};

// FNV-1a, 64 bits.
std::uint64_t host_hash(std::string_view host);
// The topology seen by `rank`, from every world rank's host name in rank order. Pure.
Topology topology_from_hosts(const std::vector<std::string>& hosts, int rank);
// Collective over `world`, which must work on host memory (the MPI world, also under NCCL).
Topology discover_topology(Communicator& world);

}  // namespace shardplan::comm
