// The sub-groups a sharded training job communicates in, made by splitting the world:
//   world       every rank
//   intra_node  the ranks of one node (FSDP HYBRID_SHARD's shard group when it is one node)
//   inter_node  one rank per node: the ranks with the same local rank (the cross-node rings of a
//               hierarchical collective)
//   shard:S     HSDP shard groups: S consecutive ranks (world size divisible by S)
//   replica:S   HSDP replica groups: the ranks with the same index within their shard group
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/topology.hpp"

namespace shardplan::comm {

enum class GroupKind { world, intra_node, inter_node, shard, replica };

struct GroupSpec {
  GroupKind kind = GroupKind::world;
  int shard_size = 0;  // ranks per shard group; for shard and replica only
  bool operator==(const GroupSpec&) const = default;
};

// "world", "intra_node", "inter_node", "shard:4", "replica:4".
std::string group_name(const GroupSpec& spec);
// The inverse of group_name; also "node" for intra_node and "one_per_node" for inter_node.
// std::nullopt when the text names no group (a shard size must be a positive integer).
std::optional<GroupSpec> parse_group(std::string_view text);

struct SplitKey {
  int color = 0;
  int key = 0;
};

// Throws std::invalid_argument when a shard size does not divide the world size.
SplitKey split_key(const GroupSpec& spec, const Topology& topology, int world_rank);
// World ranks of the group that `world_rank` belongs to, in group-rank order. Pure.
std::vector<int> group_members(const GroupSpec& spec, const Topology& topology, int world_rank);
// Largest number of nodes any one group of this kind spans. Pure.
int max_nodes_spanned(const GroupSpec& spec, const Topology& topology);
// Collective over `world` (whose ranks are the topology's world ranks): this rank's group.
std::unique_ptr<Communicator> make_group(Communicator& world, const Topology& topology,
                                         const GroupSpec& spec);

}  // namespace shardplan::comm
