#include "comm/topology.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "comm/process_identity.hpp"

namespace shardplan::comm {
namespace {
constexpr std::size_t kHostNameBytes = 256;  // gathered per rank, NUL-padded
}  // namespace

bool Topology::uniform() const {
  std::vector<int> per_node(static_cast<std::size_t>(nodes), 0);
  for (int n : node_of_rank) ++per_node[static_cast<std::size_t>(n)];
  return std::all_of(per_node.begin(), per_node.end(), [&](int c) { return c == per_node[0]; });
}

std::string Topology::host_list() const {
  std::string list;
  int listed = -1;
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    if (node_of_rank[r] <= listed) continue;
    listed = node_of_rank[r];
    if (!list.empty()) list += ",";
    list += hosts[r];
  }
  return list;
}

std::uint64_t host_hash(std::string_view host) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV offset basis
  for (char c : host) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;  // FNV prime
  }
  return hash;
}

Topology topology_from_hosts(const std::vector<std::string>& hosts, int rank) {
  if (hosts.empty() || rank < 0 || rank >= static_cast<int>(hosts.size()))
    throw std::invalid_argument("topology_from_hosts: rank outside the host list");
  Topology t;
  t.rank = rank;
  t.size = static_cast<int>(hosts.size());
  t.hosts = hosts;
  std::map<std::uint64_t, int> node_of_hash;
  std::vector<int> ranks_on_node;
  for (const auto& host : hosts) {
    const auto [it, inserted] =
        node_of_hash.emplace(host_hash(host), static_cast<int>(node_of_hash.size()));
    if (inserted) ranks_on_node.push_back(0);
    const int node = it->second;
    t.node_of_rank.push_back(node);
    t.local_rank_of.push_back(ranks_on_node[static_cast<std::size_t>(node)]++);
  }
  t.nodes = static_cast<int>(ranks_on_node.size());
  t.node = t.node_of_rank[static_cast<std::size_t>(rank)];
  t.local_rank = t.local_rank_of[static_cast<std::size_t>(rank)];
  t.local_size = ranks_on_node[static_cast<std::size_t>(t.node)];
  return t;
}

Topology discover_topology(Communicator& world) {
  std::vector<char> mine(kHostNameBytes, '\0');
  const std::string host = host_name();
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kHostNameBytes - 1));
  std::vector<char> all(kHostNameBytes * static_cast<std::size_t>(world.size()));
  if (world.memory_space() == MemorySpace::host) {
    world.all_gather(mine.data(), all.data(), kHostNameBytes, DataType::u8);
  } else {  // through the communicator's own memory (a GPU's for NCCL)
    auto buffer = world.allocate(all.size());
    const std::size_t offset = kHostNameBytes * static_cast<std::size_t>(world.rank());
    buffer->copy_from_host(mine.data(), kHostNameBytes, offset);
    auto* base = static_cast<unsigned char*>(buffer->data());
    world.all_gather(base + offset, base, kHostNameBytes, DataType::u8);
    world.synchronize();
    buffer->copy_to_host(all.data(), all.size());
  }
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r)
    hosts.emplace_back(all.data() + kHostNameBytes * static_cast<std::size_t>(r));
  return topology_from_hosts(hosts, world.rank());
}

}  // namespace shardplan::comm
