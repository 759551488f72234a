#include "comm/groups.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace shardplan::comm {

std::string group_name(const GroupSpec& spec) {
  switch (spec.kind) {
  case GroupKind::world:
    return "world";
  case GroupKind::intra_node:
    return "intra_node";
  case GroupKind::inter_node:
    return "inter_node";
  case GroupKind::shard:
    return fmt::format("shard:{}", spec.shard_size);
  case GroupKind::replica:
    return fmt::format("replica:{}", spec.shard_size);
  }
  return "?";
}

std::optional<GroupSpec> parse_group(std::string_view text) {
  if (text == "world") return GroupSpec{GroupKind::world, 0};
  if (text == "intra_node" || text == "node") return GroupSpec{GroupKind::intra_node, 0};
  if (text == "inter_node" || text == "one_per_node") return GroupSpec{GroupKind::inter_node, 0};
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto kind_text = text.substr(0, colon);
  const auto size_text = text.substr(colon + 1);
  int size = 0;
  const auto [end, error] =
      std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
  if (error != std::errc() || end != size_text.data() + size_text.size() || size < 1)
    return std::nullopt;
  if (kind_text == "shard") return GroupSpec{GroupKind::shard, size};
  if (kind_text == "replica") return GroupSpec{GroupKind::replica, size};
  return std::nullopt;
}

SplitKey split_key(const GroupSpec& spec, const Topology& topology, int world_rank) {
  const auto r = static_cast<std::size_t>(world_rank);
  switch (spec.kind) {
  case GroupKind::world:
    return {0, world_rank};
  case GroupKind::intra_node:
    return {topology.node_of_rank.at(r), topology.local_rank_of.at(r)};
  case GroupKind::inter_node:
    return {topology.local_rank_of.at(r), topology.node_of_rank.at(r)};
  case GroupKind::shard:
  case GroupKind::replica: {
    const int s = spec.shard_size;
    if (s < 1 || topology.size % s != 0)
      throw std::invalid_argument(
          fmt::format("{}: the shard group size must divide the world size {}", group_name(spec),
                      topology.size));
    if (spec.kind == GroupKind::shard) return {world_rank / s, world_rank % s};
    return {world_rank % s, world_rank / s};
  }
  }
  return {0, world_rank};
}

std::vector<int> group_members(const GroupSpec& spec, const Topology& topology, int world_rank) {
  const SplitKey mine = split_key(spec, topology, world_rank);
  std::vector<std::pair<int, int>> keyed;  // (key, world rank)
  for (int r = 0; r < topology.size; ++r) {
    const SplitKey k = split_key(spec, topology, r);
    if (k.color == mine.color) keyed.emplace_back(k.key, r);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> members;
  members.reserve(keyed.size());
  for (const auto& [key, r] : keyed) members.push_back(r);
  return members;
}

int max_nodes_spanned(const GroupSpec& spec, const Topology& topology) {
  std::map<int, std::set<int>> nodes_of_color;
  for (int r = 0; r < topology.size; ++r)
    nodes_of_color[split_key(spec, topology, r).color].insert(
        topology.node_of_rank[static_cast<std::size_t>(r)]);
  std::size_t widest = 0;
  for (const auto& [color, nodes] : nodes_of_color) widest = std::max(widest, nodes.size());
  return static_cast<int>(widest);
}

std::unique_ptr<Communicator> make_group(Communicator& world, const Topology& topology,
                                         const GroupSpec& spec) {
  const SplitKey k = split_key(spec, topology, world.rank());
  return world.split(k.color, k.key);
}

}  // namespace shardplan::comm
