// The gather scheduler (executor/gather_scheduler.hpp): which units are gathered, kept and
// prefetched, and what their gathered buffers hold.
#include <doctest/doctest.h>

#include "engine_state_fixture.hpp"
#include "executor/gather_scheduler.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

TEST_CASE("gather scheduler::units kept through the backward are the cost model's") {
  auto spec = test_spec("fsdp-full", Flavour::fsdp2, 2);
  REQUIRE(spec.reshard_after_forward);
  spec.keep_root_unsharded = false;
  CHECK_FALSE(kept_through_backward(spec, 0, 4));
  CHECK_FALSE(kept_through_backward(spec, 2, 4));
  CHECK(kept_through_backward(spec, 3, 4));  // the head
  spec.keep_root_unsharded = true;
  CHECK(kept_through_backward(spec, 0, 4));
  spec.reshard_after_forward = false;
  CHECK(kept_through_backward(spec, 1, 4));
}

TEST_CASE("gather scheduler::prefetch depth follows the plan only when asked") {
  auto spec = test_spec("fsdp-full", Flavour::fsdp2, 2);
  spec.forward_prefetch = 1;
  spec.backward_prefetch = 2;
  spec.prefetch_bucket_elems = 0;
  CHECK(prefetch_depth(spec, false, 100).forward == 0);
  CHECK(prefetch_depth(spec, false, 100).backward == 0);
  CHECK(prefetch_depth(spec, true, 100).forward == 1);
  CHECK(prefetch_depth(spec, true, 100).backward == 2);
  spec.prefetch_bucket_elems = 350;  // DeepSpeed: blocks that fit, at least one
  CHECK(prefetch_depth(spec, true, 100).forward == 3);
  CHECK(prefetch_depth(spec, true, 1000).forward == 1);
  auto ddp = test_spec("ddp", Flavour::ddp, 2);
  CHECK(prefetch_depth(ddp, true, 100).forward == 0);
}

TEST_CASE("gather scheduler::a partitioned unit is gathered whole while it is in use") {
  StateFixture<> f(test_options(tiny_llama(), test_spec("fsdp-full", Flavour::fsdp2, 2)), 1, 2);
  GatherScheduler<float> gathers(f.state);
  const auto& block = f.state.shape(1);
  REQUIRE(block.params_sharded);
  CHECK(gathers.needs_gather(1));
  CHECK_FALSE(gathers.needs_copy(1));
  gathers.acquire(1);
  gathers.wait_for_gathers(1);
  CHECK(f.bytes(MemoryCategory::buffers) == block.padded * 4);
  CHECK(static_cast<std::int64_t>(gathers.params_for(1).size()) == block.padded);
  gathers.acquire(1);  // already gathered: nothing more
  CHECK(f.bytes(MemoryCategory::buffers) == block.padded * 4);
  gathers.release(1);
  CHECK(f.bytes(MemoryCategory::buffers) == 0);
}

TEST_CASE("gather scheduler::a tied head gathers the embedding again") {
  auto spec = test_spec("zero3", Flavour::deepspeed, 2);
  spec.persistence_threshold = 0;  // every unit partitioned, however small
  StateFixture<> f(test_options(tiny_gpt2(), spec), 0, 2);
  GatherScheduler<float> gathers(f.state);
  const std::int64_t head = f.state.unit_count() - 1;
  REQUIRE(f.state.tied());
  REQUIRE(f.state.shape(0).params_sharded);
  CHECK(gathers.needs_gather(head));
  CHECK(gathers.embedding_for_head().empty());
  gathers.acquire(head);
  const std::int64_t padded = f.state.shape(head).padded + f.state.shape(0).padded;
  CHECK(f.bytes(MemoryCategory::buffers) == padded * 4);
  CHECK(static_cast<std::int64_t>(gathers.embedding_for_head().size()) == f.state.shape(0).padded);
  gathers.release(head);
  CHECK(f.bytes(MemoryCategory::buffers) == 0);
}

TEST_CASE("gather scheduler::prefetch gathers the next units the limiter allows") {
  auto options = test_options(tiny_llama(), test_spec("fsdp-full", Flavour::fsdp2, 2));
  options.prefetch_as_planned = true;
  options.spec.forward_prefetch = 2;
  options.spec.max_inflight_allgathers = 2;
  options.spec.keep_root_unsharded = false;
  REQUIRE(options.spec.reshard_after_forward);
  StateFixture<> f(options, 0, 2);
  GatherScheduler<float> gathers(f.state);
  REQUIRE(gathers.depth().forward == 2);
  auto padded = [&](std::int64_t u) { return f.state.shape(u).padded * 4; };
  gathers.acquire(0);
  gathers.prefetch_forward(0);  // unit 1; unit 2 would make three in flight while unit 0 lives
  CHECK(f.bytes(MemoryCategory::buffers) == padded(0) + padded(1));
  gathers.prefetch_forward(1);  // still unit 0 alive: nothing
  CHECK(f.bytes(MemoryCategory::buffers) == padded(0) + padded(1));
  gathers.release(0);
  gathers.prefetch_forward(1);  // unit 2 now; unit 3 would wait for unit 1
  CHECK(f.bytes(MemoryCategory::buffers) == padded(1) + padded(2));
  for (std::int64_t u = 0; u < f.state.unit_count(); ++u) gathers.release(u);
  CHECK(f.bytes(MemoryCategory::buffers) == 0);
}

TEST_CASE("gather scheduler::DDP under autocast computes from 16-bit copies") {
  auto spec = test_spec("ddp", Flavour::ddp, 1);
  spec.reduce_dtype = documents::DType::fp32;
  auto options = test_options(tiny_gpt2(), spec);
  options.precision = documents::Precision::bf16_mixed;
  StateFixture<bf16> f(options);
  GatherScheduler<bf16> gathers(f.state);
  const std::int64_t head = f.state.unit_count() - 1;
  CHECK(gathers.needs_copy(0));
  gathers.acquire(0, true);  // the embedding's backward reads no parameters
  CHECK(f.bytes(MemoryCategory::buffers) == 0);
  gathers.acquire(head);
  const std::int64_t whole = f.state.shards.whole_elements(head, f.state.spec()) +
                             f.state.shards.whole_elements(0, f.state.spec());
  CHECK(f.bytes(MemoryCategory::buffers) == whole * 2);
  gathers.release(head);
  CHECK(f.bytes(MemoryCategory::buffers) == 0);
}
