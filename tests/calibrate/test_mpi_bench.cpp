#include <doctest/doctest.h>

#include <memory>

#include "calibrate/collective_bench.hpp"
#include "comm/forwarding_communicator.hpp"
#include "comm/groups.hpp"
#include "comm/topology.hpp"
#include "mpi_test_world.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;
using documents::Collective;

namespace {

const Collective kEveryOp[] = {Collective::all_reduce,     Collective::all_gather,
                               Collective::reduce_scatter, Collective::broadcast,
                               Collective::reduce,         Collective::all_to_all};

BenchSettings quick() {
  BenchSettings s;
  s.warmup = 1;
  s.iters = 3;
  s.batches = 2;
  return s;
}

// Forwards to another communicator, but corrupts the first received element of every
// all_reduce: the check must notice.
class CorruptingCommunicator final : public comm::ForwardingCommunicator {
public:
  explicit CorruptingCommunicator(comm::Communicator& inner) : ForwardingCommunicator(inner) {}

private:
  void do_all_reduce(const void* s, void* r, std::size_t n, comm::DataType t,
                     comm::ReduceOp op) override {
    inner_.all_reduce(s, r, n, t, op);
    static_cast<float*>(r)[0] += 1.0f;
  }
};

}  // namespace

TEST_CASE("calibrate_mpi::every collective passes its check at odd sizes, on the world and on "
          "shard groups") {
  auto& world = test_world();
  const auto topology = comm::discover_topology(world);
  std::vector<comm::GroupSpec> specs = {{comm::GroupKind::world, 0}};
  if (world.size() % 2 == 0) specs.push_back({comm::GroupKind::shard, 2});
  if (world.size() % 2 == 0) specs.push_back({comm::GroupKind::replica, 2});
  for (const auto& spec : specs) {
    auto group = comm::make_group(world, topology, spec);
    for (Collective op : kEveryOp) {
      CAPTURE(comm::group_name(spec));
      CAPTURE(documents::traits(op).name);
      // 4 B .. 4 KiB by 4: counts 1, 4, 16, ... and, split among 3 ranks, not divisible.
      const auto points = sweep_points(op, group->size(), {4, 4096, 4}, sizeof(float));
      REQUIRE_FALSE(points.empty());
      CollectiveBench bench(op, *group, world, points.back(), quick());
      for (const auto& p : points) {
        const auto r = bench.run(p);
        CHECK(r.wrong == 0);
        CHECK(r.time_s > 0);
        CHECK(r.algbw_GBps == doctest::Approx(static_cast<double>(p.size_bytes) / r.time_s / 1e9));
        CHECK(r.busbw_GBps ==
              doctest::Approx(r.algbw_GBps * documents::traits(op).bus_factor(group->size())));
      }
    }
  }
}

TEST_CASE("calibrate_mpi::the times of every rank agree (the slowest rank's)") {
  auto& world = test_world();
  const auto points =
      sweep_points(Collective::all_reduce, world.size(), {1024, 1024, 2}, sizeof(float));
  CollectiveBench bench(Collective::all_reduce, world, world, points.back(), quick());
  const double mine = bench.run(points.back()).time_s;
  double highest = 0, lowest = 0;
  world.all_reduce(&mine, &highest, 1, comm::DataType::f64, comm::ReduceOp::max);
  world.all_reduce(&mine, &lowest, 1, comm::DataType::f64, comm::ReduceOp::min);
  CHECK(highest == lowest);
}

TEST_CASE("calibrate_mpi::a wrong result is counted in #wrong") {
  auto& world = test_world();
  CorruptingCommunicator corrupt(world);
  const auto points =
      sweep_points(Collective::all_reduce, world.size(), {64, 64, 2}, sizeof(float));
  CollectiveBench bench(Collective::all_reduce, corrupt, world, points.back(), quick());
  CHECK(bench.run(points.back()).wrong == world.size());  // one element on every rank
}
