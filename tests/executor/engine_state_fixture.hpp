// An engine's state (executor/engine_state.hpp) on rank `rank` of `ranks` stand-in ranks in one
// group, for the tests of the engine's parts: each part is built over it and driven directly.
#pragma once

#include <utility>

#include "engine_fixture.hpp"
#include "executor/engine_state.hpp"

namespace shardplan::executor::testing {

template <class S = float> struct StateFixture {
  StateFixture(EngineOptions options, int rank = 0, int ranks = 1)
      : world(rank, ranks), shard(rank, ranks),
        state(std::move(options), allocator, {&world, &shard, nullptr, true}) {}

  StandInCommunicator world, shard;
  TrackedAllocator allocator;
  EngineState<S> state;

  std::int64_t bytes(MemoryCategory category) const { return allocator.in_use_bytes(category); }
};

}  // namespace shardplan::executor::testing
