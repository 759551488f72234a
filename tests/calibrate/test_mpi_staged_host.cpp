// StagedHostCommunicator over the MPI world (whose own buffers are host memory, so only the
// staging is under test: sizes, offsets, in-place calls, roots, splits). Under NCCL the same code
// stages through device buffers; that path runs in the gpu-labelled calibrate test.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "calibrate/collective_bench.hpp"
#include "calibrate/staged_host_communicator.hpp"
#include "comm/groups.hpp"
#include "comm/topology.hpp"
#include "mpi_test_world.hpp"

using namespace shardplan;
using calibrate::StagedHostCommunicator;
using comm::DataType;
using comm::ReduceOp;

namespace {

// Element i of rank r's input: small integers, shifted by rank so that a misplaced block shows.
std::int64_t value(int rank, std::size_t i) {
  return static_cast<std::int64_t>((static_cast<std::size_t>(rank) + i) % 7 + 1);
}

std::vector<std::int64_t> input(int rank, std::size_t count) {
  std::vector<std::int64_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value(rank, i);
  return v;
}

// The reductions over ranks 0..n-1, computed here element by element.
std::int64_t sum_over(int n, std::size_t i) {
  std::int64_t s = 0;
  for (int r = 0; r < n; ++r) s += value(r, i);
  return s;
}
std::int64_t max_over(int n, std::size_t i) {
  std::int64_t m = 0;
  for (int r = 0; r < n; ++r) m = std::max(m, value(r, i));
  return m;
}

constexpr std::int64_t kUntouched = -99;

// Every collective of `c` (a staged communicator) on `count` int64 elements per block.
void check_every_collective(comm::Communicator& c, std::size_t count) {
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  CAPTURE(n);
  CAPTURE(count);
  const auto mine = input(me, count);

  std::vector<std::int64_t> out(count, kUntouched);
  c.all_reduce(mine.data(), out.data(), count, DataType::i64);
  for (std::size_t i = 0; i < count; ++i) REQUIRE(out[i] == sum_over(n, i));

  std::vector<std::int64_t> in_place = mine;
  c.all_reduce(in_place.data(), in_place.data(), count, DataType::i64, ReduceOp::max);
  for (std::size_t i = 0; i < count; ++i) REQUIRE(in_place[i] == max_over(n, i));

  const int root = n - 1;
  out.assign(count, kUntouched);
  c.reduce(mine.data(), out.data(), count, DataType::i64, root);
  for (std::size_t i = 0; i < count; ++i)
    REQUIRE(out[i] == (me == root ? sum_over(n, i) : kUntouched));

  std::vector<std::int64_t> gathered(count * un, kUntouched);
  c.all_gather(mine.data(), gathered.data(), count, DataType::i64);
  for (std::size_t i = 0; i < gathered.size(); ++i)
    REQUIRE(gathered[i] == value(static_cast<int>(i / count), i % count));
  // In place: this rank's input already sits in its own block of the receive buffer.
  std::vector<std::int64_t> gathered_in_place(count * un, kUntouched);
  std::int64_t* own_block = gathered_in_place.data() + count * static_cast<std::size_t>(me);
  std::copy(mine.begin(), mine.end(), own_block);
  c.all_gather(own_block, gathered_in_place.data(), count, DataType::i64);
  CHECK(gathered_in_place == gathered);

  const auto blocks = input(me, count * un);  // n blocks of `count`
  out.assign(count, kUntouched);
  c.reduce_scatter(blocks.data(), out.data(), count, DataType::i64);
  for (std::size_t i = 0; i < count; ++i)
    REQUIRE(out[i] == sum_over(n, static_cast<std::size_t>(me) * count + i));

  std::vector<std::int64_t> shared =
      me == root ? mine : std::vector<std::int64_t>(count, kUntouched);
  c.broadcast(shared.data(), count, DataType::i64, root);
  for (std::size_t i = 0; i < count; ++i) REQUIRE(shared[i] == value(root, i));

  std::vector<std::int64_t> exchanged(count * un, kUntouched);
  c.all_to_all(blocks.data(), exchanged.data(), count, DataType::i64);
  // Block q came from rank q, which sent its block `me`.
  for (std::size_t i = 0; i < exchanged.size(); ++i)
    REQUIRE(exchanged[i] ==
            value(static_cast<int>(i / count), static_cast<std::size_t>(me) * count + i % count));

  c.barrier();
}

}  // namespace

TEST_CASE("calibrate_mpi::staged host collectives give every collective's result") {
  auto& world = test_world();
  StagedHostCommunicator staged(world);
  CHECK(staged.memory_space() == comm::MemorySpace::host);
  CHECK(staged.rank() == world.rank());
  CHECK(staged.size() == world.size());
  // Sizes that grow and shrink: the staging buffers are reallocated, then reused.
  for (std::size_t count : {1u, 1001u, 3u, 4096u}) check_every_collective(staged, count);
  // Groups split off a staged communicator are staged too: halves of the world.
  auto halves = staged.split(world.rank() % 2, world.rank());
  CHECK(halves->memory_space() == comm::MemorySpace::host);
  CHECK(halves->size() == (world.size() + 1 - world.rank() % 2) / 2);
  check_every_collective(*halves, 17);
}

TEST_CASE("calibrate_mpi::the topology and the harness run on a staged host world") {
  auto& world = test_world();
  StagedHostCommunicator staged(world);
  const auto direct = comm::discover_topology(world);
  const auto through_staging = comm::discover_topology(staged);
  CHECK(through_staging.hosts == direct.hosts);
  CHECK(through_staging.local_rank == direct.local_rank);
  // calibrate's host world staged, the measured group the inner world itself.
  const auto points = calibrate::sweep_points(documents::Collective::all_reduce, world.size(),
                                              {4, 4096, 4}, sizeof(float));
  calibrate::BenchSettings settings;
  settings.warmup = 1;
  settings.iters = 3;
  settings.batches = 2;
  calibrate::CollectiveBench bench(documents::Collective::all_reduce, world, staged, points.back(),
                                   settings);
  for (const auto& p : points) {
    const auto r = bench.run(p);
    CHECK(r.wrong == 0);
    CHECK(r.time_s > 0);
  }
}
