// Gradient buffers and buckets (executor/grad_buffer.hpp): what each spec keeps for a unit's
// gradient, the buckets, and what a reduction leaves.
#include <doctest/doctest.h>

#include <algorithm>

#include "engine_state_fixture.hpp"
#include "executor/grad_buffer.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

TEST_CASE("grad buffers::DDP's all-reduce buckets count reduce_bucket_bytes in the reduce dtype") {
  auto spec = test_spec("ddp", Flavour::ddp, 2);
  spec.reduce_dtype = documents::DType::fp32;
  spec.reduce_bucket_bytes = 4096;
  CHECK(all_reduce_bucket_elements(spec, 10000) == 1024);
  spec.reduce_dtype = documents::DType::bf16;
  CHECK(all_reduce_bucket_elements(spec, 10000) == 2048);
  spec.reduce_bucket_bytes = 1;
  CHECK(all_reduce_bucket_elements(spec, 10000) == 1);
  spec.reduce_bucket_bytes = 0;
  CHECK(all_reduce_bucket_elements(spec, 10000) == 10000);
}

TEST_CASE("grad buffers::DDP's bucket copy holds every unit's whole gradient") {
  StateFixture<> f(test_options(tiny_llama(), test_spec("ddp", Flavour::ddp, 1)));
  REQUIRE(f.state.spec().grad_bucket_copy);
  const auto offsets = bucket_copy_offsets(f.state.shards, f.state.spec());
  REQUIRE(static_cast<std::int64_t>(offsets.size()) == f.state.unit_count() + 1);
  CHECK(offsets.front() == 0);
  for (std::int64_t u = 0; u < f.state.unit_count(); ++u)
    CHECK(offsets[static_cast<std::size_t>(u) + 1] - offsets[static_cast<std::size_t>(u)] ==
          f.state.shards.whole_elements(u, f.state.spec()));
  GradBuffers<float> grads(f.state);
  CHECK(f.bytes(MemoryCategory::buffers) == offsets.back() * 4);
}

TEST_CASE("grad buffers::whole gradients live from their first use to the step's end") {
  auto spec = test_spec("ddp", Flavour::ddp, 1);
  spec.grad_bucket_copy = false;
  StateFixture<> f(test_options(tiny_llama(), spec));
  GradBuffers<float> grads(f.state);
  const std::int64_t whole = f.state.shards.whole_elements(1, spec);
  grads.ensure_target(1);
  CHECK(f.bytes(MemoryCategory::gradients) == whole * 4);
  CHECK(static_cast<std::int64_t>(grads.target(1).size()) == whole);
  std::fill(grads.target(1).begin(), grads.target(1).end(), 2.0f);
  grads.ensure_target(1);  // kept: the next micro-batch adds into it
  CHECK(grads.target(1)[0] == 2.0f);
  grads.reduce_unit(1);  // one rank: the all-reduce leaves the sum as it is
  grads.wait_for_reductions();
  CHECK(grads.target(1)[0] == 2.0f);
  CHECK(f.bytes(MemoryCategory::gradients) == whole * 4);
  grads.release_step_gradients();
  CHECK(f.bytes(MemoryCategory::gradients) == 0);
}

TEST_CASE("grad buffers::a sharded gradient is reduce-scattered into a kept chunk") {
  StateFixture<> f(test_options(tiny_llama(), test_spec("fsdp-grad-op", Flavour::fsdp2, 2)), 1, 2);
  REQUIRE(f.state.spec().shard_gradients);
  GradBuffers<float> grads(f.state);
  const auto& shape = f.state.shape(2);
  grads.ensure_target(2);
  CHECK(f.bytes(MemoryCategory::gradients) == shape.padded * 4);
  auto target = grads.target(2);
  REQUIRE(static_cast<std::int64_t>(target.size()) == shape.padded);
  for (std::size_t i = 0; i < target.size(); ++i) target[i] = static_cast<float>(i);
  grads.reduce_unit(2);
  grads.wait_for_reductions();
  // The micro-batch's gradient is gone; this rank's chunk is kept (a stand-in reduce-scatter
  // copies this rank's block).
  const auto& chunk = f.state.unit(2).grad_chunk;
  CHECK(f.bytes(MemoryCategory::gradients) == shape.chunk * 4);
  REQUIRE(chunk.size() == shape.chunk);
  CHECK(chunk.data()[0] == static_cast<float>(f.state.shards.chunk_begin(2)));
  // The next micro-batch's reduction adds into it.
  grads.ensure_target(2);
  target = grads.target(2);
  for (std::size_t i = 0; i < target.size(); ++i) target[i] = static_cast<float>(i);
  grads.reduce_unit(2);
  grads.wait_for_reductions();
  CHECK(chunk.data()[0] == 2.0f * static_cast<float>(f.state.shards.chunk_begin(2)));
  grads.release_step_gradients();
  CHECK(f.bytes(MemoryCategory::gradients) == 0);
}

TEST_CASE("grad buffers::DeepSpeed's contiguous buckets are allocated with the engine") {
  auto spec = test_spec("zero2", Flavour::deepspeed, 1, 8192);
  REQUIRE(spec.contiguous_grad_bucket);
  StateFixture<> f(test_options(tiny_llama(), spec));
  GradBuffers<float> grads(f.state);
  const int buckets = spec.flat_grad_partition ? 2 : 1;
  CHECK(f.bytes(MemoryCategory::buffers) == buckets * 8192);
}
