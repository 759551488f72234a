#include <doctest/doctest.h>

#include "calibrate/group_plan.hpp"
#include "core/input_error.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;
using comm::GroupKind;
using comm::GroupSpec;

TEST_CASE("group_plan::one node measures the world only") {
  const auto t = comm::topology_from_hosts({"a", "a", "a", "a"}, 0);
  const auto plan = plan_groups({}, t);
  REQUIRE(plan.groups.size() == 1);
  CHECK(plan.groups[0].name == "world");
  CHECK(plan.groups[0].ranks == 4);
  CHECK(plan.groups[0].groups == 1);
  CHECK(plan.groups[0].tier == documents::Tier::intra_node);
}

TEST_CASE("group_plan::two nodes of four: world, intra_node, inter_node") {
  const auto t = comm::topology_from_hosts({"a", "a", "a", "a", "b", "b", "b", "b"}, 0);
  const auto plan = plan_groups({}, t);
  REQUIRE(plan.groups.size() == 3);
  CHECK(plan.groups[0].tier == documents::Tier::inter_node);
  CHECK(plan.groups[1].name == "intra_node");
  CHECK(plan.groups[1].ranks == 4);
  CHECK(plan.groups[1].groups == 2);
  CHECK(plan.groups[1].tier == documents::Tier::intra_node);
  CHECK(plan.groups[2].name == "inter_node");
  CHECK(plan.groups[2].ranks == 2);
  CHECK(plan.groups[2].groups == 4);
  CHECK(plan.groups[2].tier == documents::Tier::inter_node);
}

TEST_CASE("group_plan::groups that would measure nothing new are noted, not measured") {
  const auto one_node = comm::topology_from_hosts({"a", "a", "a", "a"}, 0);
  const auto plan = plan_groups({{GroupKind::world, 0},
                                 {GroupKind::intra_node, 0},
                                 {GroupKind::inter_node, 0},
                                 {GroupKind::shard, 2},
                                 {GroupKind::replica, 2}},
                                one_node);
  REQUIRE(plan.groups.size() == 2);
  CHECK(plan.groups[1].name == "shard:2");
  CHECK(plan.notes.size() == 3);
  CHECK(plan.notes[0] == "intra_node: not measured: same size (4) and tier (intra_node) as world");
  CHECK(plan.notes[1] == "inter_node: not measured: its groups have one rank");
  CHECK(plan.notes[2] == "replica:2: not measured: same size (2) and tier (intra_node) as shard:2");
  const auto uneven = comm::topology_from_hosts({"a", "a", "a", "b"}, 0);
  const auto uneven_plan = plan_groups({{GroupKind::intra_node, 0}}, uneven);
  CHECK(uneven_plan.groups.empty());
  CHECK(uneven_plan.notes.at(0).find("differ in size") != std::string::npos);
}

TEST_CASE("group_plan::a shard size that does not divide the world is bad input") {
  const auto t = comm::topology_from_hosts({"a", "a", "a", "a"}, 0);
  CHECK_THROWS_WITH_AS(plan_groups({{GroupKind::shard, 3}}, t),
                       "--groups: shard:3: the shard group size must divide the world size 4",
                       core::InputError);
}
