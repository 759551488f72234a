#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "comm/groups.hpp"

using namespace shardplan::comm;

namespace {
// 8 ranks on 2 nodes of 4.
Topology two_nodes_of_four(int rank) {
  return topology_from_hosts({"n0", "n0", "n0", "n0", "n1", "n1", "n1", "n1"}, rank);
}
}  // namespace

TEST_CASE("groups::names parse and print") {
  for (const char* name : {"world", "intra_node", "inter_node", "shard:4", "replica:2"}) {
    const auto spec = parse_group(name);
    REQUIRE(spec.has_value());
    CHECK(group_name(*spec) == name);
  }
  CHECK(parse_group("node") == GroupSpec{GroupKind::intra_node, 0});
  CHECK(parse_group("one_per_node") == GroupSpec{GroupKind::inter_node, 0});
  for (const char* bad :
       {"", "worlds", "shard", "shard:", "shard:0", "shard:-2", "shard:2x", "replica:1.5", "pod:2"})
    CHECK_FALSE(parse_group(bad).has_value());
}

TEST_CASE("groups::members of each kind on two nodes of four") {
  const Topology t = two_nodes_of_four(5);
  CHECK(group_members({GroupKind::world, 0}, t, 5) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(group_members({GroupKind::intra_node, 0}, t, 5) == std::vector<int>{4, 5, 6, 7});
  CHECK(group_members({GroupKind::inter_node, 0}, t, 5) == std::vector<int>{1, 5});
  CHECK(group_members({GroupKind::shard, 2}, t, 5) == std::vector<int>{4, 5});
  CHECK(group_members({GroupKind::replica, 2}, t, 5) == std::vector<int>{1, 3, 5, 7});
  CHECK(group_members({GroupKind::shard, 4}, t, 5) == std::vector<int>{4, 5, 6, 7});
  CHECK(group_members({GroupKind::replica, 4}, t, 5) == std::vector<int>{1, 5});
}

TEST_CASE("groups::nodes spanned decide the tier") {
  const Topology t = two_nodes_of_four(0);
  CHECK(max_nodes_spanned({GroupKind::world, 0}, t) == 2);
  CHECK(max_nodes_spanned({GroupKind::intra_node, 0}, t) == 1);
  CHECK(max_nodes_spanned({GroupKind::inter_node, 0}, t) == 2);
  CHECK(max_nodes_spanned({GroupKind::shard, 4}, t) == 1);
  CHECK(max_nodes_spanned({GroupKind::shard, 8}, t) == 2);
  CHECK(max_nodes_spanned({GroupKind::replica, 4}, t) == 2);
}

TEST_CASE("groups::a shard size that does not divide the world is rejected") {
  const Topology t = two_nodes_of_four(0);
  CHECK_THROWS_AS(split_key({GroupKind::shard, 3}, t, 0), std::invalid_argument);
  CHECK_THROWS_AS(group_members({GroupKind::replica, 5}, t, 0), std::invalid_argument);
}
