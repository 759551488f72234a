#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "comm/topology.hpp"

using namespace shardplan::comm;

TEST_CASE("topology::nodes are numbered by their lowest rank and local ranks count up") {
  const std::vector<std::string> hosts = {"b", "a", "b", "a", "c"};
  const Topology t = topology_from_hosts(hosts, 3);
  CHECK(t.size == 5);
  CHECK(t.nodes == 3);
  CHECK(t.node_of_rank == std::vector<int>{0, 1, 0, 1, 2});
  CHECK(t.local_rank_of == std::vector<int>{0, 0, 1, 1, 0});
  CHECK(t.node == 1);
  CHECK(t.local_rank == 1);
  CHECK(t.local_size == 2);
  CHECK_FALSE(t.uniform());
  CHECK(t.host_list() == "b,a,c");
}

TEST_CASE("topology::uniform nodes") {
  const Topology t = topology_from_hosts({"x", "x", "y", "y"}, 0);
  CHECK(t.uniform());
  CHECK(t.local_size == 2);
}

TEST_CASE("topology::host hash is FNV-1a") {
  CHECK(host_hash("") == 0xcbf29ce484222325ULL);
  CHECK(host_hash("a") == 0xaf63dc4c8601ec8cULL);  // the published FNV-1a 64 test vector
  CHECK(host_hash("node01") != host_hash("node02"));
}

TEST_CASE("topology::a rank outside the list is rejected") {
  CHECK_THROWS_AS(topology_from_hosts({"a"}, 1), std::invalid_argument);
  CHECK_THROWS_AS(topology_from_hosts({}, 0), std::invalid_argument);
}
