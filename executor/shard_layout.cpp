#include "executor/shard_layout.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace shardplan::executor {

std::int64_t ShardLayout::whole_elements(std::int64_t unit,
                                         const documents::ShardingSpec& spec) const {
  const auto& u = units.at(static_cast<std::size_t>(unit));
  return spec.shard_optimizer ? u.padded : u.size;
}

std::int64_t ShardLayout::chunk_begin(std::int64_t unit) const {
  return static_cast<std::int64_t>(shard_rank) * units.at(static_cast<std::size_t>(unit)).chunk;
}

ShardLayout make_shard_layout(const GptLayout& layout, const documents::ShardingSpec& spec,
                              int world, int world_rank) {
  ShardLayout s;
  s.world = world;
  s.group = spec.group(world);
  if (world < 1 || s.group < 1 || s.group > world || world % s.group != 0)
    throw std::invalid_argument(
        fmt::format("a shard group of {} ranks does not divide {} ranks", s.group, world));
  if (world_rank < 0 || world_rank >= world)
    throw std::invalid_argument(fmt::format("rank {} outside {} ranks", world_rank, world));
  s.replicas = world / s.group;
  // HSDP groups (comm/groups.hpp): S consecutive ranks share one copy of the sharded state;
  // replicas are the ranks with the same index in their groups.
  s.shard_rank = world_rank % s.group;
  s.replica_rank = world_rank / s.group;
  const auto S = static_cast<std::int64_t>(s.group);
  for (std::int64_t u = 0; u < layout.unit_count(); ++u) {
    UnitShards us;
    us.size = layout.unit_size_of(u);
    us.padded = (us.size + S - 1) / S * S;
    us.chunk = us.padded / S;
    const auto& slots = layout.slots(layout.unit_kind(u));
    const bool has_large = std::any_of(slots.begin(), slots.end(), [&](const TensorSlot& t) {
      return t.tensor.elements() >= spec.persistence_threshold;
    });
    us.params_sharded = spec.shard_parameters && has_large;
    s.units.push_back(us);
  }
  return s;
}

}  // namespace shardplan::executor
