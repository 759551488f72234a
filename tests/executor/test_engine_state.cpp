// The engine's shared state (executor/engine_state.hpp): what it checks, what it allocates before
// the first step, and the phases it names.
#include <doctest/doctest.h>

#include "engine_state_fixture.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

TEST_CASE("engine state::the phase names the step, the micro-batch and the unit") {
  CHECK(phase_text(2, 1, "forward", 3, 0) == "step 2 forward unit 3");
  CHECK(phase_text(2, 2, "forward", 3, 0) == "step 2 micro-batch 1 forward unit 3");
  CHECK(phase_text(2, 2, "backward", 0, 1) == "step 2 micro-batch 2 backward unit 0");
  CHECK(phase_text(1, 4, "optimizer", -1, -1) == "step 1 optimizer");
}

TEST_CASE("engine state::options no framework runs are refused") {
  StandInCommunicator world(0, 1);
  const EngineGroups groups{&world, &world, nullptr, true};
  auto options = test_options(tiny_llama(), test_spec("ddp", Flavour::ddp, 1));
  CHECK_NOTHROW(check_engine_options(options, groups));
  CHECK_THROWS_WITH(check_engine_options(options, {}), "the world group is missing");
  auto bad = options;
  bad.spec.shard_parameters = true;
  CHECK_THROWS_AS(check_engine_options(bad, groups), std::invalid_argument);
  bad = options;
  bad.spec.shard_gradients = true;
  CHECK_THROWS_AS(check_engine_options(bad, groups), std::invalid_argument);
  bad = options;
  bad.grad_accumulation = 0;
  CHECK_THROWS_WITH(check_engine_options(bad, groups), "0 micro-batches per step");
  bad = options;
  bad.micro_batch.seq = 0;
  CHECK_THROWS_WITH(check_engine_options(bad, groups), "the micro-batch is empty");
}

TEST_CASE("engine state::parameters and optimizer states exist before the first step") {
  // ZeRO-1 on rank 1 of 2: whole parameters, chunked moments, nothing else.
  StateFixture<> f(test_options(tiny_llama(), test_spec("zero1", Flavour::deepspeed, 2)), 1, 2);
  std::int64_t whole = 0, chunks = 0;
  for (std::int64_t u = 0; u < f.state.unit_count(); ++u) {
    whole += f.state.shards.whole_elements(u, f.state.spec());
    chunks += f.state.shape(u).chunk;
    CHECK(f.state.unit(u).exp_avg.size() == f.state.shape(u).chunk);
    CHECK(f.state.unit(u).host_master.empty());
  }
  CHECK(f.bytes(MemoryCategory::parameters) == whole * 4);
  CHECK(f.bytes(MemoryCategory::optimizer_states) == 2 * chunks * 4);
  CHECK(f.bytes(MemoryCategory::gradients) == 0);
  CHECK(f.bytes(MemoryCategory::buffers) == 0);
  CHECK(f.state.world_rank() == 1);
  CHECK(f.state.streams.replica == nullptr);
}

TEST_CASE("engine state::optimizer offload keeps the optimizer's states in the host pool") {
  auto spec = test_spec("zero2", Flavour::deepspeed, 1);
  spec.offload = documents::Offload::optimizer;
  StateFixture<> f(test_options(tiny_llama(), spec));
  CHECK(f.state.offload.optimizer);
  CHECK(&f.state.optimizer_allocator() == &f.state.host_pool);
  CHECK(f.bytes(MemoryCategory::optimizer_states) == 0);
  CHECK(f.state.host_pool.in_use_bytes(MemoryCategory::optimizer_states) > 0);
  for (std::int64_t u = 0; u < f.state.unit_count(); ++u)
    CHECK(f.state.unit(u).host_master.size() == f.state.shape(u).chunk);
}
