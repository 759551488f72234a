#include <doctest/doctest.h>

#include <string>

#include "executor/tracked_allocator.hpp"

using namespace shardplan::executor;
using namespace shardplan::kernels;
using MC = MemoryCategory;

TEST_CASE("executor::allocator category names are the cost model's breakdown") {
  std::string names;
  for (auto c : kMemoryCategories) names += std::string(category_name(c)) + " ";
  CHECK(names == "parameters gradients optimizer_states activations buffers overhead ");
}

TEST_CASE("executor::allocator records current and peak bytes and the breakdown at the peak") {
  TrackedAllocator a;
  auto params = a.allocate<float>(MC::parameters, 100);  // 400 B
  CHECK(params.bytes() == 400);
  CHECK(params[99] == 0.0f);  // zero-initialised
  {
    auto act1 = a.allocate<float>(MC::activations, 250);  // 1000 B
    auto act2 = a.allocate<double>(MC::activations, 50);  // 400 B
    CHECK(a.in_use_bytes() == 1800);
    CHECK(a.in_use_bytes(MC::activations) == 1400);
  }  // activations freed: total peak 1800 = 400 parameters + 1400 activations
  CHECK(a.in_use_bytes() == 400);
  CHECK(a.in_use_bytes(MC::activations) == 0);
  auto grads = a.allocate<float>(MC::gradients, 200);  // 800 B
  auto buffers = a.allocate<float>(MC::buffers, 100);  // 400 B: total 1600 < 1800
  CHECK(a.peak_bytes() == 1800);
  CHECK(a.peak_bytes(MC::activations) == 1400);
  CHECK(a.peak_bytes(MC::gradients) == 800);
  const auto at_peak = a.breakdown_at_peak();
  CHECK(at_peak[MC::parameters] == 400);
  CHECK(at_peak[MC::activations] == 1400);
  CHECK(at_peak[MC::gradients] == 0);
  CHECK(at_peak.total() == 1800);
  CHECK(a.allocation_count() == 5);

  // A new higher peak moves the breakdown.
  auto overhead = a.allocate<float>(MC::overhead, 100);  // total 2000
  CHECK(a.peak_bytes() == 2000);
  CHECK(a.breakdown_at_peak()[MC::gradients] == 800);
  CHECK(a.breakdown_at_peak()[MC::activations] == 0);

  // reset_peaks starts from what is in use now.
  overhead.reset();
  a.reset_peaks();
  CHECK(a.peak_bytes() == 1600);
  CHECK(a.peak_bytes(MC::overhead) == 0);
}

TEST_CASE("executor::allocator buffers move and free through the allocator") {
  TrackedAllocator a;
  auto x = a.allocate<float>(MC::activations, 10);
  x[3] = 2.5f;
  Buffer y = std::move(x);
  CHECK(x.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is what is checked
  CHECK(y[3] == 2.5f);
  CHECK(a.in_use_bytes() == 40);
  auto z = a.allocate<float>(MC::activations, 5);
  y = std::move(z);  // y's old 40 B are freed
  CHECK(a.in_use_bytes() == 20);
  CHECK(a.allocate<float>(MC::buffers, 0).empty());
  CHECK_THROWS_AS(a.allocate<float>(MC::buffers, -1), std::invalid_argument);
}

TEST_CASE("executor::allocator past its capacity throws OutOfMemory with one clear line") {
  TrackedAllocator a(1000);
  auto params = a.allocate<float>(MC::parameters, 200);  // 800 B of 1000
  try {
    auto act = a.allocate<float>(MC::activations, 100);  // 400 B more
    FAIL("no OutOfMemory");
  } catch (const OutOfMemory& e) {
    CHECK(e.category() == MC::activations);
    CHECK(e.requested_bytes() == 400);
    CHECK(e.in_use_bytes() == 800);
    CHECK(e.capacity_bytes() == 1000);
    CHECK(std::string(e.what()) ==
          "out of memory: allocating 0.00 GiB (400 bytes) of activations with 0.00 GiB "
          "(800 bytes) in use would exceed the capacity of 0.00 GiB (1000 bytes)");
  }
  // A refused allocation changes nothing; exactly reaching the capacity is allowed.
  CHECK(a.in_use_bytes() == 800);
  CHECK(a.peak_bytes() == 800);
  auto rest = a.allocate<float>(MC::activations, 50);
  CHECK(a.in_use_bytes() == 1000);

  TrackedAllocator gib(std::int64_t{2} << 30);
  auto small = gib.allocate<char>(MC::parameters, std::int64_t{1} << 20);  // 1 MiB
  CHECK_THROWS_WITH_AS(gib.allocate<float>(MC::gradients, std::int64_t{1} << 29),
                       "out of memory: allocating 2.00 GiB (2147483648 bytes) of gradients with "
                       "0.00 GiB (1048576 bytes) in use would exceed the capacity of 2.00 GiB "
                       "(2147483648 bytes)",
                       OutOfMemory);
}

TEST_CASE("executor::uninitialized allocations are counted and capped alike") {
  TrackedAllocator a(1000);
  {
    auto x = a.allocate_uninitialized<float>(MC::activations, 200);
    CHECK(x.size() == 200);
    CHECK(a.in_use_bytes(MC::activations) == 800);
    CHECK_THROWS_AS(a.allocate_uninitialized<float>(MC::buffers, 51), OutOfMemory);
    CHECK(a.allocate_uninitialized<float>(MC::buffers, 0).empty());
  }
  CHECK(a.in_use_bytes() == 0);
  CHECK(a.peak_bytes() == 800);
}
