#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include "comm/groups.hpp"
#include "comm/process_identity.hpp"
#include "comm/topology.hpp"
#include "mpi_test_world.hpp"

using namespace shardplan::comm;

namespace {

// Checks that `group` holds exactly `members` (world ranks, in group-rank order), by gathering
// every member's world rank and by summing them.
void check_group(Communicator& group, const std::vector<int>& members, int world_rank) {
  REQUIRE(group.size() == static_cast<int>(members.size()));
  CHECK(members[static_cast<std::size_t>(group.rank())] == world_rank);
  std::vector<std::int32_t> gathered(members.size());
  const std::int32_t mine = world_rank;
  group.all_gather(&mine, gathered.data(), 1, DataType::i32);
  CHECK(std::vector<int>(gathered.begin(), gathered.end()) == members);
  std::int32_t sum = 0;
  group.all_reduce(&mine, &sum, 1, DataType::i32);
  CHECK(sum == std::accumulate(members.begin(), members.end(), 0));
}

std::vector<GroupSpec> every_group(int world_size) {
  std::vector<GroupSpec> specs = {
      {GroupKind::world, 0}, {GroupKind::intra_node, 0}, {GroupKind::inter_node, 0}};
  for (int s = 1; s <= world_size; ++s) {
    if (world_size % s != 0) continue;
    specs.push_back({GroupKind::shard, s});
    specs.push_back({GroupKind::replica, s});
  }
  return specs;
}

}  // namespace

TEST_CASE("mpi::every rank of this job is found on this host") {
  auto& world = test_world();
  const Topology t = discover_topology(world);
  CHECK(t.size == world.size());
  CHECK(t.rank == world.rank());
  CHECK(t.nodes == 1);
  CHECK(t.local_rank == world.rank());
  CHECK(t.local_size == world.size());
  CHECK(t.host_list() == host_name());
}

TEST_CASE("mpi::group splits on this host") {
  auto& world = test_world();
  const Topology t = discover_topology(world);
  for (const GroupSpec& spec : every_group(world.size())) {
    CAPTURE(group_name(spec));
    auto group = make_group(world, t, spec);
    check_group(*group, group_members(spec, t, world.rank()), world.rank());
  }
}

TEST_CASE("mpi::group splits on a two-node layout") {
  // The ranks pretend to run on two nodes: the first half on node-a, the rest on node-b.
  auto& world = test_world();
  const int n = world.size();
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) hosts.push_back(r < (n + 1) / 2 ? "node-a" : "node-b");
  const Topology t = topology_from_hosts(hosts, world.rank());
  for (const GroupSpec& spec : every_group(n)) {
    CAPTURE(group_name(spec));
    auto group = make_group(world, t, spec);
    const auto members = group_members(spec, t, world.rank());
    check_group(*group, members, world.rank());
    if (spec.kind == GroupKind::intra_node) CHECK(group->size() == t.local_size);
    if (spec.kind == GroupKind::inter_node)
      CHECK(group->size() == (n > 1 && t.local_rank < n / 2 ? 2 : 1));
  }
}

TEST_CASE("mpi::a sub-group splits again") {
  auto& world = test_world();
  auto halves = world.split(world.rank() % 2, world.rank());
  auto single = halves->split(halves->rank(), 0);
  CHECK(single->size() == 1);
  double value = 2.5, sum = 0;
  single->all_reduce(&value, &sum, 1, DataType::f64);
  CHECK(sum == 2.5);
}
