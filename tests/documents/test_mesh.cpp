// The mesh's groups (documents/mesh.hpp), by hand in torchtitan's order: rank =
// ((((pp·R + replicate)·S + shard)·C + context)·T + tensor).
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <stdexcept>
#include <vector>

#include "documents/mesh.hpp"

using shardplan::documents::Dim;
using shardplan::documents::Mesh;

namespace {

// The groups a communicator's split would make: color -> ranks in key order.
std::map<int, std::vector<int>> groups(const Mesh& m, std::initializer_list<Dim> dims) {
  std::map<int, std::map<int, int>> by_key;
  for (int r = 0; r < m.size(); ++r) {
    const auto s = m.split(r, dims);
    CHECK(by_key[s.color].count(s.key) == 0);  // keys are distinct within a group
    by_key[s.color][s.key] = r;
  }
  std::map<int, std::vector<int>> out;
  for (const auto& [color, ranks] : by_key)
    for (const auto& [key, r] : ranks) out[color].push_back(r);
  return out;
}

}  // namespace

TEST_CASE("mesh::coordinates and groups of pp 2 x dp 2 x cp 2 x tp 2") {
  const Mesh m(2, 1, 2, 2, 2);
  CHECK(m.size() == 16);
  // 13 = 8 + 4 + 1: stage 1, shard 1, context 0, tensor 1.
  CHECK(m.coordinate(13, Dim::pipeline) == 1);
  CHECK(m.coordinate(13, Dim::shard) == 1);
  CHECK(m.coordinate(13, Dim::context) == 0);
  CHECK(m.coordinate(13, Dim::tensor) == 1);
  CHECK(m.stride(Dim::tensor) == 1);
  CHECK(m.stride(Dim::context) == 2);
  CHECK(m.stride(Dim::shard) == 4);
  CHECK(m.stride(Dim::pipeline) == 8);
  // Through rank 13: its TP pair {12, 13}, its ring {13, 15}, its stages {5, 13}, and the d·c
  // ranks that average its gradients {9, 11, 13, 15}.
  const auto tp = groups(m, {Dim::tensor});
  CHECK(tp.at(m.split(13, {Dim::tensor}).color) == std::vector<int>{12, 13});
  CHECK(m.split(13, {Dim::tensor}).key == 1);
  const auto cp = groups(m, {Dim::context});
  CHECK(cp.at(m.split(13, {Dim::context}).color) == std::vector<int>{13, 15});
  const auto pp = groups(m, {Dim::pipeline});
  CHECK(pp.at(m.split(13, {Dim::pipeline}).color) == std::vector<int>{5, 13});
  const auto dc = groups(m, {Dim::replicate, Dim::shard, Dim::context});
  CHECK(dc.at(m.split(13, {Dim::replicate, Dim::shard, Dim::context}).color) ==
        std::vector<int>{9, 11, 13, 15});
  CHECK(tp.size() == 8);
  CHECK(dc.size() == 4);
  CHECK(m.group_size({Dim::replicate, Dim::shard, Dim::context}) == 4);
}

TEST_CASE("mesh::HSDP: shard groups of consecutive ranks, replicas across them") {
  // 8 ranks, shards of 4 (FSDP's HYBRID_SHARD with a node of 4): shards {0..3}, {4..7};
  // replicas {0, 4}, {1, 5}, ...
  const Mesh m(1, 2, 4, 1, 1);
  const auto shard = groups(m, {Dim::shard});
  REQUIRE(shard.size() == 2);
  CHECK(shard.begin()->second == std::vector<int>{0, 1, 2, 3});
  const auto replica = groups(m, {Dim::replicate});
  REQUIRE(replica.size() == 4);
  CHECK(replica.at(m.split(6, {Dim::replicate}).color) == std::vector<int>{2, 6});
  // As a communicator's split(r / S, r % S) and split(r % S, r / S) make them.
  for (int r = 0; r < 8; ++r) {
    CHECK(m.split(r, {Dim::shard}).color == r / 4);
    CHECK(m.split(r, {Dim::shard}).key == r % 4);
    CHECK(m.split(r, {Dim::replicate}).color == r % 4);
    CHECK(m.split(r, {Dim::replicate}).key == r / 4);
  }
}

TEST_CASE("mesh::ranks of a group on one node") {
  // 64 ranks on nodes of 8: pp 2 x dp 4 x tp 8. TP fills a node; a data-parallel group's
  // neighbours are 8 apart (one per node); a context ring of 2 inside tp 2 has both on a node.
  const Mesh m(2, 1, 4, 1, 8);
  CHECK(m.ranks_per_node({Dim::tensor}, 8) == 8);
  CHECK(m.ranks_per_node({Dim::shard}, 8) == 1);
  CHECK(m.ranks_per_node({Dim::pipeline}, 8) == 1);
  const Mesh small(1, 1, 4, 2, 2);  // 16 ranks
  CHECK(small.ranks_per_node({Dim::context}, 8) == 2);
  CHECK(small.ranks_per_node({Dim::shard, Dim::context}, 8) == 4);  // stride 2: 4 of 8 per node
  CHECK(small.ranks_per_node({Dim::shard}, 8) == 2);                // stride 4
}

TEST_CASE("mesh::a dimension below 1 rank is refused") {
  CHECK_THROWS_AS(Mesh(1, 1, 0, 1, 1), std::invalid_argument);
}
