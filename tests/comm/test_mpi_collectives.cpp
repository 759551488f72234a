#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "comm/comm_error.hpp"
#include "mpi_test_world.hpp"
#include "typed_values.hpp"

using namespace shardplan::comm;
using shardplan::comm::testing::load;
using shardplan::comm::testing::pattern;
using shardplan::comm::testing::store;

namespace {

const std::vector<DataType> kAllTypes = {DataType::f32, DataType::f64, DataType::bf16,
                                         DataType::f16, DataType::i32, DataType::i64,
                                         DataType::u8};
// Odd counts, and counts that no rank count from 2 to 4 divides.
const std::vector<std::size_t> kCounts = {1, 7, 1023, 4097};

std::vector<std::byte> buffer(DataType type, std::size_t count) {
  return std::vector<std::byte>(std::max<std::size_t>(1, count) * element_bytes(type));
}

void fill(DataType type, std::vector<std::byte>& b, std::size_t count, int rank) {
  for (std::size_t i = 0; i < count; ++i) store(type, b.data(), i, pattern(rank, i));
}

// Sum over ranks 0..n-1 of pattern(rank, i).
double pattern_sum(int ranks, std::size_t i) {
  double sum = 0;
  for (int r = 0; r < ranks; ++r) sum += pattern(r, i);
  return sum;
}

// Number of elements that differ from `expected(i)`.
template <class Expected>
int wrong_elements(DataType type, const std::vector<std::byte>& b, std::size_t count,
                   Expected expected) {
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (load(type, b.data(), i) != expected(i)) ++wrong;
  return wrong;
}

}  // namespace

TEST_CASE("mpi::all_reduce sums every type and odd counts") {
  auto& world = test_world();
  const int n = world.size();
  for (DataType type : kAllTypes) {
    for (std::size_t count : kCounts) {
      CAPTURE(data_type_name(type));
      CAPTURE(count);
      auto send = buffer(type, count), recv = buffer(type, count);
      fill(type, send, count, world.rank());
      world.all_reduce(send.data(), recv.data(), count, type);
      CHECK(wrong_elements(type, recv, count, [&](std::size_t i) { return pattern_sum(n, i); }) ==
            0);
    }
  }
}

TEST_CASE("mpi::all_reduce in place, and max and min") {
  auto& world = test_world();
  const int n = world.size();
  for (DataType type : {DataType::f32, DataType::bf16, DataType::f16, DataType::i64}) {
    CAPTURE(data_type_name(type));
    const std::size_t count = 333;
    auto data = buffer(type, count);
    fill(type, data, count, world.rank());
    world.all_reduce(data.data(), data.data(), count, type);
    CHECK(wrong_elements(type, data, count, [&](std::size_t i) { return pattern_sum(n, i); }) == 0);

    auto send = buffer(type, count), high = buffer(type, count), low = buffer(type, count);
    fill(type, send, count, world.rank());
    world.all_reduce(send.data(), high.data(), count, type, ReduceOp::max);
    world.all_reduce(send.data(), low.data(), count, type, ReduceOp::min);
    CHECK(wrong_elements(type, high, count, [&](std::size_t i) { return pattern(n - 1, i); }) == 0);
    CHECK(wrong_elements(type, low, count, [&](std::size_t i) { return pattern(0, i); }) == 0);
  }
}

TEST_CASE("mpi::reduce delivers the sum to the root only") {
  auto& world = test_world();
  const int n = world.size(), root = n - 1;
  const DataType type = DataType::f64;
  const std::size_t count = 101;
  auto send = buffer(type, count), recv = buffer(type, count);
  fill(type, send, count, world.rank());
  for (std::size_t i = 0; i < count; ++i) store(type, recv.data(), i, -1.0);
  world.reduce(send.data(), recv.data(), count, type, root);
  if (world.rank() == root)
    CHECK(wrong_elements(type, recv, count, [&](std::size_t i) { return pattern_sum(n, i); }) == 0);
  else
    CHECK(wrong_elements(type, recv, count, [](std::size_t) { return -1.0; }) == 0);
}

TEST_CASE("mpi::all_gather places each rank's block at its offset, also in place") {
  auto& world = test_world();
  const int n = world.size();
  for (DataType type : {DataType::f32, DataType::bf16, DataType::u8}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{1001}}) {
      CAPTURE(data_type_name(type));
      CAPTURE(count);
      const std::size_t total = count * static_cast<std::size_t>(n);
      auto expected_at = [&](std::size_t i) {
        return pattern(static_cast<int>(i / count), i % count);
      };
      auto send = buffer(type, count), recv = buffer(type, total);
      fill(type, send, count, world.rank());
      world.all_gather(send.data(), recv.data(), count, type);
      CHECK(wrong_elements(type, recv, total, expected_at) == 0);

      auto in_place = buffer(type, total);
      const std::size_t own = static_cast<std::size_t>(world.rank()) * count;
      for (std::size_t i = 0; i < count; ++i)
        store(type, in_place.data(), own + i, pattern(world.rank(), i));
      world.all_gather(in_place.data() + own * element_bytes(type), in_place.data(), count, type);
      CHECK(wrong_elements(type, in_place, total, expected_at) == 0);
    }
  }
}

