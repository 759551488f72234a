#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "mpi_test_world.hpp"
#include "typed_values.hpp"

using namespace shardplan::comm;
using shardplan::comm::testing::load;
using shardplan::comm::testing::pattern;
using shardplan::comm::testing::store;

// Rank r sends pattern(r, i) to rank r + 1 (a chain, the way pipeline stages pass activations)
// and each receiver checks every element against the sender's pattern: the values arrive, for
// every type and counts that are not powers of two.
TEST_CASE("mpi::send and recv carry every type along a chain of ranks") {
  auto& world = test_world();
  const int n = world.size(), r = world.rank();
  if (n < 2) return;  // nobody to talk to
  for (DataType type : {DataType::f32, DataType::f64, DataType::bf16, DataType::f16, DataType::i32,
                        DataType::i64, DataType::u8}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{1023}, std::size_t{4097}}) {
      CAPTURE(data_type_name(type));
      CAPTURE(count);
      std::vector<std::byte> out(count * element_bytes(type)), in(out.size());
      for (std::size_t i = 0; i < count; ++i) store(type, out.data(), i, pattern(r, i));
      if (r + 1 < n) world.send(out.data(), count, type, r + 1);
      if (r > 0) {
        world.recv(in.data(), count, type, r - 1);
        int wrong = 0;
        for (std::size_t i = 0; i < count; ++i)
          if (load(type, in.data(), i) != pattern(r - 1, i)) ++wrong;
        CHECK(wrong == 0);
      }
    }
  }
}

// Two messages from 0 to 1 arrive in the order they were sent, and a reply goes back: the
// exchange of a 1F1B step (activation forward, gradient back).
TEST_CASE("mpi::send and recv keep the order of messages and run both ways") {
  auto& world = test_world();
  if (world.size() < 2 || world.rank() > 1) return;
  std::vector<float> first = {1.5f, -2.0f}, second = {7.0f, 8.0f, 9.0f};
  if (world.rank() == 0) {
    world.send(first.data(), first.size(), DataType::f32, 1);
    world.send(second.data(), second.size(), DataType::f32, 1);
    std::vector<float> reply(2);
    world.recv(reply.data(), reply.size(), DataType::f32, 1);
    CHECK(reply == std::vector<float>{3.0f, 24.0f});
  } else {
    std::vector<float> a(2), b(3);
    world.recv(a.data(), a.size(), DataType::f32, 0);
    world.recv(b.data(), b.size(), DataType::f32, 0);
    CHECK(a == first);
    CHECK(b == second);
    std::vector<float> reply = {a[0] * 2, b[0] + b[1] + b[2]};  // 3, 24
    world.send(reply.data(), reply.size(), DataType::f32, 0);
  }
}

TEST_CASE("mpi::send and recv reject a peer outside the group or the rank itself") {
  auto& world = test_world();
  float x = 0;
  const int n = world.size();
  for (int peer : {-1, n, world.rank()}) {
    CAPTURE(peer);
    CHECK_THROWS_AS(world.send(&x, 1, DataType::f32, peer), CommError);
    CHECK_THROWS_AS(world.recv(&x, 1, DataType::f32, peer), CommError);
  }
  try {
    world.send(&x, 1, DataType::f32, n);
    FAIL("no error");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find(fmt::format("peer {} is not a rank of this group", n)) !=
          std::string::npos);
  }
}

// A group split off the world numbers its peers within the group: rank 0 of each half sends to
// rank 1 of the same half.
TEST_CASE("mpi::send and recv address peers by their rank in a split group") {
  auto& world = test_world();
  if (world.size() < 4) return;
  const int half = world.rank() / 2;
  auto group = world.split(half, world.rank());
  std::int32_t value = 100 + world.rank();
  if (group->rank() == 0)
    group->send(&value, 1, DataType::i32, 1);
  else {
    std::int32_t got = 0;
    group->recv(&got, 1, DataType::i32, 0);
    CHECK(got == 100 + world.rank() - 1);  // the world rank just below, in the same half
  }
}

// Neighbours on a ring exchange with send_recv in both directions at once (each rank calls it
// with both neighbours, in an order where plain blocking sends could wait on each other), and one
// side of a pair may answer a send_recv with a plain recv and send.
TEST_CASE("mpi::send_recv exchanges with a peer that sends at the same time") {
  auto& world = test_world();
  const int n = world.size(), r = world.rank();
  if (n < 2) return;
  const std::size_t count = 100000;  // 400 kB: past any eager limit, so a plain send would block
  std::vector<float> out(count, static_cast<float>(r)), in(count, -1.0f);
  if (n == 2) {
    world.send_recv(out.data(), count, in.data(), count, DataType::f32, 1 - r);
    CHECK(in.front() == static_cast<float>(1 - r));
    CHECK(in.back() == static_cast<float>(1 - r));
    // rank 0 uses send_recv, rank 1 answers with recv then send
    if (r == 0) {
      world.send_recv(out.data(), 3, in.data(), 5, DataType::f32, 1);
      CHECK(in[4] == 1.0f);
    } else {
      world.recv(in.data(), 3, DataType::f32, 0);
      CHECK(in[2] == 0.0f);
      world.send(out.data(), 5, DataType::f32, 0);
    }
    return;
  }
  // The ring: even ranks exchange with the right neighbour first, odd ranks with the left one.
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int peer : (r % 2 == 0 ? std::vector<int>{right, left} : std::vector<int>{left, right})) {
    if (n % 2 == 1) break;  // an odd ring cannot be paired this way; covered by 2 and 4 ranks
    world.send_recv(out.data(), count, in.data(), count, DataType::f32, peer);
    CHECK(in[count / 2] == static_cast<float>(peer));
  }
}

// Every rank sends to its right neighbour while it receives from its left one, all at once: the
// ring of an interleaved pipeline's forwards. Blocking sends past the eager limit would each wait
// for a receive that the next rank only posts after its own send; the two-peer send_recv posts
// both. Any number of ranks, odd rings included.
TEST_CASE("mpi::send_recv with two peers turns a ring at once") {
  auto& world = test_world();
  const int n = world.size(), r = world.rank();
  if (n < 2) return;
  const std::size_t count = 100000;  // 400 kB: past any eager limit
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<float> out(count, static_cast<float>(r)), in(count, -1.0f);
  world.send_recv(out.data(), count, right, in.data(), count, left, DataType::f32);
  CHECK(in.front() == static_cast<float>(left));
  CHECK(in.back() == static_cast<float>(left));
  // And back the other way, with counts that differ by direction.
  world.send_recv(out.data(), 7, left, in.data(), 7, right, DataType::f32);
  CHECK(in[6] == static_cast<float>(right));
  // A bad peer is the caller's error, named before anything is sent.
  CHECK_THROWS_AS(world.send_recv(out.data(), 1, n, in.data(), 1, left, DataType::f32), CommError);
}