TEST_CASE("mpi::reduce_scatter gives rank r the sum of block r") {
  auto& world = test_world();
  const int n = world.size();
  for (DataType type : {DataType::f32, DataType::f64, DataType::f16, DataType::i32}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{777}}) {
      CAPTURE(data_type_name(type));
      CAPTURE(count);
      const std::size_t total = count * static_cast<std::size_t>(n);
      auto send = buffer(type, total), recv = buffer(type, count);
      fill(type, send, total, world.rank());
      world.reduce_scatter(send.data(), recv.data(), count, type);
      const std::size_t first = static_cast<std::size_t>(world.rank()) * count;
      CHECK(wrong_elements(type, recv, count,
                           [&](std::size_t i) { return pattern_sum(n, first + i); }) == 0);
    }
  }
}

TEST_CASE("mpi::broadcast copies the root's buffer everywhere") {
  auto& world = test_world();
  const int root = world.size() - 1;
  const DataType type = DataType::i32;
  const std::size_t count = 13;
  auto data = buffer(type, count);
  for (std::size_t i = 0; i < count; ++i)
    store(type, data.data(), i, world.rank() == root ? 1000.0 + static_cast<double>(i) : -1.0);
  world.broadcast(data.data(), count, type, root);
  CHECK(wrong_elements(type, data, count,
                       [](std::size_t i) { return 1000.0 + static_cast<double>(i); }) == 0);
}

TEST_CASE("mpi::all_to_all exchanges block p with rank p") {
  auto& world = test_world();
  const int n = world.size(), me = world.rank();
  const DataType type = DataType::f64;
  const std::size_t count = 3;
  const std::size_t total = count * static_cast<std::size_t>(n);
  auto code = [](int sender, std::size_t receiver, std::size_t i) {
    return 1000.0 * sender + 10.0 * static_cast<double>(receiver) + static_cast<double>(i);
  };
  auto send = buffer(type, total), recv = buffer(type, total);
  for (std::size_t i = 0; i < total; ++i)
    store(type, send.data(), i, code(me, i / count, i % count));
  world.all_to_all(send.data(), recv.data(), count, type);
  CHECK(wrong_elements(type, recv, total, [&](std::size_t i) {
          return code(static_cast<int>(i / count), static_cast<std::size_t>(me), i % count);
        }) == 0);
}

TEST_CASE("mpi::buffers, barrier and synchronize") {
  auto& world = test_world();
  CHECK(world.memory_space() == MemorySpace::host);
  CHECK(std::string(world.backend()) == "mpi");
  CHECK(world.library_version().find("MPI") != std::string::npos);
  auto b = world.allocate(64);
  const std::vector<int> values = {1, 2, 3, 4};
  b->copy_from_host(values.data(), sizeof(int) * values.size());
  std::vector<int> back(4);
  b->copy_to_host(back.data(), sizeof(int) * back.size());
  CHECK(back == values);
  CHECK_THROWS(b->copy_to_host(back.data(), 65));
  world.barrier();
  world.synchronize();
}

TEST_CASE("mpi::a count beyond MPI's int is a CommError naming the call") {
  auto& world = test_world();
  const std::size_t too_many = static_cast<std::size_t>(INT_MAX) + 1;
  try {
    world.all_reduce(nullptr, nullptr, too_many, DataType::u8);
    FAIL("no CommError");
  } catch (const CommError& e) {
    const std::string what = e.what();
    CHECK(what.find("MPI_Allreduce") != std::string::npos);
    CHECK(what.find("rank " + std::to_string(e.rank())) != std::string::npos);
    CHECK(e.file() == "comm/mpi_communicator.cpp");
  }
}

TEST_CASE("mpi::an error MPI returns becomes a CommError with host, rank and line") {
  auto& world = test_world();
  int value = 0;
  try {
    world.broadcast(&value, 1, DataType::i32, world.size() + 5);  // no such root, on every rank
    FAIL("no CommError");
  } catch (const CommError& e) {
    const std::string what = e.what();
    CHECK(what.find("MPI_Bcast failed") != std::string::npos);
    CHECK(what.find("host ") != std::string::npos);
    CHECK(e.line() > 0);
  }
}
